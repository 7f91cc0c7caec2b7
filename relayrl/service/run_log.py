"""The service's run directory (`log.dir` when its config sets it), in the files `relayrl report` reads, so a user
watches a service as they watch a training run: one `metrics.jsonl` row per request that did model work, one
`timeline.jsonl` row for when it ran, and `config.yaml` (the config as loaded).

A row's `step` counts the requests the service ran. Its figures are named by route, so two routes never mix in
one plot: `forward_backward/{tokens,loss_sum,time}` (`forward/...` for a forward-only call), `optim_step/{grad_norm,time}`,
`sample/{prompt_tokens,tokens,time}` (`compute_logprobs` too), and `time/step`, the request's own time, again
as the training phase it stands for (`time/generate` for a sample, `time/logprobs` for a forward, `time/update`
for a forward_backward or an optim_step), which the report's phase plot draws. A `sample` whose engine call also
served the requests queued behind it (relayrl/service/sampling.py's SampleQueue) holds their time; theirs is ~0. A `forward_backward` whose data
carry the sampler's `logprobs` (importance_sampling, ppo, cispo, ...) adds relayrl's train-inference mismatch
(relayrl/service/mismatch.py: `mismatch/logprob_abs_{mean,max}`, each datum against the trainer's log-probs at the
settings its sample was drawn at), which the report plots. A timeline row's role is the model (or sampler) id, its phase the route.

The rows go through relayrl's trackers (relayrl/metrics/trackers.py): metrics.jsonl always, and `log.backends`
(TensorBoard, MLflow, W&B offline) under the run directory as for a training run.
Leaves out: samples.jsonl (the SDK sends no rewards), eval.json, the progress bar.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from relayrl.service.mismatch import mismatch_figures

# the training loop's phase each route's time adds to (`time/<phase>`), so the report's phase plot reads a service
PHASE_OF_ROUTE = {"sample": "generate", "forward": "logprobs", "forward_backward": "update", "optim_step": "update"}


class RunLog:
    def __init__(self, run_dir: Path | None, config_yaml: str = "", backends: tuple[str, ...] = (), params=None):
        """`backends`: `log.backends` (tensorboard, mlflow, wandb), given `params`, the config as a dict."""
        from relayrl.metrics.timeline import Timeline
        from relayrl.metrics.trackers import BACKENDS, JsonlTracker, Trackers

        self.run_dir = run_dir
        self.steps = 0
        self.lock = threading.Lock()
        self.trackers = self.timeline = None
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text(config_yaml)
            backend_trackers = [BACKENDS[name](run_dir, params or {}) for name in backends]
            self.trackers = Trackers([JsonlTracker(run_dir), *backend_trackers])
            self.timeline = Timeline(run_dir / "timeline.jsonl")

    @contextmanager
    def request(self, route: str, owner: str):
        """Time the request's work; the caller fills the yielded dict with its figures (route-relative names)."""
        figures: dict[str, float] = {}
        start = time.time()
        yield figures
        end = time.time()
        self.record(route, owner, start, end, figures)

    def record(self, route: str, owner: str, start: float, end: float, figures: dict[str, float]) -> None:
        if self.trackers is None or self.timeline is None:
            return
        seconds = end - start
        row = {"time/step": seconds, f"time/{PHASE_OF_ROUTE[route]}": seconds, f"{route}/time": seconds}
        row |= {key if "/" in key else f"{route}/{key}": value for key, value in figures.items()}
        with self.lock:
            self.steps += 1
            self.trackers.log(self.steps, row)
            self.timeline.add(self.steps, owner, route, start, end)
            self.timeline.flush()

    def close(self) -> None:
        if self.trackers is not None:
            self.trackers.close()


def forward_backward_figures(call, outputs: list[dict[str, np.ndarray]], metrics: dict[str, float], samples) -> dict:
    """tokens, loss_sum and, when the data carry the sampler's log-probs, the mismatch against the trainer's
    (`samples`: the service's `mismatch.Samples`, the settings each datum was sampled at)."""
    figures = {"tokens": float(sum(len(ex.tokens) for ex in call.examples)), "loss_sum": metrics["loss:sum"]}
    return figures | mismatch_figures(call.model_id, call.examples, outputs, samples)


def timed(run_log: RunLog, route: str, owner: str, work: Callable[[dict], object]) -> Callable[[], object]:
    """`work(figures)` as a queued request whose time and figures `run_log` records."""

    def run():
        with run_log.request(route, owner) as figures:
            return work(figures)

    return run
