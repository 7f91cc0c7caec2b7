"""The reward as a served component: `score(rollouts) -> (scores, metrics)` over one or more reward functions.

`build_reward_service(config.reward)` picks the backend once:
- `workers: 0`: in the calling process (the default; no timeouts, a hanging reward hangs the caller).
  Concurrent callers take turns: a reward function need not be thread-safe (a judge engine is not).
- `workers: N`: N worker processes (pool.py; Ray actors under placement.mode=ray, ray_pool.py), batches
  of `batch_size`, a deadline of `timeout_s` per sample. A batch that times out or kills its worker is
  retried one sample at a time, so only the guilty sample pays; that sample is then handled per `on_error`.
  Concurrent callers (the async schedule's producer threads) share the workers through one dispatcher
  thread (dispatch.py) that routes each outcome to its own call.

`on_error` covers a reward that raises, returns a non-number, times out or kills its worker: `error`
raises a RewardError naming the sample, `zero` scores it 0, `skip` returns None in its place (the caller
drops it). Metrics: reward/errors, reward/timeouts, reward/skipped (samples returned as None),
reward/<name> (mean of each component over the samples it scored) and the means of the named parts a function
returns (`{"correct": ..., "format": ...}`) over the samples that have them, named as the combined Score names
them (what samples.jsonl shows): reward/<name>.<part>, or reward/<part> for a single component of weight 1
(reward/<name>.<part> there too for a part named like a metric of the step's own: mean, std, errors, ...). Failures are not left to hide as
zeros: a function failing on more than half of a scored batch is warned about (once), and on
`max_error_frac` of it or more the call raises a RewardError naming the function and the count.

Several components combine as reward = sum of weight * component; the Score's parts are the components
(and a component's own named parts as `<name>.<part>`). A single component of weight 1 keeps its Score as is.
Overlapping scoring with generation is the schedule's job (the async schedule scores each chunk as it lands).
"""

from __future__ import annotations

import threading
import warnings
from typing import TYPE_CHECKING, Protocol, Self

from relayrl.config import RewardComponentConfig, RewardConfig
from relayrl.errors import RelayWarning, RewardError
from relayrl.rewards.base import load_reward, score_rollouts
from relayrl.rewards.dispatch import Dispatcher
from relayrl.rewards.pool import TIMEOUT, Task, WorkerPool
from relayrl.types import Rollout, Score

if TYPE_CHECKING:
    from relayrl.rewards.ray_pool import RayWorkerPool

WARN_ERROR_FRAC = 0.5  # a function failing on more of a batch than this is warned about, once per service


class RewardService(Protocol):
    def score(self, rollouts: list[Rollout]) -> tuple[list[Score | None], dict[str, float]]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...  # `with build_reward_service(...) as service:` closes it

    def __exit__(self, *exc: object) -> None: ...


def build_reward_service(config: RewardConfig, on_ray: bool = False) -> RewardService:
    """In-process, worker processes, or (`on_ray`, under placement.mode=ray) Ray actors as workers."""
    if config.workers == 0:
        return InProcessRewards(config)
    if on_ray:
        from relayrl.rewards.ray_pool import RayWorkerPool

        return WorkerRewards(config, RayWorkerPool)
    return WorkerRewards(config)


class InProcessRewards:
    def __init__(self, config: RewardConfig):
        self.components = config.resolved_components()
        self.fns = [load_reward(c.fn, c.kwargs, c.style) for c in self.components]
        self.on_error = config.on_error
        self.max_error_frac = config.max_error_frac
        self.warned = False
        self.turn = threading.Lock()  # one call at a time in the functions

    def score(self, rollouts: list[Rollout]) -> tuple[list[Score | None], dict[str, float]]:
        per_component, errors = [], []
        with self.turn:
            for fn in self.fns:
                scores, failures = score_rollouts(fn, rollouts, self.on_error)
                per_component.append(scores)
                errors.append(failures)
        return self._finish(per_component, errors, [[] for _ in self.fns])

    def _finish(
        self, per_component: list[list[Score | None]], errors: list[list[str]], timeouts: list[list[str]]
    ) -> tuple[list[Score | None], dict[str, float]]:
        """Check each component's failures against the limits, then combine (errors/timeouts per component, one
        line each saying which sample and what happened)."""
        for component, failed_errors, failed_timeouts, scores in zip(self.components, errors, timeouts, per_component):
            self._check_failures(component, failed_errors, failed_timeouts, len(scores))
        return combine(self.components, per_component, errors=sum(map(len, errors)), timeouts=sum(map(len, timeouts)))

    def _check_failures(
        self, component: RewardComponentConfig, errors: list[str], timeouts: list[str], samples: int
    ) -> None:
        failed = len(errors) + len(timeouts)
        if not failed:
            return
        what = (
            f"reward '{component.label}' ({component.fn}) failed on {failed} of {samples} samples of a "
            f"scored batch ({len(errors)} errors, {len(timeouts)} timeouts; first: {(errors + timeouts)[0]})"
        )
        if failed >= self.max_error_frac * samples:
            raise RewardError(
                f"{what}: at least reward.max_error_frac={self.max_error_frac:g} of the batch, so "
                "the run stops rather than train on failures. Fix the function (call it on a few "
                "samples by hand), or raise reward.max_error_frac"
            )
        if failed > WARN_ERROR_FRAC * samples and not self.warned:
            self.warned = True
            handled = "scored 0" if self.on_error == "zero" else "dropped"
            warnings.warn(
                f"{what}; they are {handled} (reward.on_error={self.on_error}). Warned once; the run "
                f"stops at reward.max_error_frac={self.max_error_frac:g} of a batch",
                RelayWarning,
                stacklevel=3,
            )

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()


