"""Rollout-engine replicas in Ray actors behind the `EngineGroup` protocol (relayrl/rollout/protocols.py), restarted
when one dies.

A step's prompts are split into contiguous shares, one per replica, generated concurrently and joined
in order; each share carries its offset in the batch, so every request keeps the seed it would have on a
single engine (N replicas with equal weights sample exactly what one would). When a replica dies or
misses its deadline, `placement.on_engine_failure=restart` starts a fresh actor in the same bundle, lets
the sync re-attach and push the current weights, and retries that share; `fail` (or running out of
`max_engine_restarts`) ends the run with the role, the actor and the cause.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from relayrl.config import PlacementConfig
from relayrl.errors import RoleFailure
from relayrl.placement.handles import RemoteRole
from relayrl.rollout.seeds import share_of
from relayrl.types import Prompt, Rollout, Sampling


class RayEngineGroup:
    def __init__(self, spawn: Callable[[int], RemoteRole], placement: PlacementConfig):
        self.spawn, self.placement = spawn, placement
        self.replicas = [spawn(i) for i in range(placement.engines)]
        self.request_loop = (
            None  # no in-process engine: multi-turn turns go in batches (relayrl/sources/turn_requests.py)
        )
        self.on_restart: Callable[[], None] = lambda: None  # set by the sync: re-attach and push weights
        self.restarts = 0
        self.start_s = 0.0  # the slowest replica's engine start (ready)
        self.lock = threading.RLock()  # one restart at a time
        self.spans_lock = threading.Lock()  # producer threads record spans while the loop takes them
        self.spans: list[tuple[int, float, float]] = []

    def ready(self) -> list[int]:
        """Wait until every replica has started (vLLM loaded); their process ids. The slowest start is kept for the
        metrics (`time/engine_start`)."""
        refs = [r.submit("ping") for r in self.replicas]
        pids = [r.wait(ref, "start-up") for r, ref in zip(self.replicas, refs)]
        self.start_s = max(r.wait(r.submit("start_seconds"), "start-up") for r in self.replicas)
        return pids

    def sleep(self, level: int) -> None:
        self._on_every_replica("sleep", level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self._on_every_replica("wake_up", tags)

    def _on_every_replica(self, method: str, *args) -> None:
        refs = [r.submit(method, *args) for r in self.replicas]
        for replica, ref in zip(self.replicas, refs):
            replica.wait(ref, method)

    def generate(self, prompts: list[Prompt], sampling: Sampling, version: int) -> list[Rollout]:
        return self.finish(self.submit(prompts, sampling, version))

    def submit(self, prompts: list[Prompt], sampling: Sampling, version: int, replicas: list[int] | None = None):
        """Start generating (shares across `replicas`, default all) and return at once; `finish` collects."""
        replicas = list(range(len(self.replicas))) if replicas is None else replicas
        shares = split(prompts, len(replicas))
        pending = []
        for index, (offset, share) in zip(replicas, shares):
            if share:
                args = (share, share_of(sampling, offset, len(share)), version)
                pending.append((index, args, self.replicas[index].submit("generate_timed", *args)))
        return pending

    def finish(self, pending) -> list[Rollout]:
        """The rollouts of a `submit`, in prompt order; a replica that died is replaced and its share redone."""
        rollouts = []
        for index, args, ref in pending:
            replica = self.replicas[index]
            try:
                share, start, end = replica.wait(ref, "generate")
                rollouts += share
                self._record_span(index, start, end)
            except RoleFailure as failure:
                self.recover(index, failure, seen=replica)
                rollouts += self.replicas[index].generate(*args)
        return rollouts

    def generate_until(self, replica: int, samples, sampling: Sampling, groups_needed: int):
        """Partial rollouts on one replica (see the engine's `generate_until`); retried once on a restarted one."""
        start, actor = time.time(), self.replicas[replica]
        try:
            result = actor.generate_until(samples, sampling, groups_needed)
        except RoleFailure as failure:
            self.recover(replica, failure, seen=actor)
            result = self.replicas[replica].generate_until(samples, sampling, groups_needed)
        self._record_span(replica, start, time.time())
        return result

    def _record_span(self, replica: int, start: float, end: float) -> None:
        with self.spans_lock:
            self.spans.append((replica, start, end))

    def take_spans(self) -> list[tuple[int, float, float]]:
        """(replica, start, end) of every generate call since the last take (for the timeline)."""
        with self.spans_lock:
            spans, self.spans = self.spans, []
        return spans

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        return self.replicas[0].prompt_logprobs(token_ids)

    def recover(self, index: int, failure: RoleFailure, seen: RemoteRole | None = None) -> None:
        """Replace replica `index` and re-sync weights, or re-raise when restarts are off or used up.

        `seen` is the actor whose call failed. Producer threads (async schedule), the training loop and the
        sync may all see one death: the first replaces the actor, and a caller that saw an actor already
        replaced just retries on the new one (one death is one restart, whoever notices it)."""
        import ray

        with self.lock:
            if seen is not None and self.replicas[index] is not seen:
                return
            self._recover(index, failure, ray)

    def _recover(self, index: int, failure: RoleFailure, ray) -> None:
        placement = self.placement
        if placement.on_engine_failure == "stop":
            raise RoleFailure(
                f"{failure} (placement.on_engine_failure=stop)", failure.role, failure.died, failure.hung
            ) from None
        if self.restarts >= placement.max_engine_restarts:
            raise RoleFailure(
                f"{failure}; placement.max_engine_restarts={placement.max_engine_restarts} already used",
                failure.role,
                failure.died,
                failure.hung,
            ) from None
        ray.kill(self.replicas[index]._actor, no_restart=True)  # a hung actor must not linger
        self.restarts += 1
        print(
            f"relayrl: {failure}; restarting engine {index} "
            f"(restart {self.restarts} of {placement.max_engine_restarts})",
            file=sys.stderr,
            flush=True,
        )
        self.replicas[index] = self.spawn(index)
        self.replicas[index].ping()
        self.on_restart()

    def metrics(self) -> dict[str, float]:
        return {"placement/engine_restarts": float(self.restarts), "time/engine_start": self.start_s}


def split(items: list, parts: int) -> list[tuple[int, list]]:
    """Contiguous shares as even as possible, with the offset of each: [(0, [...]), (k, [...]), ...]."""
    size, extra = divmod(len(items), parts)
    shares, start = [], 0
    for part in range(parts):
        end = start + size + (part < extra)
        shares.append((start, items[start:end]))
        start = end
    return shares
