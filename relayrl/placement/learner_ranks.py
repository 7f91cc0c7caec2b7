"""`placement.learner_ranks: W` on Ray: W learner actors forming one process group, behind one handle.

The ranks share the learner's bundle (each reserves 1/W of its CPUs and threads). They are created light,
rank 0 names a rendezvous address on its own node, and every rank then builds its sharded learner there at
once (the rendezvous has the call deadline). The controller and the weight sync hold a `LearnerRanks`: the
same methods as a `LearnerRole` handle, each call sent to every rank that takes part in it, with the step's
batch split by whole groups, padded to as many rows on every rank (`prepare`, `update`), and the results joined
without the padding (rank 0's where they agree). The ranks are awaited together with one deadline
(`placement.call_timeout_s`), and a failure names the rank that caused it, not the peers it held up:
- a rank that dies ends the call as `learner rank r` with the actor and Ray's root cause;
- a rank whose call fails inside a collective (gloo/nccl: a peer left, or the group's timeout, which equals the
  call's, ran out) was waiting for a peer: its error is held while the others are awaited;
- at the deadline, every rank still running is asked where it is (`where`, in a thread of its own, so it
  answers while the call runs): ranks inside torch.distributed wait in a collective; the others hang, and the
  error names them with the line they are stuck on. After a failure `close` does not wait on the ranks (a hung
  one never answers); the run's shutdown kills them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

import ray
import torch

from relayrl.errors import PlacementError, RoleFailure
from relayrl.learner.process_group import merge_experience, merge_results, sample_rows_of, split_by_groups
from relayrl.learner.sharded import sharded_learner
from relayrl.placement.handles import get
from relayrl.placement.sections import learner_settings

if TYPE_CHECKING:
    from relayrl.config import Config
    from relayrl.learner.result import UpdateResult
    from relayrl.learner.settings import LearnerSettings
    from relayrl.types import Experience

# calls made on rank 0 alone: they read nothing sharded (the layout comes from shapes) or only rank 0 acts; Ray's
# `__ray_call__` runs a function in the actor (the weight sync asks rank 0 for an address on its node)
RANK_0_ONLY = ("weight_layout", "join_sync_group", "unlink_segments", "state", "__ray_call__")
ACTOR_METHODS = ("start", "rendezvous_address", "__ray_call__")  # the rank actor's own; the rest are its learner's
PROBE_TIMEOUT_S = 5.0  # a rank that cannot say where it is within this is busy outside Python: hung too
COLLECTIVES = "torch/distributed/"  # a frame here: the rank waits for its peers (c10d, FSDP's collectives)


class LearnerRank:
    """The actor that hosts one rank's learner: built light, `start`ed once rank 0's rendezvous address is known
    (the learner joins the group and shards its models then), and every learner method reached through `call`."""

    def __init__(self, settings: LearnerSettings, rank: int, world: int, threads: int):
        self._pending = (settings, rank, world, threads)
        self._caller = threading.get_ident()  # the thread every call but `where` runs in (one, Ray's default group)
        self.learner = None

    def rendezvous_address(self) -> tuple[str, int]:
        from relayrl.sync.remote import node_address

        return node_address()

    def start(self, address: str, port: int, timeout_s: float) -> int:
        settings, rank, world, threads = self._pending
        self._caller = threading.get_ident()
        self.learner = sharded_learner(settings, rank, world, address, port, timeout_s, threads)
        return torch.get_num_threads()

    def call(self, method: str, *args):
        """`method` of this rank's learner."""
        return getattr(self.learner, method)(*args)

    @ray.method(concurrency_group="probe")
    def where(self) -> list[str]:
        """The stack of the call running now, innermost frame last, as `file:line in function: code` lines."""
        frames = sys._current_frames()
        stacks = {ident: traceback.extract_stack(frame) for ident, frame in frames.items()}
        if self._caller not in stacks:  # not the thread `start` ran in: the other one running relayrl's code
            me = threading.get_ident()
            busy = [i for i, stack in stacks.items() if i != me and any("/relayrl/" in f.filename for f in stack)]
            self._caller = busy[0] if busy else self._caller
        return [f"{f.filename}:{f.lineno} in {f.name}: {f.line}" for f in stacks.get(self._caller, [])]


