"""The SDK's futures: a queued request gets an id at once (`UntypedAPIFuture`), runs on the service's one worker
thread in submission order (a training client's forward_backward, optim_step and save follow each other as it
sent them; torch work never overlaps; sample requests on the same weights waiting together share one engine
call, relayrl/service/sampling.py's SampleQueue), and `/api/v1/retrieve_future` answers its result, or `try_again` while it
is still queued or running (the SDK polls again).

A result is JSON (a dict) or bytes (a proto: `ForwardBackwardOutput`, `SampleResponse`). A failed request
answers `{"error", "category"}`: `user` for a `UserError` (the SDK raises `RequestFailedError` with the message),
`server` for anything else (logged with its traceback). Results stay retrievable (the SDK may ask twice); the
oldest are dropped past `keep`. Each request records the session that sent it, so a session that ends (finished or expired) has its
queued requests cancelled (`cancel_owned`; they answer a `user` error saying so). The SDK has no cancel route of
its own.

`Completions` is the SDK's batch poller (`/api/v1/retrieve_futures`, on since `client/config` answers
`sample_use_retrieve_futures`): one poll per sampling session (and clone of it) instead of one `retrieve_future`
per sample. Each sample's request, once done, is an event numbered by a cursor; a poll answers the events after
its `prev_cursor` (those at or before it are trimmed), waiting up to WAIT_S for one (woken by it, not polling
a clock), and the SDK then fetches each
finished result through `retrieve_future`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import traceback
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from relayrl.service.errors import UserError

log = logging.getLogger("relayrl.service")
WAIT_S = 5.0  # how long one retrieve waits for a result before answering try_again


class Futures:
    def __init__(self, keep: int = 10_000):
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relayrl-service")
        self.results: OrderedDict[str, Future] = OrderedDict()
        self.owners: dict[str, str] = {}  # request id -> the session that sent it
        self.ids = itertools.count(1)
        self.keep = keep

    def submit(self, fn: Callable[[], dict | bytes], owner: str = "") -> str:
        request_id = f"req-{next(self.ids)}"
        self.results[request_id] = self.worker.submit(_answer, fn)
        self.owners[request_id] = owner
        while len(self.results) > self.keep:
            self.owners.pop(self.results.popitem(last=False)[0], None)
        return request_id

    def cancel_owned(self, owner: str) -> int:
        """Cancel the requests of `owner` still queued (one already running finishes); how many were."""
        mine = [rid for rid, who in self.owners.items() if who == owner]
        return sum(self.results[rid].cancel() for rid in mine if rid in self.results)

    def run(self, fn: Callable[[], object]) -> Future:
        """A synchronous route's work, on the same worker (after everything queued before it)."""
        return self.worker.submit(fn)

    async def retrieve(self, request_id: str) -> dict | bytes:
        future = self.results.get(request_id)
        if future is None:
            raise UserError(f"request_id={request_id!r}: no such request", status=404)
        if future.cancelled():
            return {"error": f"request_id={request_id!r}: cancelled (its session ended)", "category": "user"}
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), WAIT_S)
        except asyncio.CancelledError:
            if not future.cancelled():
                raise
            return {"error": f"request_id={request_id!r}: cancelled (its session ended)", "category": "user"}
        except TimeoutError:
            return {"type": "try_again", "request_id": request_id, "queue_state": "active"}

    def when_done(self, request_id: str, fn: Callable[[Future], None]) -> None:
        self.results[request_id].add_done_callback(fn)

    def close(self) -> None:
        self.worker.shutdown(wait=True, cancel_futures=True)


class Completions:
    def __init__(self):
        self.events: dict[tuple[str, int], list[tuple[int, dict]]] = {}  # (session, clone) -> (cursor, completion)
        self.cursors = itertools.count(1)
        self.lock = threading.Lock()
        self.waiting: dict[tuple[str, int], list[Waiter]] = {}  # polls waiting for a target's next completion

    def watch(self, futures: Futures, target: tuple[str, int], request_id: str) -> None:
        """Queue `request_id`'s completion for `target`'s poller once it is done (finished, failed or cancelled)."""
        futures.when_done(request_id, lambda done: self.add(target, request_id, done))

    def add(self, target: tuple[str, int], request_id: str, done: Future) -> None:
        failed = done.cancelled() or (isinstance(done.result(), dict) and "error" in done.result())
        completion = {"state": "failed" if failed else "finished", "request_id": request_id}
        with self.lock:
            self.events.setdefault(target, []).append((next(self.cursors), completion))
            waiting = self.waiting.pop(target, [])
        for waiter in waiting:
            waiter.wake()

    def drop_session(self, prefix: str) -> None:
        """Forget the queues of an ended session's samplers (ids starting with `prefix`)."""
        with self.lock:
            for target in [target for target in self.events if target[0].startswith(prefix)]:
                del self.events[target]

    async def retrieve(self, target: tuple[str, int], prev_cursor: int, timeout: float | None) -> dict:
        """The completions after `prev_cursor` (those up to it trimmed), waiting up to WAIT_S for one unless
        `timeout` is 0 (the SDK's acknowledgement-only poll). A completion wakes the wait at once."""
        wait_s = WAIT_S if timeout is None else min(timeout, WAIT_S)
        waiter = Waiter(asyncio.get_running_loop(), asyncio.Event())
        with self.lock:
            events = self.after(target, prev_cursor)
            if not events and wait_s > 0:
                self.waiting.setdefault(target, []).append(waiter)
        if not events and wait_s > 0:
            with contextlib.suppress(TimeoutError):  # none came in time: an empty answer
                await asyncio.wait_for(waiter.event.wait(), wait_s)
            with self.lock:
                if waiter in self.waiting.get(target, []):
                    self.waiting[target].remove(waiter)
                events = self.after(target, prev_cursor)
        cursor = events[-1][0] if events else prev_cursor
        return {"completions": [completion for _, completion in events], "cursor": cursor}

    def after(self, target: tuple[str, int], prev_cursor: int) -> list[tuple[int, dict]]:
        """`target`'s completions after `prev_cursor`, those up to it trimmed (the caller holds the lock)."""
        events = self.events[target] = [e for e in self.events.get(target, []) if e[0] > prev_cursor]
        return events


@dataclass(eq=False)
class Waiter:
    """A poll waiting on the service's event loop; a completion, on the worker thread, wakes it through the loop."""

    loop: asyncio.AbstractEventLoop
    event: asyncio.Event

    def wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed (the service stopped): nobody waits any more
            self.loop.call_soon_threadsafe(self.event.set)


def _answer(fn: Callable[[], dict | bytes]) -> dict | bytes:
    try:
        return fn()
    except UserError as err:
        return {"error": str(err), "category": "user"}
    except Exception as err:  # noqa: BLE001 - any failure of a request answers its future; the service serves on
        log.error("request failed:\n%s", traceback.format_exc())
        return {"error": f"{type(err).__name__}: {err}", "category": "server"}
