"""Trackers: metrics.jsonl (always), a rich progress bar, and optionally TensorBoard, MLflow and W&B.

Each optional backend writes only to the run directory (nothing leaves the machine) and imports its package
when built; `LogConfig` refuses a backend whose package is missing before the run starts. Left out: system
metrics, artifacts (the model stays in <run>/model), online W&B.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relayrl.config import LogConfig


class JsonlTracker:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {
            "step": step,
            **{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()},
        }
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class ConsoleTracker:
    """A progress bar with the few numbers a person watches: reward, accuracy, step time."""

    def __init__(self, total_steps: int, enabled: bool = True):
        self.progress = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[info]}"),
            )
            self.task = self.progress.add_task("train", total=total_steps, info="")
            self.progress.start()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.progress is None:
            return
        info = f"reward {metrics.get('reward/mean', float('nan')):.3f}  step {metrics.get('time/step', 0):.2f}s"
        if "eval/greedy" in metrics:
            info += f"  eval {metrics['eval/greedy']:.3f}"
        self.progress.update(self.task, completed=step + 1, info=info)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


class Trackers:
    def __init__(self, trackers: list):
        self.trackers = trackers

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for tracker in self.trackers:
            tracker.log(step, metrics)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()


class TensorBoardTracker:
    """Scalars to `<run>/tensorboard` (read them with TensorBoard or `tensorboard.backend.event_processing`)."""

    def __init__(self, run_dir: Path, params: dict | None = None):  # params: unused, the backends share one signature
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MlflowTracker:
    """Metrics and the resolved config into a local MLflow store: sqlite `<run>/mlflow/mlflow.db`.

    MLflow 3 refuses its file store (`file:` URIs, maintenance mode) unless MLFLOW_ALLOW_FILE_STORE is set, so
    the store is sqlite. Browse with `mlflow ui --backend-store-uri sqlite:///<run>/mlflow/mlflow.db`. A resumed
    run keeps logging into the same MLflow run (its id is kept in `<run>/mlflow/run_id`).
    """

    def __init__(self, run_dir: Path, params: dict):
        from mlflow.tracking import MlflowClient

        root = Path(run_dir).resolve() / "mlflow"
        root.mkdir(parents=True, exist_ok=True)
        self.tracking_uri = f"sqlite:///{root / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        run_id_file = root / "run_id"
        if run_id_file.is_file():
            self.run_id = run_id_file.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            self.run_id = self._create_run(root, Path(run_dir).name, params)
            run_id_file.write_text(self.run_id)

    def _create_run(self, root: Path, name: str, params: dict) -> str:
        from mlflow.entities import Param

        experiment = self.client.get_experiment_by_name("relayrl")
        experiment_id = (
            experiment.experiment_id
            if experiment
            else self.client.create_experiment("relayrl", artifact_location=(root / "artifacts").as_uri())
        )
        run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
        logged = [Param(key, str(value)) for key, value in _flatten(params).items()]
        self.client.log_batch(run_id, params=logged)
        return run_id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        rows = [
            Metric(name, float(value), now_ms, step)
            for name, value in metrics.items()
            if isinstance(value, (int, float)) and math.isfinite(value)
        ]
        self.client.log_batch(self.run_id, metrics=rows)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class WandbTracker:
    """An offline W&B run under `<run>/wandb/offline-run-*/`; upload it later with `wandb sync <that dir>`.

    The resolved config is the run's config. Console capture is off: the rich progress bar's redraws would
    fill W&B's output log. A resumed run reuses the W&B run id kept in `<run>/wandb/run_id`.
    """

    def __init__(self, run_dir: Path, params: dict):
        import wandb

        root = Path(run_dir).resolve() / "wandb"
        root.mkdir(parents=True, exist_ok=True)
        run_id_file = root / "run_id"
        run_id = run_id_file.read_text().strip() if run_id_file.is_file() else None  # None: W&B picks one
        self.run = wandb.init(
            mode="offline",
            dir=str(root.parent),
            project="relayrl",
            name=Path(run_dir).name,
            id=run_id,
            resume="allow",
            config=params,
            settings=wandb.Settings(silent=True, console="off"),
        )
        run_id_file.write_text(self.run.id)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(
            {
                name: value
                for name, value in metrics.items()
                if isinstance(value, (int, float)) and math.isfinite(value)
            },
            step=step,
        )

    def close(self) -> None:
        self.run.finish()


def _flatten(tree: dict, prefix: str = "") -> dict:
    """{"rollout": {"n": 8}} -> {"rollout.n": 8}: the dotted keys the config overrides use."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


BACKENDS = {"tensorboard": TensorBoardTracker, "mlflow": MlflowTracker, "wandb": WandbTracker}


def build_trackers(log: LogConfig, steps: int, params: dict, run_dir: Path) -> Trackers:
    """jsonl always (the report and resume read it), `log.backends`, and the progress bar over `steps` if asked
    (last, so the backends' start-up lines print before it). `params`: the run's config as dumped, which the
    backends record beside the metrics."""
    backends = [BACKENDS[name](run_dir, params) for name in log.backends]
    return Trackers([JsonlTracker(run_dir), *backends, ConsoleTracker(steps, log.progress)])
