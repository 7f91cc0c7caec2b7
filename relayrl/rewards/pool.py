"""Reward worker processes: each loads the reward functions by spec and scores batches sent to it.

The pool owns the processes and the deadlines, nothing about policy: `step(pending)` hands tasks (a
component index and a batch of rollouts) to idle workers with a deadline of `timeout_s` per sample, waits
once, and returns the `(task, outcome)` pairs that finished. A worker past its deadline is killed (SIGKILL: a hung C
call, a sleeping sandbox, a held lock all die with it) and replaced; its task comes back as `TIMEOUT`. A
worker that dies comes back as `DIED`. The caller decides what a timeout means (service.py).

Workers are started with `spawn` (no forked copy of a trainer holding threads, CUDA or vLLM state) and
say `ready` once every reward function has loaded; a function that cannot load fails the pool with the
worker's message. Reward functions travel by spec string (`exact_match`, `module:function`,
`path/file.py:function`), so nothing but data is pickled.

One thread drives a pool (the service's dispatcher, dispatch.py); only `wake` may be called from others.
"""

from __future__ import annotations

import multiprocessing
import socket
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Iterator

from relayrl.errors import RewardError
from relayrl.types import Rollout

TIMEOUT, DIED = "timeout", "died"
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
    errors: int = 0  # samples the function failed on (zeroed or skipped by score_rollouts)
    message: str = ""


def _worker_main(connection: Connection, components: list[tuple[str, dict, str]], on_error: str) -> None:
    import signal

    from relayrl.rewards.base import load_reward, score_rollouts

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the terminal's whole process group: the driver
    # finishes its step and then closes the workers (relayrl/preemption.py)
    try:
        fns = [load_reward(*component) for component in components]  # (spec, kwargs, style)
    except Exception as err:
        connection.send(
            ("load_error", f"{type(err).__name__}: {err}" if not isinstance(err, RewardError) else str(err))
        )
        return
    connection.send(("ready", None))
    while (task := connection.recv()) is not None:
        try:
            scores, errors = score_rollouts(fns[task.component], task.rollouts, on_error)
            connection.send(("ok", (scores, errors)))
        except RewardError as err:
            connection.send(("reward_error", str(err)))


class _Worker:
    def __init__(self, context, components, on_error: str):
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child, components, on_error), daemon=True)
        self.process.start()
        child.close()
        self.ready = False
        self.started = time.monotonic()
        self.task: Task | None = None
        self.deadline = float("inf")

    def send(self, task: Task, timeout_s: float) -> None:
        self.task, self.deadline = task, time.monotonic() + timeout_s * len(task.rollouts)
        self.connection.send(task)

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.connection.close()


class WorkerPool:
    def __init__(self, workers: int, components: list[tuple[str, dict]], on_error: str, timeout_s: float):
        self._context = multiprocessing.get_context("spawn")
        self._args = (components, on_error)
        self.timeout_s = timeout_s
        self.workers = [_Worker(self._context, *self._args) for _ in range(workers)]
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
        try:
            self._wake_send.send(b"\0")
        except OSError:  # the buffer is full of wake-ups already (BlockingIOError), or the pool is closed
            pass

    def _collect(self) -> Iterator[tuple[Task, Outcome]]:
        now = time.monotonic()
        deadline = min([w.deadline for w in self.workers] + [now + 1.0])
        for connection in wait(
            [w.connection for w in self.workers] + [self._wake_receive], timeout=max(0.0, deadline - now)
        ):
            if connection is self._wake_receive:
                self._wake_receive.recv(4096)
                continue
            index = next(i for i, w in enumerate(self.workers) if w.connection is connection)
            worker = self.workers[index]
            try:
                kind, payload = connection.recv()
            except (EOFError, OSError):
                if not worker.ready:
                    self.close()
                    raise RewardError(
                        f"a reward worker exited while starting (exit code {worker.process.exitcode}; "
                        "its traceback is on stderr). Workers are spawned: a script that builds "
                        'the reward service must do so under `if __name__ == "__main__":`'
                    )
                yield from self._replace(index, DIED, f"reward worker died (exit code {worker.process.exitcode})")
                continue
            if kind == "ready":
                worker.ready = True
            elif kind == "load_error":
                self.close()
                raise RewardError(f"reward worker could not load the reward functions: {payload}")
            else:
                task, worker.task, worker.deadline = worker.task, None, float("inf")
                scores, errors = payload if kind == "ok" else (None, 0)
                yield task, Outcome(kind, scores, errors, payload if kind != "ok" else "")
        now = time.monotonic()
        for index, worker in enumerate(self.workers):
            if worker.task is not None and now > worker.deadline:
                yield from self._replace(index, TIMEOUT, f"timed out after {self.timeout_s:g} s per sample")
            elif not worker.ready and now - worker.started > STARTUP_TIMEOUT_S:
                self.close()
                raise RewardError(f"a reward worker did not start within {STARTUP_TIMEOUT_S:g} s")

    def _replace(self, index: int, status: str, message: str) -> Iterator[tuple[Task, Outcome]]:
        worker = self.workers[index]
        worker.kill()
        self.workers[index] = _Worker(self._context, *self._args)
        if worker.task is not None:
            yield worker.task, Outcome(status, message=message)

    def close(self) -> None:
        for worker in self.workers:
            if worker.process.is_alive() and worker.ready and worker.task is None:
                try:
                    worker.connection.send(None)
                    worker.process.join(timeout=2.0)
                except OSError:
                    pass
            if worker.process.is_alive():
                worker.process.kill()
            worker.process.join()
            worker.connection.close()
        self.workers = []
        self._wake_receive.close()
        self._wake_send.close()
