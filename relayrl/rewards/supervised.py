"""Supervised worker processes: started from a server of their own, each call under a deadline, killed and
replaced when late or dead.

The reward service's pool (relayrl/rewards/pool.py: stateless workers, any one takes a batch) and the
environment pool (relayrl/envs/pool.py: one worker holds one trajectory's environment across its turns)
share this part: start a worker, wait until it says `ready`, read its answers, and when one is past its
deadline or dead, kill it (SIGKILL: a hung C call, a sleeping tool, a held lock all die with it) and start a
fresh one. What a late or dead call means is the subclass's business.

How a worker starts: forked from a worker server (CPython's forkserver, an instance of our own), a fresh
interpreter that has imported the worker modules (`PRELOAD`) and nothing of the driver: no forked copy of a
trainer holding threads, CUDA or vLLM state, and a start costs a fork, not an interpreter and its imports.
Unlike multiprocessing's `spawn` and `forkserver`, a worker does not re-run the driver's `__main__` (CPython's
spawn.prepare runs the user's script, its top-level imports included, once per worker): a worker needs only
its target, a relayrl function, and plain data (specs, kwargs). It takes the driver's environment variables
and working directory as they are when it starts, as a spawned process would (the modules the server preloaded
read theirs at import, from the driver's environment when the server started).

Signals: a SIGINT or SIGTERM sent to the whole process group (Ctrl-C, `timeout`, a scheduler) reaches the
workers too. They ignore both (`_start`): the driver finishes its step and stops them
(relayrl/run/preemption.py). The server starts with both blocked, so it survives them and its workers are born
that way (no window before they ignore them); terminating a worker is killing it.

A worker's target receives its end of a pipe and first sends `("ready", None)` or `("load_error", text)`;
then it answers one `(kind, payload)` per message (`receive`) until it receives `None`.
"""

from __future__ import annotations

import io
import multiprocessing
import multiprocessing.context as context
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from multiprocessing import forkserver, popen_forkserver, reduction, resource_tracker, spawn, util
from multiprocessing.connection import Connection, wait
from typing import Any, Generic, TypeVar, cast

DIED = "died"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
PRELOAD = ["relayrl.envs.pool", "relayrl.rewards.pool"]  # what the workers import: once, in the server
_SERVER = forkserver.ForkServer()
_SERVER.set_forkserver_preload(PRELOAD)  # and not `__main__`, the default


def receive(connection: Connection) -> Any:
    """In a worker: the driver's next message; None (stop) also once the driver's end of the pipe is closed."""
    try:
        return connection.recv()
    except EOFError:
        return None


def _start(target: Callable, environ: dict[str, str], connection: Connection, *args) -> None:
    """A worker's first steps: the driver's environment variables, the stop signals ignored, then `target`."""
    os.environ.clear()
    os.environ.update(environ)
    for signum in STOP_SIGNALS:
        signal.signal(signum, _ignore)  # not SIG_IGN, which the programs a worker runs would inherit
        signal.siginterrupt(signum, False)  # a system call the signal lands in carries on
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked since the server forked it
    target(connection, *args)


def _ignore(signum: int, frame) -> None:
    """The driver stops its workers (a stop signal sent to the whole group is the driver's to handle)."""


@contextmanager
def _stop_signals_blocked():
    """In this thread: a process started meanwhile (the worker server) is born with the stop signals blocked, as
    CPython starts its resource tracker (multiprocessing/resource_tracker.py)."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


class _Popen(popen_forkserver.Popen):
    """CPython's forkserver launch (multiprocessing/popen_forkserver.py, the same in 3.11-3.13) with two changes:
    the preparation data leaves out the driver's main module, and the server is ours."""

    _fds: list[int]  # the pipe ends the child inherits (set by the base class)

    def _launch(self, process_obj) -> None:
        data = spawn.get_preparation_data(process_obj._name)
        data = {k: v for k, v in data.items() if k not in ("init_main_from_name", "init_main_from_path")}
        buffer = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(data, buffer)
            reduction.dump(process_obj, buffer)
        finally:
            context.set_spawning_popen(None)
        resource_tracker.ensure_running()  # first: starting it unblocks the stop signals (bpo-33613's mask)
        with _stop_signals_blocked():  # the server, when this call starts it, is born with them blocked
            self.sentinel, w = _SERVER.connect_to_new_process(self._fds)
        self.finalizer = util.Finalize(self, _close_fds, (os.dup(w), self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buffer.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)

    def terminate(self) -> None:
        self.kill()  # a worker ignores SIGTERM (multiprocessing's exit terminates daemon processes, then joins them)


def _close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


class _Process(context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj):
        return _Popen(process_obj)


class WorkerContext(context.ForkServerContext):
    """Pipes and processes as multiprocessing's forkserver context makes them, started as above."""

    Process = _Process


# CPython versions whose forkserver launch `_Popen` follows (multiprocessing/popen_forkserver.py); on any other the
# workers are spawned as multiprocessing does it (slower to start, and re-running the driver's __main__)
CHECKED_PYTHONS = ((3, 11), (3, 12), (3, 13))
WORKERS = WorkerContext() if sys.version_info[:2] in CHECKED_PYTHONS else multiprocessing.get_context("spawn")


class Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, context, target: Callable, args: tuple):
        self.connection, child = context.Pipe()
        start_args = (target, dict(os.environ), child, *args)
        self.process = context.Process(target=_start, args=start_args, daemon=True)
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

    @property
    def killed(self) -> bool:
        """It ended by a signal (read once it is reaped, as `exit_status` does)."""
        code = self.process.exitcode
        return code is not None and code < 0

    def post(self, message: Any) -> None:
        """Send `message`; a worker that died meanwhile is left to the next read of its pipe, which reports it."""
        with suppress(OSError):  # BrokenPipeError, ConnectionResetError
            self.connection.send(message)

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

    context: Any = WORKERS  # how workers start (benchmarks/env_workers_start.py compares multiprocessing's spawn)

    def __init__(self, target: Callable, args: tuple, count: int):
        self._context = self.context
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
                        "is on stderr). A script whose functions the workers import (path/file.py:function) "
                        'must start the run under `if __name__ == "__main__":`'
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
