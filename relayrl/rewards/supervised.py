"""Supervised worker processes: spawned, each call under a deadline, killed and replaced when late or dead.

The reward service's pool (relayrl/rewards/pool.py: stateless workers, any one takes a batch) and the
environment pool (relayrl/envs/pool.py: one worker holds one trajectory's environment across its turns)
share this part: start a worker with `spawn` (no forked copy of a trainer holding threads, CUDA or vLLM
state), wait until it says `ready`, read its answers, and when one is past its deadline or dead, kill it
(SIGKILL: a hung C call, a sleeping tool, a held lock all die with it) and start a fresh one. What a late
or dead call means is the subclass's business.

A worker's target receives its end of a pipe and first sends `("ready", None)` or `("load_error", text)`;
then it answers one `(kind, payload)` per message until it receives `None`.
"""

from __future__ import annotations

import multiprocessing
import signal
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import wait
from typing import Any, Generic, TypeVar, cast

DIED = "died"


class Worker:
    """One spawned process and the parent's end of its pipe."""

    def __init__(self, context, target: Callable, args: tuple):
        self.connection, child = context.Pipe()
        self.process = context.Process(target=target, args=(child, *args), daemon=True)
        self.process.start()
        child.close()
        self.ready = False
        self.started = time.monotonic()
        self.deadline = float("inf")  # set while a call is out

    @property
    def calling(self) -> bool:
        return self.deadline < float("inf")

    def exit_status(self, wait_s: float = 5.0) -> str:
        """How the process ended, read after it is reaped: its pipe closing comes before its exit, so the exit
        code is only known once `join` returns. One still running `wait_s` after closing its pipe is killed."""
        self.process.join(timeout=wait_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
            return f"closed its pipe and was still running {wait_s:g} s later, so it was killed"
        code = self.process.exitcode
        if code is not None and code < 0:
            try:
                return f"killed by signal {-code} ({signal.Signals(-code).name})"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.connection.close()

    def stop(self) -> None:
        """Ask an idle worker to exit, kill one that is busy or does not."""
        if self.process.is_alive() and self.ready and not self.calling:
            try:
                self.connection.send(None)
                self.process.join(timeout=2.0)
            except OSError:
                pass
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.connection.close()


W = TypeVar("W", bound=Worker)


class SupervisedPool(Generic[W]):
    """Workers of one kind (`worker_class`, W); subclasses name them (`role`), say what they load and which
    error to raise."""

    role = "worker"  # "reward worker", "environment worker"
    loads = "its code"  # what a load_error failed to load
    error: type[Exception] = RuntimeError
    startup_timeout_s = 120.0
    # pyright cannot check a default against the class's own type variable; Worker is right for a bare pool
    worker_class: type[W] = Worker  # pyright: ignore[reportAssignmentType]

    def __init__(self, target: Callable, args: tuple, count: int):
        self._context = multiprocessing.get_context("spawn")
        self._target, self._args = target, args
        self.workers = [self._spawn() for _ in range(count)]

    def _spawn(self) -> W:
        return self.worker_class(self._context, self._target, self._args)

    def _messages(self, timeout: float, wakers: tuple[socket.socket, ...] = ()) -> Iterator[tuple[int, str, Any]]:
        """Answers that arrive within `timeout` s: `(index, kind, payload)`, and `(index, DIED, text)` for a
        worker that exited after it was ready. A `ready` is recorded (then `_on_ready`), not yielded; a worker
        that fails to load or exits while starting closes the pool and raises. `wakers` (sockets) only cut the
        wait short; they are drained."""
        connections = [w.connection for w in self.workers]
        for ready in wait(connections + list(wakers), timeout=max(0.0, timeout)):
            if ready not in connections:
                cast(socket.socket, ready).recv(4096)  # a waker
                continue
            index = connections.index(ready)
            connection, worker = connections[index], self.workers[index]
            try:
                kind, payload = connection.recv()
            except (EOFError, OSError):
                if not worker.ready:
                    self.close()
                    raise self.error(
                        f"{_a(self.role)} exited while starting ({worker.exit_status()}; its traceback "
                        "is on stderr). Workers are spawned: a script that starts them must do so under "
                        '`if __name__ == "__main__":`'
                    ) from None
                yield index, DIED, f"{self.role} died ({worker.exit_status()})"
                continue
            if kind == "load_error":
                self.close()
                raise self.error(f"{self.role} could not load {self.loads}: {payload}")
            if kind == "ready":
                worker.ready = True
                self._on_ready(worker)
                continue
            worker.deadline = float("inf")
            yield index, kind, payload

    def _on_ready(self, worker: W) -> None:
        """A worker just said `ready` (the env pool sends the message it queued)."""

    def _overdue(self) -> Iterator[int]:
        """Indices of workers past their call's deadline; raises when one has not started in time."""
        now = time.monotonic()
        for index, worker in enumerate(self.workers):
            if worker.ready and now > worker.deadline:
                yield index
            elif not worker.ready and now - worker.started > self.startup_timeout_s:
                self.close()
                raise self.error(f"{_a(self.role)} did not start within {self.startup_timeout_s:g} s")

    def _replace(self, index: int) -> W:
        """Kill worker `index` and start a fresh one in its place; returns the old one (its call is lost)."""
        old = self.workers[index]
        old.kill()
        self.workers[index] = self._spawn()
        return old

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers = []


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def first_deadline(workers: Sequence[Worker], cap: float) -> float:
    """Seconds until the earliest call deadline, at most `cap`."""
    now = time.monotonic()
    return max(0.0, min([w.deadline - now for w in workers] + [cap]))
