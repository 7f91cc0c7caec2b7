"""Many scoring calls, one worker pool: the thread that drives the pool and routes outcomes to their call.

The async schedule scores from one producer thread per engine replica, all through one reward service. A
pool's workers and deadlines belong to one thread (pool.py), so callers never touch the pool: a call
submits tasks tagged with its id, the dispatcher thread hands them to workers in submission order, and
each outcome goes back to the call that owns it. Callers therefore share the workers without waiting for
each other: a sample hanging in one call's batch holds one worker until its deadline, not the other calls.

A call that ends early (an error) is cancelled: its queued tasks are dropped and outcomes still running
are discarded when they arrive. A failure of the pool itself (workers that cannot load the reward
functions) is raised in every call, then and afterwards. Policy (retries, on_error) stays in service.py.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from relayrl.errors import RewardError
from relayrl.rewards.pool import Outcome, Task

CLOSE_TIMEOUT_S = 30.0  # the dispatcher's wait is cut short by `wake` (Ray pools: at most WAKE_S)


class Call:
    """One scoring call's view of the dispatcher: submit tasks, take their outcomes."""

    def __init__(self, dispatcher: Dispatcher, owner: int):
        self._dispatcher, self.owner = dispatcher, owner
        self.outstanding = 0  # submitted, outcome not yet taken

    def submit(self, tasks: list[Task]) -> None:
        for task in tasks:
            task.owner = self.owner
        self.outstanding += len(tasks)
        self._dispatcher.submit(tasks)

    def outcomes(self) -> Iterator[tuple[Task, Outcome]]:
        """Every submitted task's outcome, in completion order; tasks submitted while iterating included."""
        while self.outstanding:
            task, outcome = self._dispatcher.take(self.owner)
            self.outstanding -= 1
            yield task, outcome


class Dispatcher:
    def __init__(self, pool):
        self.pool = pool
        self._cond = threading.Condition()
        self._queued: deque[Task] = deque()  # submitted, not yet moved to the pool's pending queue
        self._inboxes: dict[int, deque[tuple[Task, Outcome]]] = {}  # live calls -> outcomes not yet taken
        self._ids = itertools.count()
        self._failure: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="reward-dispatcher", daemon=True)
        self._thread.start()

    @contextmanager
    def call(self) -> Iterator[Call]:
        owner = next(self._ids)
        with self._cond:
            self._inboxes[owner] = deque()
        try:
            yield Call(self, owner)
        finally:
            with self._cond:
                del self._inboxes[owner]  # cancelled if unfinished: its tasks are dropped or discarded

    def submit(self, tasks: list[Task]) -> None:
        with self._cond:
            self._raise_failure()
            self._queued.extend(tasks)
            self._cond.notify_all()
        self.pool.wake()

    def take(self, owner: int) -> tuple[Task, Outcome]:
        with self._cond:
            inbox = self._inboxes[owner]
            while not inbox:
                self._raise_failure()
                self._cond.wait()
            return inbox.popleft()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            if isinstance(self._failure, RewardError):
                raise RewardError(str(self._failure))
            raise RewardError(
                f"the reward service stopped: {type(self._failure).__name__}: {self._failure}"
            ) from self._failure
        if self._closed:
            raise RewardError("the reward service is closed")

    def _serve(self) -> None:
        pending: deque[Task] = deque()  # the pool's queue: only this thread touches it
        try:
            while True:
                with self._cond:
                    while not (self._closed or self._queued or pending or self.pool.busy):
                        self._cond.wait()
                    if self._closed:
                        return
                    pending.extend(self._queued)
                    self._queued.clear()
                    live = [task for task in pending if task.owner in self._inboxes]
                    pending.clear()
                    pending.extend(live)
                outcomes = self.pool.step(pending)
                with self._cond:
                    for task, outcome in outcomes:
                        if task.owner in self._inboxes:  # else its call was cancelled
                            self._inboxes[task.owner].append((task, outcome))
                    self._cond.notify_all()
        except BaseException as err:  # noqa: BLE001 - raised in every call instead
            with self._cond:
                self._failure = err
                self._cond.notify_all()

    def close(self) -> None:
        """Stop the dispatcher thread, then the pool's workers."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.pool.wake()
        self._thread.join(CLOSE_TIMEOUT_S)
        self.pool.close()