class _Calls:
    """The refs of one call, one per rank that takes part in it (rank 0 first)."""

    def __init__(self, refs: list, ranks: list[int]):
        self.refs, self.ranks = refs, ranks


class LearnerRanks:
    def __init__(self, actors: list, timeout_s: float):
        self.actors, self.timeout_s = actors, timeout_s
        self.failed = False  # set by the first failed call: `close` then leaves the ranks to be killed
        self.abandoned: list = []  # the refs a failed call left pending: `close` reads those that ended since

    def actor_id(self, rank: int) -> str:
        return self.actors[rank]._actor_id.hex()[:12]

    def name(self, rank: int) -> str:
        return f"learner rank {rank} (actor {self.actor_id(rank)})"

    # ------------------------------------------------------------------ the fan-out
    def submit(self, method: str, *args, per_rank: list[tuple] | None = None) -> _Calls:
        """`method` on every rank that takes part (rank 0 alone for RANK_0_ONLY): a learner method through the
        actor's `call`, or one of the actor's own (ACTOR_METHODS)."""
        ranks = [0] if method in RANK_0_ONLY else list(range(len(self.actors)))
        refs = []
        for r in ranks:
            arguments = per_rank[r] if per_rank is not None else args
            actor = self.actors[r]
            if method in ACTOR_METHODS:
                refs.append(getattr(actor, method).remote(*arguments))
            else:
                refs.append(actor.call.remote(method, *arguments))
        return _Calls(refs, ranks)

    def wait_all(self, calls: _Calls, what: str, timeout_s: float | None = None) -> list[Any]:
        """Every rank's result, in rank order; a failure raises naming the rank that caused it."""
        try:
            return self._wait_all(calls, what, timeout_s or self.timeout_s)
        except Exception:
            self.failed = True
            raise

    def _wait_all(self, calls: _Calls, what: str, timeout_s: float) -> list[Any]:
        deadline = time.monotonic() + timeout_s
        pending = dict(zip(calls.refs, calls.ranks))
        results: dict[int, Any] = {}
        held: dict[int, str] = {}  # ranks whose call failed in a collective: they waited for a peer
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
                if not ready:
                    raise self.hung(sorted(pending.values()), held, what, timeout_s)
                rank = pending.pop(ready[0])
                try:
                    results[rank] = get(ready[0], f"learner rank {rank}", self.actor_id(rank), 1.0, what)
                except RoleFailure:
                    raise
                except PlacementError as err:
                    if COLLECTIVES in str(getattr(err.__cause__, "traceback_str", "")):
                        held[rank] = str(err)
                        continue
                    raise RoleFailure(str(err), f"learner rank {rank}", died=False) from err
        except Exception:
            self.abandoned += list(pending)
            raise
        if held:  # every rank returned, some from a failed collective and none otherwise
            rank = min(held)
            raise RoleFailure("; ".join(held.values()), f"learner rank {rank}", died=False, hung=True)
        return [results[r] for r in calls.ranks]

    def hung(self, pending: list[int], held: dict[int, str], what: str, timeout_s: float) -> RoleFailure:
        """The error for a call that missed its deadline, once every rank still running said where it is."""
        probes = {rank: self.actors[rank].where.remote() for rank in pending}
        ready, _ = ray.wait(list(probes.values()), num_returns=len(probes), timeout=PROBE_TIMEOUT_S)
        stacks = {rank: ray.get(ref) if ref in ready else None for rank, ref in probes.items()}
        late = f"did not finish {what} within {timeout_s:g} s (placement.call_timeout_s)"
        return blame(stacks, held, late, {rank: self.name(rank) for rank in pending})

    def wait(self, calls: _Calls, what: str, timeout_s: float | None = None) -> Any:
        return self.wait_all(calls, what, timeout_s)[0]  # rank 0's

    def close(self) -> None:
        """Every rank releases what it holds; after a failed call, nothing is awaited (the ranks are killed), but
        the peers' results that came in since are read: an error never read (a collective that timed out after
        ours was raised) would be printed by Ray as an "unhandled error" below the run's own message."""
        if not self.failed:
            self.wait_all(self.submit("close"), "close")
            return
        ended, _ = ray.wait(self.abandoned, num_returns=len(self.abandoned), timeout=0) if self.abandoned else ([], [])
        for ref in ended:
            with contextlib.suppress(Exception):  # the error of a peer of the rank already named
                ray.get(ref, timeout=0)

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

    def update(self, step: int, exp: Experience, sample_rows: int = 0) -> UpdateResult:
        parts = split_by_groups(exp, len(self.actors))
        per_rank = [(step, p, rows) for p, rows in zip(parts, sample_rows_of(parts, sample_rows))]
        results = self.wait_all(self.submit("update", per_rank=per_rank), "update")
        return merge_results(results, [float(p.loss_mask.sum()) for p in parts])


