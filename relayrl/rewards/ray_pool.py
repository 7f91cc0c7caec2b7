"""Reward workers as Ray actors (`placement.mode=ray`): the same contract as `pool.WorkerPool`.

`step(pending)` hands tasks to idle actors with a deadline of `timeout_s` per sample, waits once and
returns the `(task, outcome)` pairs that finished; an actor past its deadline is killed (`ray.kill`: a hung call dies with
its process) and replaced, its task coming back as `TIMEOUT`; an actor that dies comes back as `DIED`.
Actors reserve no CPU (`num_cpus=0`): scoring shares the cores with whichever role is idle, as the
process pool does. Reward functions travel by spec string, as in the process pool. One thread drives the
pool (the service's dispatcher); `ray.wait` cannot be interrupted, so a step waits at most WAKE_S and
`wake` has nothing to do.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from relayrl.errors import RewardError
from relayrl.rewards.pool import DIED, STARTUP_TIMEOUT_S, TIMEOUT, Outcome, Task

if TYPE_CHECKING:
    from ray import ObjectRef

WAKE_S = 0.05  # the longest a task submitted while the dispatcher waits can sit beside an idle actor


class RewardActor:
    def __init__(self, components: list[tuple[str, dict, str]], on_error: str):
        from relayrl.rewards.base import load_reward

        self.fns = [load_reward(*component) for component in components]  # (spec, kwargs, style)
        self.on_error = on_error

    def ready(self) -> bool:
        return True

    def score(self, component: int, rollouts) -> tuple[str, object]:
        from relayrl.rewards.base import score_rollouts

        try:
            return "ok", score_rollouts(self.fns[component], rollouts, self.on_error)
        except RewardError as err:
            return "reward_error", str(err)


class RayWorkerPool:
    def __init__(self, workers: int, components: list[tuple[str, dict, str]], on_error: str, timeout_s: float):
        import ray

        self._actor_class = ray.remote(num_cpus=0, max_restarts=0)(RewardActor)
        self._args = (components, on_error)
        self.timeout_s = timeout_s
        self.actors = [self._start() for _ in range(workers)]
        self.busy_actors: dict[int, tuple[Task, ObjectRef, float]] = {}  # actor index -> (task, ref, deadline)
        self._check_started()

    def _start(self):
        return self._actor_class.remote(*self._args)

    def _check_started(self) -> None:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        try:
            ray.get([a.ready.remote() for a in self.actors], timeout=STARTUP_TIMEOUT_S)
        except GetTimeoutError:
            raise RewardError(f"a reward actor did not start within {STARTUP_TIMEOUT_S:g} s") from None
        except (RayActorError, RayTaskError) as err:
            cause = getattr(err, "cause", None) or err
            raise RewardError(f"reward actor could not load the reward functions: {cause}") from None

    @property
    def busy(self) -> bool:
        return bool(self.busy_actors)

    def step(self, pending: deque[Task]) -> list[tuple[Task, Outcome]]:
        """As `WorkerPool.step`: hand out tasks, wait (at most WAKE_S), return the outcomes that arrived."""
        for index in range(len(self.actors)):
            if index not in self.busy_actors and pending:
                task = pending.popleft()
                ref = self.actors[index].score.remote(task.component, task.rollouts)
                self.busy_actors[index] = (task, ref, time.monotonic() + self.timeout_s * len(task.rollouts))
        return list(self._collect()) if self.busy_actors else []

    def wake(self) -> None:
        pass  # a step waits at most WAKE_S

    def _collect(self) -> Iterator[tuple[Task, Outcome]]:
        import ray
        from ray.exceptions import RayActorError

        now = time.monotonic()
        wait_s = max(0.0, min(deadline for _, _, deadline in self.busy_actors.values()) - now)
        refs = [ref for _, ref, _ in self.busy_actors.values()]
        done, _ = ray.wait(refs, num_returns=1, timeout=min(wait_s, WAKE_S))
        for index, (task, ref, deadline) in list(self.busy_actors.items()):
            if ref in done:
                del self.busy_actors[index]
                try:
                    kind, payload = ray.get(ref)
                except RayActorError as err:
                    self._replace(index)
                    yield task, Outcome(DIED, message=f"reward actor died: {' '.join(str(err).split())[:200]}")
                    continue
                scores, failures = payload if kind == "ok" else (None, [])
                yield task, Outcome(kind, scores, failures, payload if kind != "ok" else "")
            elif time.monotonic() > deadline:
                del self.busy_actors[index]
                self._replace(index)
                yield task, Outcome(TIMEOUT, message=f"timed out after {self.timeout_s:g} s per sample")

    def _replace(self, index: int) -> None:
        import ray

        # ray types a started actor as ActorProxy (handle | class) for its methods' sake; it is an ActorHandle
        ray.kill(self.actors[index], no_restart=True)  # pyright: ignore[reportArgumentType]
        self.actors[index] = self._start()

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)  # pyright: ignore[reportArgumentType] - an ActorHandle (_replace)
        self.actors, self.busy_actors = [], {}
