"""Environment workers: one process per in-flight trajectory, each step under a deadline.

A trajectory takes a free worker at `reset` and keeps it (its environment instance lives there) until
`release`. `reset` and `step` only send; `poll(timeout)` waits for results, at most until the earliest
deadline, and returns `(key, status, payload)` triples: `ok` (the messages of `reset`, or a `Step`),
`env_error` (the environment returned something malformed: an EnvError message), `error` (it raised),
`timeout`, `died` (the worker exited), or `killed` (a signal from outside ended it: the kernel's
out-of-memory killer, a kill aimed at it; not the environment's failure). A worker past its deadline is killed
(SIGKILL: a hung C call or a sleeping tool dies with it) and replaced by a fresh one, so a hanging step costs
only its own trajectory.

Unlike the reward service's workers (relayrl/rewards/pool.py), which are stateless (any worker takes a batch),
an environment is an object with state that lives across the turns of one trajectory: killing a worker that
held several trajectories' environments would cost all of them, hence one trajectory per worker. Starting
(forked from a worker server, without re-running the driver's `__main__`), ignoring the group's stop signals,
deadlines and kill-and-replace are shared (relayrl/rewards/supervised.py). A start costs a fork plus the
environment's own imports (benchmarks/env_workers_start.py measures 64 of them).
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from multiprocessing.connection import Connection
from typing import Any

from relayrl.errors import EnvError
from relayrl.rewards.supervised import DIED, SupervisedPool, Worker, first_deadline, receive

STARTUP_TIMEOUT_S = 120.0
KILLED = "killed"  # a worker ended by a signal from outside


def _worker_main(connection: Connection, spec: str, kwargs: dict[str, Any], tools: list | None = None) -> None:
    from relayrl.envs.base import as_messages, as_step, call, load_env_class
    from relayrl.envs.tools import ToolTurn, load_function, tool_functions, tool_step

    try:
        cls = load_env_class(spec)
        # imported once, at start: a tool whose module cannot import fails here, as env.fn's class does
        loaded = {tool: load_function(tool) for tool in tools or [] if isinstance(tool, str)}
    except Exception as err:  # noqa: BLE001 - whatever the user's module raises is sent back as the load error
        connection.send(("load_error", str(err) if isinstance(err, EnvError) else f"{type(err).__name__}: {err}"))
        return
    connection.send(("ready", None))
    env, functions = None, {}
    while (message := receive(connection)) is not None:
        kind, payload, where = message
        try:
            if kind == "reset":
                try:
                    env = cls(**kwargs)
                except TypeError as err:
                    raise EnvError(f"env.fn={spec!r}: cannot build it with env.kwargs={kwargs}: {err}") from None
                functions = tool_functions(tools or [], env, loaded)
                messages = as_messages(call(env.reset, payload), f"{where}: {cls.__name__}.reset")
                connection.send(("ok", (messages, tuple(getattr(env, "stop", ()) or ()))))
            elif isinstance(payload, ToolTurn):  # env.tools: the parsed turn (relayrl/envs/tools.py)
                assert env is not None, "a step before the trajectory's reset"
                connection.send(("ok", tool_step(env, functions, payload, where)))
            else:
                assert env is not None, "a step before the trajectory's reset"  # the pool resets first
                connection.send(("ok", as_step(call(env.step, payload), f"{where}: {cls.__name__}.step")))
        except EnvError as err:
            connection.send(("env_error", str(err)))
        except Exception as err:  # noqa: BLE001 - the environment's own failure, handled per env.on_error
            connection.send(("error", f"{cls.__name__}.{kind} raised {type(err).__name__}: {err}"))


class _EnvWorker(Worker):
    key: Hashable | None = None  # the trajectory it serves
    queued: tuple | None = None  # a message waiting for the worker to be ready

    def send(self, message: tuple, timeout_s: float) -> None:
        if self.ready:
            self.deadline = time.monotonic() + timeout_s
            self.post(message)
        else:  # its deadline starts when it is ready
            self.queued = message

    @property
    def busy(self) -> bool:
        return self.calling or self.queued is not None


class EnvPool(SupervisedPool[_EnvWorker]):
    role, loads, error = "environment worker", "env.fn", EnvError
    startup_timeout_s = STARTUP_TIMEOUT_S
    worker_class = _EnvWorker

    def __init__(self, spec: str, kwargs: dict[str, Any], slots: int, timeout_s: float, tools: list | None = None):
        super().__init__(_worker_main, (spec, dict(kwargs), list(tools or [])), slots)
        self.timeout_s = timeout_s
        self._by_key: dict[Hashable, _EnvWorker] = {}

    @property
    def free(self) -> int:
        return sum(w.key is None for w in self.workers)

    @property
    def busy(self) -> bool:
        return any(w.busy for w in self.workers)

    def reset(self, key: Hashable, row: dict[str, Any], where: str) -> None:
        worker = next((w for w in self.workers if w.key is None), None)
        if worker is None:
            raise RuntimeError("no free environment worker (at most env.max_inflight trajectories)")
        worker.key = key
        self._by_key[key] = worker
        worker.send(("reset", row, where), self.timeout_s)

    def step(self, key: Hashable, action, where: str, turn=None) -> None:
        """Send the turn's text, or under env.tools its `ToolTurn` (`turn`, the sampled tokens, is for agents'
        pools: an environment sees text)."""
        self._by_key[key].send(("step", action, where), self.timeout_s)

    def release(self, key: Hashable) -> None:
        """The trajectory is over. A worker still busy with it (the driver gave up on it) is replaced, so that
        its late answer cannot reach the next trajectory."""
        worker = self._by_key.pop(key, None)
        if worker is None:
            return
        worker.key = None
        if worker.busy and worker in self.workers:  # not after `close` (a failed start closes the pool)
            self._replace(self.workers.index(worker))

    def poll(self, timeout: float) -> list[tuple[Hashable, str, Any]]:
        """Results that arrive within `timeout` seconds (cut short at the earliest deadline)."""
        results = []
        for index, kind, payload in self._messages(min(timeout, first_deadline(self.workers, timeout) + 0.01)):
            if kind == DIED:
                results += self._lost(index, KILLED if self.workers[index].killed else DIED, payload)
            else:
                results.append((self.workers[index].key, kind, payload))
        for index in list(self._overdue()):
            results += self._lost(index, "timeout", f"an environment step took over env.timeout_s={self.timeout_s:g} s")
        return results

    def _on_ready(self, worker: _EnvWorker) -> None:
        if worker.queued is not None:
            message, worker.queued = worker.queued, None
            worker.send(message, self.timeout_s)

    def _lost(self, index: int, status: str, message: str) -> list[tuple[Hashable, str, Any]]:
        old = self._replace(index)
        if old.key is None:
            return []
        self._by_key.pop(old.key, None)
        return [(old.key, status, message)]