def start_learner_ranks(config: Config, group, slots: list) -> LearnerRanks:
    """W rank actors joined into one process group within placement.call_timeout_s: sharing the learner's one
    bundle (a 1/W share of its CPUs and threads each), or each in its own slot (a bundle with its GPU)."""
    from relayrl.placement.cluster import actor_options

    world, timeout = config.placement.learner_ranks, config.placement.call_timeout_s
    settings = learner_settings(config)  # what each rank builds its learner from
    if len(slots) == 1:
        share = dataclasses.replace(slots[0], cpus=slots[0].cpus / world, threads=max(1, slots[0].threads // world))
        slots = [share] * world
    remote = ray.remote(concurrency_groups={"probe": 1})(LearnerRank)  # pyright: ignore[reportCallIssue] - `where` answers while a call runs
    actors = [
        remote.options(**actor_options(group, slot)).remote(settings, rank, world, slot.threads)
        for rank, slot in enumerate(slots)
    ]
    ranks = LearnerRanks(actors, timeout)
    address, port = ranks.wait(_Calls([actors[0].rendezvous_address.remote()], [0]), "choosing an address")
    ranks.wait_all(ranks.submit("start", address, port, timeout), "joining the learner group")
    return ranks


def blame(stacks: dict[int, list[str] | None], held: dict[int, str], late: str, names: dict[int, str]) -> RoleFailure:
    """Whom a missed deadline is down to. `stacks`: each rank still running, with where it is (None: it did not
    answer). The ranks outside a collective hang, named with the line they are on; if every one waits in a
    collective, the held error of a rank that failed in one is the cause; else no rank can be singled out."""
    pending = sorted(stacks)
    waiting = [r for r in pending if COLLECTIVES in (stacks[r] or [""])[-1]]  # by the innermost frame
    culprits = [r for r in pending if r not in waiting]
    if not culprits and held:
        rank = min(held)
        return RoleFailure(
            f"{held[rank]}; learner ranks {_listed(pending)} still wait in a collective",
            f"learner rank {rank}",
            died=False,
            hung=True,
        )
    culprits = culprits or pending
    lines = []
    for rank in culprits:
        stack = stacks[rank]
        if stack is None:
            at = f"it did not say where it is within {PROBE_TIMEOUT_S:g} s (busy outside Python)"
        elif not stack:
            at = "its call's thread was not found"
        elif rank in waiting:
            at = f"it waits in a collective at {stack[-1]}"
        else:
            at = f"it hangs at {_innermost(stack)}"
        lines.append(f"{names[rank]} {late}: {at}")
    peers = [r for r in waiting if r not in culprits]
    if peers:
        many = len(peers) > 1
        lines.append(f"learner rank{'s' * many} {_listed(peers)} wait{'s' * (not many)} for it in a collective")
    return RoleFailure("; ".join(lines), f"learner rank {culprits[0]}", died=False, hung=True)


def _listed(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _innermost(stack: list[str]) -> str:
    """The innermost frame outside torch's own modules (the line that hangs), else the innermost."""
    for line in reversed(stack):
        if "/torch/" not in line:
            return line
    return stack[-1]
