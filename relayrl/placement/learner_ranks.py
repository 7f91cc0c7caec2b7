"""`placement.learner_ranks: W` on Ray: W learner actors forming one process group, behind one handle.

The ranks share the learner's bundle (each reserves 1/W of its CPUs and threads). They are created light,
rank 0 names a rendezvous address on its own node, and every rank then builds its `ShardedLearner` there at
once (the rendezvous has the call deadline). The controller and the weight sync hold a `LearnerRanks`: the
same methods as a `LearnerRole` handle, each call sent to every rank that takes part in it, with the step's
batch split by whole groups (`prepare`, `update`) and the results joined (rank 0's where they agree). The
ranks are awaited together with one deadline (`placement.call_timeout_s`): the first rank to fail ends the
call as `learner rank r`, with the actor and Ray's root cause, even while its peers still wait for it in a
collective (they are released by the process group's own timeout, or killed with the run).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from relayrl.config import Config
from relayrl.errors import RoleFailure
from relayrl.learner.ranks import merge_experience, merge_stats, split_by_groups
from relayrl.learner.sharded import ShardedLearner
from relayrl.types import Experience

# calls made on rank 0 alone: they read nothing sharded (the layout comes from shapes) or only rank 0 acts
RANK_0_ONLY = ("weight_layout", "join_sync_group", "unlink_segments", "state")


class LearnerRank(ShardedLearner):
    """The actor class: built light, then `start`ed once rank 0's rendezvous address is known."""

    def __init__(self, config: Config, rank: int, world: int, threads: int):
        self._pending = (config, rank, world, threads)

    def rendezvous_address(self) -> tuple[str, int]:
        import ray

        from relayrl.sync.remote import free_port

        return ray.util.get_node_ip_address(), free_port()

    def start(self, address: str, port: int, timeout_s: float) -> int:
        config, rank, world, threads = self._pending
        ShardedLearner.__init__(self, config, rank, world, address, port, timeout_s, threads)
        return torch.get_num_threads()


class _Calls:
    """The refs of one call, one per rank that takes part in it (rank 0 first)."""

    def __init__(self, refs: list, ranks: list[int]):
        self.refs, self.ranks = refs, ranks


class LearnerRanks:
    def __init__(self, actors: list, timeout_s: float):
        self.actors, self.timeout_s = actors, timeout_s

    def actor_id(self, rank: int) -> str:
        return self.actors[rank]._actor_id.hex()[:12]

    # ------------------------------------------------------------------ the fan-out
    def submit(self, method: str, *args, per_rank: list[tuple] | None = None) -> _Calls:
        ranks = [0] if method in RANK_0_ONLY else list(range(len(self.actors)))
        refs = [getattr(self.actors[r], method).remote(*(per_rank[r] if per_rank is not None else args)) for r in ranks]
        return _Calls(refs, ranks)

    def wait_all(self, calls: _Calls, what: str, timeout_s: float | None = None) -> list[Any]:
        """Every rank's result, in rank order; the first rank to fail or miss the deadline raises, named."""
        import ray

        from relayrl.placement.roles import get

        timeout_s = timeout_s or self.timeout_s
        deadline = time.monotonic() + timeout_s
        pending = dict(zip(calls.refs, calls.ranks))
        results: dict[int, Any] = {}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                rank, waiting = min(pending.values()), ", ".join(map(str, sorted(pending.values())))
                raise RoleFailure(
                    f"learner rank {rank} (actor {self.actor_id(rank)}) did not finish {what} within {timeout_s:g} s "
                    f"(placement.call_timeout_s); learner ranks {waiting} had not finished: one of them hangs and "
                    "the others wait for it in a collective",
                    f"learner rank {rank}",
                    died=False,
                )
            rank = pending.pop(ready[0])
            results[rank] = get(ready[0], f"learner rank {rank}", self.actor_id(rank), 1.0, what)
        return [results[r] for r in calls.ranks]

    def wait(self, calls: _Calls, what: str, timeout_s: float | None = None) -> Any:
        return self.wait_all(calls, what, timeout_s)[0]  # rank 0's

    def __getattr__(self, method: str):
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args):
            return self.wait(self.submit(method, *args), method)

        return call

    # ------------------------------------------------------------------ the step, split by whole groups
    def prepare(self, exp: Experience) -> Experience:
        parts = split_by_groups(exp, len(self.actors))
        done = self.wait_all(self.submit("prepare", per_rank=[(p,) for p in parts]), "prepare")
        return merge_experience(exp, done)

    def update(self, step: int, exp: Experience) -> dict[str, float]:
        parts = split_by_groups(exp, len(self.actors))
        stats = self.wait_all(self.submit("update", per_rank=[(step, p) for p in parts]), "update")
        return merge_stats(stats, [float(p.loss_mask.sum()) for p in parts])


def start_learner_ranks(config: Config, group, slot) -> LearnerRanks:
    """W rank actors in the learner's bundle, joined into one process group within placement.call_timeout_s."""
    import ray

    from relayrl.placement.cluster import actor_options

    world, timeout = config.placement.learner_ranks, config.placement.call_timeout_s
    share = dataclasses.replace(slot, cpus=slot.cpus / world, threads=max(1, slot.threads // world))
    actors = [
        ray.remote(LearnerRank).options(**actor_options(group, share)).remote(config, rank, world, share.threads)
        for rank in range(world)
    ]
    ranks = LearnerRanks(actors, timeout)
    address, port = ranks.wait(_Calls([actors[0].rendezvous_address.remote()], [0]), "choosing an address")
    ranks.wait_all(ranks.submit("start", address, port, timeout), "joining the learner group")
    return ranks
