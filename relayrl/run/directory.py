"""The run directory (`log.dir`): whether it holds a run, and the one place that claims it for a new run.

A directory holds a run once a run has logged or saved anything there (a non-empty `metrics.jsonl`,
`timeline.jsonl`, `samples.jsonl`, `eval.json`, `checkpoints/` or `model/`); a `config.yaml` alone is a run
that never took a step. `claim` is
called after every input (model, data, reward) has been validated, and is the first write: a new run
takes an empty directory, `--resume` continues the run there (its logs cut back to the checkpoint's
step) and `--overwrite` replaces it. Anything else stops with a message naming both flags, so a
mistyped command never damages a finished run. Other files (the demo's `data/` and `warmstart/`) are
left alone. Left out: locking against two live runs in one directory.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from relayrl.errors import ConfigError
from relayrl.run.jsonl import truncate_after

RUN_MARKERS = ("metrics.jsonl", "timeline.jsonl", "samples.jsonl", "eval.json", "checkpoints", "model")
# what a run writes; --overwrite removes exactly these
RUN_OUTPUTS = RUN_MARKERS + ("config.yaml", "critic", "report", "tensorboard", "mlflow", "wandb")


def run_markers(run_dir: str | Path) -> list[str]:
    """The files that show `run_dir` holds a run (empty if it holds none): an empty one shows nothing."""

    def written(path: Path) -> bool:
        return any(path.iterdir()) if path.is_dir() else path.is_file() and path.stat().st_size > 0

    return [name for name in RUN_MARKERS if written(Path(run_dir) / name)]


def claim(
    run_dir: str | Path, config_text: str, resume_step: int | None = None, overwrite: bool = False, log=print
) -> Path:
    """Make `run_dir` this run's and write its resolved config; `resume_step`: continue the run there."""
    run_dir = Path(run_dir)
    found = run_markers(run_dir)
    if resume_step is None and found and not overwrite:
        raise ConfigError(
            f"log.dir={run_dir} already holds a run ({', '.join(found)}): pass --resume {run_dir} "
            "to continue it, or --overwrite to replace it (or choose another log.dir)"
        )
    if resume_step is None and found:
        log(f"{run_dir}: replacing the run there (--overwrite)")
        for name in RUN_OUTPUTS:
            path = run_dir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    if resume_step is not None:  # rows logged after the checkpoint are redone by the resumed run
        for name in ("metrics.jsonl", "timeline.jsonl", "samples.jsonl"):
            truncate_after(run_dir / name, resume_step)
    (run_dir / "config.yaml").write_text(config_text)
    return run_dir
