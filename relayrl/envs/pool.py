"""Environment workers: one spawned process per in-flight trajectory, each step under a deadline.

A trajectory takes a free worker at `reset` and keeps it (its environment instance lives there) until
`release`. `reset` and `step` only send; `poll(timeout)` waits for results, at most until the earliest
deadline, and returns `(key, status, payload)` triples: `ok` (the messages of `reset`, or a `Step`),
`env_error` (the environment returned something malformed: an EnvError message), `error` (it raised),
`timeout` or `died`. A worker past its deadline is killed (SIGKILL: a hung C call or a sleeping tool dies
with it) and replaced by a fresh one, so a hanging step costs only its own trajectory.

Why not the reward service's pool (relayrl/rewards/pool.py): its workers are stateless (a task is a batch of
rollouts, any worker takes it), while an environment is an object with state that lives across the turns of
one trajectory; killing a worker that held several trajectories' environments would cost all of them. The
deadline and kill-and-replace logic is the same. Workers start with `spawn` and import only
relayrl.envs (no torch): a start costs ~0.1 s plus the environment's own imports.
"""

from __future__ import annotations

import multiprocessing
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Hashable

from relayrl.errors import EnvError

STARTUP_TIMEOUT_S = 120.0


def _worker_main(connection: Connection, spec: str, kwargs: dict[str, Any]) -> None:
    import signal

    from relayrl.envs.base import as_messages, as_step, call, load_env_class

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver ends the workers on Ctrl-C
    try:
        cls = load_env_class(spec)
    except Exception as err:
        connection.send(("load_error", str(err) if isinstance(err, EnvError) else f"{type(err).__name__}: {err}"))
        return
    connection.send(("ready", None))
    env = None
    while (message := connection.recv()) is not None:
        kind, payload, where = message
        try:
            if kind == "reset":
                try:
                    env = cls(**kwargs)
                except TypeError as err:
                    raise EnvError(f"env.fn={spec!r}: cannot build it with env.kwargs={kwargs}: {err}") from None
                messages = as_messages(call(env.reset, payload), f"{where}: {cls.__name__}.reset")
                connection.send(("ok", (messages, tuple(getattr(env, "stop", ()) or ()))))
            else:
                connection.send(("ok", as_step(call(env.step, payload), f"{where}: {cls.__name__}.step")))
        except EnvError as err:
            connection.send(("env_error", str(err)))
        except Exception as err:  # noqa: BLE001 - the environment's own failure, handled per env.on_error
            connection.send(("error", f"{cls.__name__}.{kind} raised {type(err).__name__}: {err}"))


class _Worker:
    def __init__(self, context, spec: str, kwargs: dict[str, Any]):
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child, spec, kwargs), daemon=True)
        self.process.start()
        child.close()
        self.ready = False
        self.started = time.monotonic()
        self.key: Hashable | None = None  # the trajectory it serves
        self.queued: tuple | None = None  # a message waiting for the worker to be ready
        self.deadline = float("inf")

    def send(self, message: tuple, timeout_s: float) -> None:
        if self.ready:
            self.deadline = time.monotonic() + timeout_s
            self.connection.send(message)
        else:  # its deadline starts when it is ready
            self.queued = message

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.connection.close()


class EnvPool:
    def __init__(self, spec: str, kwargs: dict[str, Any], slots: int, timeout_s: float):
        self._context = multiprocessing.get_context("spawn")
        self._args = (spec, dict(kwargs))
        self.timeout_s = timeout_s
        self.workers = [_Worker(self._context, *self._args) for _ in range(slots)]
        self._by_key: dict[Hashable, _Worker] = {}

    @property
    def free(self) -> int:
        return sum(w.key is None for w in self.workers)

    @property
    def busy(self) -> bool:
        return any(w.deadline < float("inf") or w.queued is not None for w in self.workers)

    def reset(self, key: Hashable, row: dict[str, Any], where: str) -> None:
        worker = next((w for w in self.workers if w.key is None), None)
        if worker is None:
            raise RuntimeError("no free environment worker (at most env.max_inflight trajectories)")
        worker.key = key
        self._by_key[key] = worker
        worker.send(("reset", row, where), self.timeout_s)

    def step(self, key: Hashable, action: str, where: str) -> None:
        self._by_key[key].send(("step", action, where), self.timeout_s)

    def release(self, key: Hashable) -> None:
        """The trajectory is over. A worker still busy with it (the driver gave up on it) is replaced, so that
        its late answer cannot reach the next trajectory."""
        worker = self._by_key.pop(key, None)
        if worker is None:
            return
        worker.key = None
        if worker.deadline < float("inf") or worker.queued is not None:
            index = self.workers.index(worker)
            worker.kill()
            self.workers[index] = _Worker(self._context, *self._args)

    def poll(self, timeout: float) -> list[tuple[Hashable, str, Any]]:
        """Results that arrive within `timeout` seconds (cut short at the earliest deadline)."""
        now = time.monotonic()
        deadline = min([w.deadline + 0.01 for w in self.workers] + [now + timeout])
        results = []
        for connection in wait([w.connection for w in self.workers], timeout=max(0.0, deadline - now)):
            index = next(i for i, w in enumerate(self.workers) if w.connection is connection)
            worker = self.workers[index]
            try:
                kind, payload = connection.recv()
            except (EOFError, OSError):
                if not worker.ready:
                    self.close()
                    raise EnvError(
                        f"an environment worker exited while starting (exit code {worker.process.exitcode}; its "
                        'traceback is on stderr). Workers are spawned: a script must run under `if __name__ == "__main__":`'
                    ) from None
                results += self._replace(
                    index, "died", f"environment worker died (exit code {worker.process.exitcode})"
                )
                continue
            if kind == "load_error":
                self.close()
                raise EnvError(f"environment worker could not load env.fn: {payload}")
            if kind == "ready":
                worker.ready = True
                if worker.queued is not None:
                    worker.send(worker.queued, self.timeout_s)
                    worker.queued = None
                continue
            worker.deadline = float("inf")
            results.append((worker.key, kind, payload))
        now = time.monotonic()
        for index, worker in enumerate(self.workers):
            if worker.ready and now > worker.deadline:
                results += self._replace(
                    index, "timeout", f"an environment step took over env.timeout_s={self.timeout_s:g} s"
                )
            elif not worker.ready and now - worker.started > STARTUP_TIMEOUT_S:
                self.close()
                raise EnvError(f"an environment worker did not start within {STARTUP_TIMEOUT_S:g} s")
        return results

    def _replace(self, index: int, status: str, message: str) -> list[tuple[Hashable, str, Any]]:
        worker = self.workers[index]
        worker.kill()
        self.workers[index] = _Worker(self._context, *self._args)
        if worker.key is None:
            return []
        self._by_key.pop(worker.key, None)
        return [(worker.key, status, message)]

    def close(self) -> None:
        for worker in self.workers:
            if worker.process.is_alive() and worker.ready and worker.deadline == float("inf"):
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
