"""Reward worker processes: each loads the reward functions by spec and scores batches sent to it.

The pool owns the processes and the deadlines, nothing about policy: `step(pending)` hands tasks (a
component index and a batch of rollouts) to idle workers with a deadline of `timeout_s` per sample, waits
once, and returns the `(task, outcome)` pairs that finished. A worker past its deadline is killed (SIGKILL: a
hung C call, a sleeping sandbox, a held lock all die with it) and replaced (relayrl/rewards/supervised.py); its task
comes back as `TIMEOUT`. A worker that dies comes back as `DIED`. The caller decides what a timeout means (service.py).

Workers are forked from a worker server of their own (no forked copy of a trainer holding threads, CUDA or
vLLM state; the driver's `__main__` is not re-run; they ignore a stop signal sent to the whole process group:
relayrl/rewards/supervised.py) and say `ready` once every reward function has loaded; a function that cannot load fails the pool with the
worker's message. Reward functions travel by spec string (`exact_match`, `module:function`,
`path/file.py:function`), so nothing but data is pickled.

One thread drives a pool (the service's dispatcher, dispatch.py); only `wake` may be called from others.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from relayrl.errors import RewardError
from relayrl.rewards.supervised import DIED, SupervisedPool, Worker, first_deadline, receive
from relayrl.types import Rollout

TIMEOUT = "timeout"
STARTUP_TIMEOUT_S = 300.0  # loading a reward model can take a while; a worker silent for longer is broken


@dataclass
class Task:
    component: int  # index into the pool's reward functions
    offset: int  # position of rollouts[0] in the caller's batch
    rollouts: list[Rollout]
    owner: int = 0  # the scoring call the outcome goes back to (dispatch.py)


@dataclass
class Outcome:
    status: str  # "ok", "reward_error" (a RewardError: a setup mistake, or on_error=error), TIMEOUT, DIED
    scores: list | None = None  # list[Score | None] when ok
    failures: list[str] = field(default_factory=list)  # samples the function failed on (zeroed or skipped)
    message: str = ""


def _worker_main(connection: Connection, components: list[tuple[str, dict, str]], on_error: str) -> None:
    from relayrl.rewards.base import load_reward, score_rollouts

    try:
        fns = [load_reward(*component) for component in components]  # (spec, kwargs, style)
    except Exception as err:  # noqa: BLE001 - whatever the user's module raises is sent back as the load error
        connection.send(
            ("load_error", f"{type(err).__name__}: {err}" if not isinstance(err, RewardError) else str(err))
        )
        return
    connection.send(("ready", None))
    while (task := receive(connection)) is not None:
        try:
            connection.send(("ok", score_rollouts(fns[task.component], task.rollouts, on_error)))
        except RewardError as err:
            connection.send(("reward_error", str(err)))


class _RewardWorker(Worker):
    task: Task | None = None

    def send(self, task: Task, timeout_s: float) -> None:
        self.task, self.deadline = task, time.monotonic() + timeout_s * len(task.rollouts)
        self.post(task)


class WorkerPool(SupervisedPool[_RewardWorker]):
    role, loads, error = "reward worker", "the reward functions", RewardError
    startup_timeout_s = STARTUP_TIMEOUT_S
    worker_class = _RewardWorker

    def __init__(self, workers: int, components: list[tuple[str, dict, str]], on_error: str, timeout_s: float):
        super().__init__(_worker_main, (components, on_error), workers)
        self.timeout_s = timeout_s
        self._wake_receive, self._wake_send = socket.socketpair()
        self._wake_send.setblocking(False)

    @property
    def busy(self) -> bool:
        return any(w.task is not None for w in self.workers)

    def step(self, pending: deque[Task]) -> list[tuple[Task, Outcome]]:
        """Hand tasks from `pending` to idle workers (one each), wait until some finish, a deadline passes, a
        second passes or `wake()` is called, and return the outcomes that arrived, in completion order."""
        for worker in self.workers:
            if worker.ready and worker.task is None and pending:
                worker.send(pending.popleft(), self.timeout_s)
        return list(self._collect())

    def wake(self) -> None:
        """Cut the current `step`'s wait short (thread-safe: new tasks are waiting to be handed out)."""
        with contextlib.suppress(OSError):  # the buffer is full of wake-ups already, or the pool is closed
            self._wake_send.send(b"\0")

    def _collect(self) -> Iterator[tuple[Task, Outcome]]:
        for index, kind, payload in self._messages(first_deadline(self.workers, 1.0), (self._wake_receive,)):
            if kind == DIED:
                yield from self._lost(index, DIED, payload)
                continue
            worker = self.workers[index]
            task, worker.task = worker.task, None
            assert task is not None  # a worker answers only the task it was sent
            scores, failures = payload if kind == "ok" else (None, [])
            yield task, Outcome(kind, scores, failures, payload if kind != "ok" else "")
        for index in list(self._overdue()):
            yield from self._lost(index, TIMEOUT, f"timed out after {self.timeout_s:g} s per sample")

    def _lost(self, index: int, status: str, message: str) -> Iterator[tuple[Task, Outcome]]:
        old = self._replace(index)
        if old.task is not None:
            yield old.task, Outcome(status, message=message)

    def close(self) -> None:
        super().close()
        self._wake_receive.close()
        self._wake_send.close()
