"""The bounded rollout buffer of the async schedule: finished groups in, batches of groups out, and a
hard bound on how stale a handed-out sample may be.

A group's staleness, when the learner takes it to train policy version `v + 1` from version `v`, is
`v - oldest`, where `oldest` is the earliest policy version that produced any of its tokens (a partial
rollout can span several). Nothing older than `max_staleness` is ever handed out:

- `on_stale="drop"`: producers stay at most one batch ahead of the learner: a group may be admitted while fewer
  than `capacity` (default: one batch, G) are admitted and not yet taken or dropped, those being generated
  included. While the learner trains on one batch the producers make the next; groups that have become too
  stale by the time they are taken are dropped and counted (counting only the groups waiting let the producers
  run batches ahead, to be dropped).
- `on_stale="wait"`: admission control. A producer must `admit` a group (get a ticket) before generating
  it. The learner training version `v` takes exactly tickets `[v*G, (v+1)*G)` (G = groups per step), in
  ticket order, waiting for stragglers; and ticket `t` is admitted only once the published version `a`
  satisfies `t < (a + max_staleness + 1) * G`. Its tokens are produced by version `a` or newer and it is
  consumed at version `t // G <= a + max_staleness`, so it is never staler than the bound. Producers
  wait; nothing is dropped.

Thread-safe: producers (rollout threads) and the consumer (the training loop) share one condition.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from relayrl.errors import PlacementError


@dataclass
class Group:
    """The rollouts of one prompt, with their scores; `oldest` = min policy version over its tokens."""

    rollouts: list
    scores: list
    oldest: int
    ticket: int = -1  # admission order (wait mode)
    meta: dict = field(default_factory=dict)


class RolloutBuffer:
    def __init__(
        self,
        groups_per_step: int,
        max_staleness: int,
        on_stale: str = "drop",
        capacity: int = 0,
        version: int = 0,
        on_drop: Callable[[list[Group]], None] | None = None,
    ):
        if on_stale not in ("drop", "wait"):
            raise ValueError(f"on_stale must be drop or wait, got {on_stale!r}")
        self.groups_per_step, self.max_staleness, self.on_stale = groups_per_step, max_staleness, on_stale
        self.capacity = capacity or groups_per_step
        self.version = version  # the newest policy version on the engines
        self.admitted = version * groups_per_step  # next ticket
        self.released = self.admitted  # groups taken or dropped (drop mode: admitted - released are outstanding)
        self.dropped = 0
        self.on_drop = on_drop  # told of every group dropped as too stale (under the buffer's lock)
        self.closed = False
        self._groups: dict[int, Group] = {}  # by ticket (wait) or by arrival (drop)
        self._arrivals = 0
        self._cond = threading.Condition()

    # ------------------------------------------------------------------ producers
    def admit(self, timeout_s: float | None = None) -> int | None:
        """Block until one more group may be generated; its ticket, or None once the buffer is closed."""
        with self._cond:
            ok = self._cond.wait_for(lambda: self.closed or self._may_admit(), timeout_s)
            if self.closed:
                return None
            if not ok:
                raise PlacementError(f"rollout producer waited {timeout_s:g} s for room in the buffer")
            self.admitted += 1
            return self.admitted - 1

    def admit_now(self) -> int | None:
        """A ticket if one may be admitted without waiting, else None: a producer filling its chunk does not wait
        holding tickets it has not generated (the learner could be waiting for them)."""
        with self._cond:
            if self.closed or not self._may_admit():
                return None
            self.admitted += 1
            return self.admitted - 1

    def _may_admit(self) -> bool:
        if self.on_stale == "wait":
            return self.admitted < (self.version + self.max_staleness + 1) * self.groups_per_step
        return self.admitted - self.released < self.capacity

    def put(self, group: Group) -> None:
        with self._cond:
            key = group.ticket if self.on_stale == "wait" else self._arrivals
            self._arrivals += 1
            self._groups[key] = group
            self._cond.notify_all()

    # ------------------------------------------------------------------ the learner
    def take(self, version: int, timeout_s: float) -> list[Group]:
        """The batch that trains `version`: `groups_per_step` groups, none staler than `max_staleness`."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                taken = self._try_take(version)
                if taken is not None:
                    self._cond.notify_all()
                    return taken
                left = deadline - time.monotonic()
                if self.closed:
                    raise PlacementError("the rollout producers stopped before a batch was complete")
                if (left <= 0 or not self._cond.wait(left)) and time.monotonic() >= deadline:
                    raise PlacementError(
                        f"no full batch of rollouts within {timeout_s:g} s "
                        f"({len(self._groups)} of {self.groups_per_step} groups ready)"
                    )

    def _try_take(self, version: int) -> list[Group] | None:
        g = self.groups_per_step
        if self.on_stale == "wait":
            tickets = range(version * g, (version + 1) * g)
            if not all(t in self._groups for t in tickets):
                return None
            taken = [self._groups.pop(t) for t in tickets]
            assert all(version - x.oldest <= self.max_staleness for x in taken), "admission control failed"
            return taken
        self._drop_staler_than(version)
        if len(self._groups) < g:
            return None
        keys = sorted(self._groups)[:g]  # arrival order
        self.released += g
        return [self._groups.pop(k) for k in keys]

    def _drop_staler_than(self, version: int) -> None:
        """Drop mode: discard the groups too stale to train `version` (or anything after it), and wake the
        producers, which may be waiting for the room this frees (else a full buffer of stale groups would
        leave the learner short of a batch and every producer asleep)."""
        if self.on_stale != "drop":
            return
        stale = [k for k, x in self._groups.items() if version - x.oldest > self.max_staleness]
        dropped = [self._groups.pop(key) for key in stale]
        if dropped and self.on_drop is not None:
            self.on_drop(dropped)
        self.dropped += len(stale)
        self.released += len(stale)
        if stale:
            self._cond.notify_all()

    def advance(self, version: int) -> None:
        """Every engine now holds `version`: more groups may be admitted, and (drop mode) groups that can no
        longer be trained are dropped now, freeing their room for fresh ones."""
        with self._cond:
            self.version = version
            self._drop_staler_than(version)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def metrics(self) -> dict[str, float]:
        with self._cond:
            return {"buffer/groups": float(len(self._groups)), "buffer/dropped": float(self.dropped)}
