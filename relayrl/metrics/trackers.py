"""Trackers: metrics.jsonl (always), a rich progress bar, and optionally TensorBoard."""

from __future__ import annotations

import json
import math
from pathlib import Path


class JsonlTracker:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                                for k, v in metrics.items()}}
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

            self.progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TextColumn("{task.fields[info]}"))
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

    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def build_trackers(config, run_dir: Path) -> Trackers:
    """jsonl always (the report and resume read it), the progress bar if asked, plus `log.backends`."""
    log = config.log
    trackers = [JsonlTracker(run_dir), ConsoleTracker(config.train.steps, log.progress)]
    if "tensorboard" in log.backends:
        trackers.append(TensorBoardTracker(run_dir))
    return Trackers(trackers)
