"""The learner's process group, and how a step's work is divided among its W ranks and joined again.

- `join_learner_group`: torch.distributed's default group for the learner ranks (gloo on CPU, nccl on GPU),
  formed by a TCP rendezvous with a deadline; the same timeout bounds every collective in it afterwards
  (FSDP's all-gathers and reduce-scatters included), so a dead or hung peer ends a call instead of hanging it.
- `split_by_groups`: rank r takes the r-th contiguous run of whole groups (a group never straddles two ranks,
  so group packing and group-relative statistics still hold), the runs as even in rows as whole groups allow
  (a group's forks make it larger). Every rank must run as many micro-batches, each a collective they all join,
  so the smaller shares are padded up to the largest with rows that train nothing (`padded`).
- `merge_experience` / `merge_results`: the per-rank results put back as one batch / one `UpdateResult`, the
  padding rows left out.

Leaves out: the sharding itself (sharded.py) and how ranks are started (tests spawn them; placement/learner_ranks.py
starts Ray actors).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from relayrl.errors import ConfigError, PlacementError
from relayrl.learner.result import UpdateResult

if TYPE_CHECKING:
    from relayrl.learner.result import MismatchByVersion
    from relayrl.learner.settings import LearnerSettings
    from relayrl.types import Experience


PADDING_GROUP = -1  # the group id of a rank's padding rows (a real batch numbers its groups from 0)


def join_learner_group(
    rank: int, world: int, address: str, port: int, timeout_s: float, cpu_collectives: bool = False
) -> None:
    """Rendezvous at tcp://address:port within `timeout_s`; the group's collectives time out after as long.
    `cpu_collectives` (learner.offload=params on GPU): gloo beside NCCL (`cpu:gloo,cuda:nccl`), for the
    collectives FSDP2 runs on offloaded CPU shards (gradient clipping's norm, full_tensor gathers), which NCCL
    alone refuses."""
    if dist.is_initialized():  # one group per process, reused by every learner built in it
        if (dist.get_rank(), dist.get_world_size()) != (rank, world):
            raise PlacementError(f"this process is already rank {dist.get_rank()} of {dist.get_world_size()}")
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_cuda_index())
        backend = "cpu:gloo,cuda:nccl" if cpu_collectives else backend
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://{address}:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    except (RuntimeError, dist.DistStoreError) as err:
        raise PlacementError(
            f"learner rank {rank} of {world} could not join the learner group at {address}:{port} "
            f"within {timeout_s:.0f} s: {err}"
        ) from err
    from relayrl.sync.group import check_backends

    store = dist.distributed_c10d._get_default_store()
    check_backends(store, rank, world, backend, "the learner group (its ranks)")


def local_cuda_index() -> int:
    """This process's CUDA device: Ray shows an actor only the GPUs it was assigned (CUDA_VISIBLE_DEVICES), so
    under Ray it is the first of those; ranks started another way say theirs with LOCAL_RANK (torchrun, spawned
    ranks), else 0. Never a rank modulo a device count: two ranks on one GPU is an NCCL error to surface."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def leave_learner_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def group_device() -> torch.device:
    """The device the learner group's collectives take tensors on: this process's GPU under NCCL, else the CPU.
    Every tensor relayrl hands the group (scalars and counts included) is made there: NCCL refuses CPU tensors."""
    if dist.is_initialized() and "nccl" in str(dist.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """`dist.all_reduce` on the learner group, refusing a tensor that is not on the group's device."""
    if tensor.device != (device := group_device()):
        raise PlacementError(
            f"a tensor on {tensor.device} was handed to the learner group, whose collectives take tensors on {device}"
        )
    dist.all_reduce(tensor, op=op)
    return tensor


def all_reduce_sum(value: float) -> float:
    """Sum of `value` over the learner ranks (fp64 so token counts stay exact)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return float(value)
    return float(all_reduce(torch.tensor([float(value)], dtype=torch.float64, device=group_device()))[0])


def rank_settings(settings: LearnerSettings, world: int) -> LearnerSettings:
    """The settings one rank trains with: its share of each step's prompts and of each mini-batch, so that the
    optimizer steps per training step (and the schedule's length) are the same at every W."""
    ranks = "placement.learner_ranks"
    if settings.rollout.prompts_per_step % world:
        raise ConfigError(
            f"rollout.prompts_per_step={settings.rollout.prompts_per_step} must divide by {ranks}={world} "
            "(each rank trains as many whole groups; only a step's forks make the ranks' rows differ)"
        )
    if settings.mini_batch % world:
        raise ConfigError(f"train.mini_batch={settings.mini_batch} must divide by {ranks}={world}")
    if world == 1:
        return settings
    rollout = settings.rollout.model_copy(update={"prompts_per_step": settings.rollout.prompts_per_step // world})
    train = settings.train.model_copy(update={"mini_batch": settings.mini_batch // world})
    return replace(settings, rollout=rollout, train=train, mini_batch=settings.mini_batch // world)


def share_bounds(exp: Experience, world: int) -> list[tuple[int, int]]:
    """[start, end) rows of each rank: a contiguous run of whole groups, at least one, in batch order; the largest
    share as small as whole groups allow (groups differ in size when trajectories fork)."""
    rows = len(exp)
    starts = torch.ones(rows, dtype=torch.bool)
    starts[1:] = exp.group_ids[1:] != exp.group_ids[:-1]
    group_starts = torch.nonzero(starts).flatten().tolist()
    if len(group_starts) < world:
        raise PlacementError(
            f"placement.learner_ranks={world} needs at least {world} groups in a step, this one has "
            f"{len(group_starts)}: each rank trains whole groups"
        )
    sizes = [end - start for start, end in zip(group_starts, group_starts[1:] + [rows])]
    cuts = [group_starts[g] for g in balanced_cuts(sizes, world)] + [rows]
    return list(zip(cuts[:-1], cuts[1:]))


def balanced_cuts(sizes: list[int], world: int) -> list[int]:
    """The first group of each rank (indices into `sizes`, the groups' rows in batch order): the smallest cap on a
    rank's rows that `_fill` meets with `world` ranks, found by bisection."""
    low, high = max(sizes), sum(sizes)
    while low < high:
        cap = (low + high) // 2
        if len(_fill(sizes, world, cap)) <= world:
            high = cap
        else:
            low = cap + 1
    return _fill(sizes, world, low)


def _fill(sizes: list[int], world: int, cap: int) -> list[int]:
    """Left to right, a rank takes groups while its rows stay within `cap`, and ends early where every rank left
    must take one of the groups left; more than `world` starts: `cap` is too small."""
    starts, load = [0], 0
    for group, size in enumerate(sizes):
        if load and (load + size > cap or len(sizes) - group == world - len(starts)):
            starts.append(group)
            load = 0
        load += size
    return starts


def split_by_groups(exp: Experience, world: int) -> list[Experience]:
    """Each rank's share (`share_bounds`), padded to the largest one's rows (`padded`): every micro-batch is a
    collective that every rank joins, so every rank runs as many."""
    bounds = share_bounds(exp, world)
    most = max(end - start for start, end in bounds)
    return [padded(exp.select(torch.arange(start, end)), most) for start, end in bounds]


def padded(part: Experience, rows: int) -> Experience:
    """`part` followed by padding rows up to `rows`: copies of its shortest row that train nothing (no loss tokens,
    advantage 0), in a group of their own (PADDING_GROUP), so they add nothing to the loss, its normaliser, the
    gradients or the token-weighted metrics; only to `learner/positions` (they are computed)."""
    missing = rows - len(part)
    if missing == 0:
        return part
    shortest = int(part.attention_mask.sum(dim=1).argmin())
    out = part.select(torch.cat([torch.arange(len(part)), torch.full((missing,), shortest)]))
    out.loss_mask[len(part) :] = 0.0
    out.group_ids[len(part) :] = PADDING_GROUP
    if out.advantages is not None:
        out.advantages[len(part) :] = 0.0
    if out.forks is not None:
        out.forks[len(part) :] = False
    return out


def real_rows(part: Experience) -> int:
    """The rows of a rank's share that are the batch's (its padding rows come after them)."""
    return int((part.group_ids != PADDING_GROUP).sum())


PREPARED = ("old_logprobs", "ref_logprobs", "values", "reward_penalty")  # what `prepare` fills in on each rank


def merge_experience(whole: Experience, parts: list[Experience]) -> Experience:
    """`whole` with the per-token fields the ranks filled in, padded back to its width, rows in rank order (each
    rank's padding rows left out)."""
    for name in PREPARED:
        pieces = [getattr(part, name) for part in parts]
        if any(piece is None for piece in pieces):
            continue
        full = torch.zeros_like(whole.loss_mask)
        row = 0
        for piece, part in zip(pieces, parts):
            rows = real_rows(part)
            full[row : row + rows, : piece.shape[1]] = piece[:rows]
            row += rows
        setattr(whole, name, full)
    return whole


def sample_rows_of(parts: list[Experience], sample_rows: int) -> list[int]:
    """How many of each rank's first rows are among the batch's first `sample_rows` (the rows the step logs):
    the log-probs each rank sends back, so that joined in rank order they are exactly those rows'."""
    counts, start = [], 0
    for part in parts:
        rows = real_rows(part)
        counts.append(max(0, min(rows, sample_rows - start)))
        start += rows
    return counts


SUMMED = ("loss/", "learner/positions")  # each rank's loss is its share of the global sum
FROM_RANK_0 = ("lr", "actor/grad_norm", "actor/kl_coef", "stale/mean", "stale/max")


def merge_results(results: list[UpdateResult], tokens: list[float]) -> UpdateResult:
    """One result from the ranks': the metrics merged (`merge_stats`), the gaps by version added up, the logged
    rows' log-probs joined in rank order (each rank's first rows: the batch's order)."""
    rows = [row for result in results for row in result.sample_logprobs or []]
    any_rows = any(result.sample_logprobs is not None for result in results)
    mismatch = merge_mismatch([result.mismatch for result in results])
    return UpdateResult(
        merge_stats([result.metrics for result in results], tokens), mismatch, rows if any_rows else None
    )


def merge_stats(stats: list[dict[str, float]], tokens: list[float]) -> dict[str, float]:
    """One metrics dict from the ranks': losses and counts add up, maxima take the max, values every rank
    shares (lr, the global grad norm, the KL coefficient) come from rank 0, the rest are token-weighted means."""
    total = max(sum(tokens), 1.0)
    out = {}
    for name, first in stats[0].items():
        values = [s[name] for s in stats]
        if name.startswith(SUMMED):
            out[name] = float(sum(values))
        elif name in FROM_RANK_0:
            out[name] = first
        elif name.endswith("_max"):
            out[name] = max(values)
        else:
            out[name] = sum(v * t for v, t in zip(values, tokens)) / total
    return out


def merge_mismatch(parts: list[MismatchByVersion]) -> MismatchByVersion:
    """The ranks' gaps by version as one: sums and token counts add up, maxima take the max."""
    merged: MismatchByVersion = {}
    for part in parts:
        for version, (gap_sum, gap_max, n) in part.items():
            s, m, c = merged.get(version, (0.0, 0.0, 0))
            merged[version] = (s + gap_sum, max(m, gap_max), c + n)
    return merged