class WorkerRewards(InProcessRewards):
    def __init__(self, config: RewardConfig, pool_class: type[WorkerPool] | type[RayWorkerPool] = WorkerPool):
        self.components = config.resolved_components()
        self.on_error = config.on_error
        self.max_error_frac = config.max_error_frac
        self.warned = False
        self.batch_size = config.batch_size
        pool = pool_class(
            config.workers, [(c.fn, c.kwargs, c.style) for c in self.components], config.on_error, config.timeout_s
        )
        self.dispatcher = Dispatcher(pool)  # safe for concurrent `score` calls

    def score(self, rollouts: list[Rollout]) -> tuple[list[Score | None], dict[str, float]]:
        per_component: list[list[Score | None]] = [[None] * len(rollouts) for _ in self.components]
        errors: list[list[str]] = [[] for _ in self.components]
        timeouts: list[list[str]] = [[] for _ in self.components]
        with self.dispatcher.call() as call:  # leaving early (an error) cancels the call's remaining tasks
            call.submit(
                [
                    Task(c, start, rollouts[start : start + self.batch_size])
                    for c in range(len(self.components))
                    for start in range(0, len(rollouts), self.batch_size)
                ]
            )
            for task, outcome in call.outcomes():
                if outcome.status == "ok":
                    assert outcome.scores is not None  # an ok outcome carries its scores
                    per_component[task.component][task.offset : task.offset + len(task.rollouts)] = outcome.scores
                    errors[task.component] += outcome.failures
                elif outcome.status == "reward_error":
                    raise RewardError(outcome.message)
                elif len(task.rollouts) > 1:  # TIMEOUT or DIED: find the guilty sample, one at a time
                    call.submit([Task(task.component, task.offset + i, [r]) for i, r in enumerate(task.rollouts)])
                else:
                    failure = f"sample {task.rollouts[0].sample_id}: {outcome.message}"
                    (timeouts if outcome.status == TIMEOUT else errors)[task.component].append(failure)
                    per_component[task.component][task.offset] = self._failed(task, failure)
        return self._finish(per_component, errors, timeouts)

    def _failed(self, task: Task, failure: str) -> Score | None:
        if self.on_error == "error":
            raise RewardError(
                f"reward '{self.components[task.component].label}' on {failure} (set reward.on_error=zero or "
                "skip to score such samples 0 or drop them)"
            )
        return Score(0.0, error=failure) if self.on_error == "zero" else None

    def close(self) -> None:
        """Stop the workers (SIGKILL for any still busy); the service cannot score afterwards."""
        self.dispatcher.close()


def combine(
    components: list[RewardComponentConfig], per_component: list[list[Score | None]], errors: int, timeouts: int
) -> tuple[list[Score | None], dict[str, float]]:
    """One Score per sample (None if any component skipped it) and the service's metrics."""
    combined = []
    for parts in zip(*per_component):
        if any(part is None for part in parts):
            combined.append(None)
        elif len(components) == 1 and components[0].weight == 1.0:
            combined.append(parts[0])
        else:
            named = {c.label: p.reward for c, p in zip(components, parts)}
            named.update({f"{c.label}.{k}": v for c, p in zip(components, parts) for k, v in p.components.items()})
            error = next((f"{c.label}: {p.error}" for c, p in zip(components, parts) if p.error), None)
            combined.append(Score(sum(c.weight * p.reward for c, p in zip(components, parts)), named, error))
    metrics = {
        "reward/errors": float(errors),
        "reward/timeouts": float(timeouts),
        "reward/skipped": float(sum(score is None for score in combined)),
    }
    for component, scores in zip(components, per_component):
        values = [s.reward for s in scores if s is not None]
        if values:
            metrics[f"reward/{component.label}"] = sum(values) / len(values)
        metrics.update(part_means(component, scores, alone=len(components) == 1 and component.weight == 1.0))
    return combined, metrics


RESERVED = frozenset({"mean", "std", "degenerate_group_frac", "errors", "timeouts", "skipped", "skipped_groups"})


def part_means(component: RewardComponentConfig, scores: list[Score | None], alone: bool) -> dict[str, float]:
    """reward/<part> (a component `alone`, whose Score is kept as is) or reward/<name>.<part>: each named part's
    mean over the samples whose Score has it."""
    values: dict[str, list[float]] = {}
    for score in scores:
        for part, value in (score.components if score is not None else {}).items():
            values.setdefault(part, []).append(value)
    return {
        f"reward/{part if alone and part not in RESERVED else f'{component.label}.{part}'}": sum(v) / len(v)
        for part, v in values.items()
    }


def add_counts(total: dict[str, float], part: dict[str, float]) -> dict[str, float]:
    """Per-round reward metrics summed over DAPO rounds (counts add up; component means are the last round's)."""
    out = dict(total)
    for key, value in part.items():
        counted = key in ("reward/errors", "reward/timeouts", "reward/skipped", "reward/skipped_groups")
        out[key] = out.get(key, 0.0) + value if counted else value
    return out
