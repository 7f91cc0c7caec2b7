"""`learner.offload=between_phases`: the learner's parameters, gradients and optimizer state leave the device while
the engine generates, and come back for the update (colocated time-sharing, relayrl/placement/time_sharing.py).

Everything the learner holds on a GPU moves: the policy (and its frozen reference), the critic, every optimizer
state tensor that lives on the device (AdamW's moments; its `step` counters stay on the CPU, as torch keeps them),
and the gradients, which are None between steps already. The cache is emptied after a move out, so the engine
can use what was freed. On a one-process CPU learner there is nothing to move (the config resolves the setting to
`none`).

A colocated learner that keeps its states on the GPU (sharded ranks without an offload, or before the first one)
still hands the caching allocator's free blocks back after building its models and after each update
(`return_cached_blocks`): otherwise the allocator keeps the load's or the update's peak reserved, and the engine
beside it finds that much less free when it starts (vLLM's free-memory check) and when it wakes (cuMem maps).
verl empties the cache before the engine resumes likewise (verl/utils/memory_utils.py).

FSDP2 ranks (relayrl/learner/sharded.py) move the same way, each its own shards: `Module.to` on a sharded model
moves the local shard of every DTensor parameter, and FSDP2's `_apply` re-points its own references (the padded
shard it all-gathers from); AdamW's moments are DTensors of the same shards (verl moves FSDP2 models and their
optimizers so: verl/utils/fsdp_utils.py). Every tensor is copied into fresh memory on `device` (a move between a
GPU and the host is a copy anyway): on a CPU, where the tests make the round trip, the states then truly leave
their storage and come back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.distributed.tensor import DTensor

if TYPE_CHECKING:
    from relayrl.learner.role import LearnerRole


def local_bytes(tensor: torch.Tensor) -> int:
    """The bytes this process holds of `tensor`: a DTensor's local shard, else the tensor."""
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def held_bytes(models: list[torch.nn.Module | None], optimizers: list[torch.optim.Optimizer | None]) -> int:
    """What `move_states` moves: the models' parameters and the optimizers' tensor state, this process's share."""
    held = sum(local_bytes(p) for model in filter(None, models) for p in model.parameters())
    for optimizer in filter(None, optimizers):
        for state in optimizer.state.values():
            held += sum(local_bytes(v) for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return held


def move_states(models: list[torch.nn.Module | None], optimizers: list[torch.optim.Optimizer | None], device) -> int:
    """Move `models` and the device-resident state of `optimizers` to `device`; returns the bytes moved."""
    moved = held_bytes(models, optimizers)
    for model in filter(None, models):
        model._apply(lambda t: t.to(device, copy=True))  # Module.to's path, with a copy
    for optimizer in filter(None, optimizers):
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:  # not the scalar step counters
                    state[key] = value.to(device, non_blocking=True, copy=True)
    if torch.device(device).type == "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return moved


def return_cached_blocks(device: str) -> None:
    """The CUDA caching allocator's unused blocks back to the driver (`torch.cuda.empty_cache`), on a CUDA device
    only (a CPU learner has no cache to return)."""
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def learner_states(learner: LearnerRole) -> tuple[list, list]:
    """(models, optimizers) the learner holds: the policy, its reference and the critic, and their optimizers."""
    policy, critic = learner.policy, learner.critic
    return [policy.model, policy.reference, critic and critic.model], [policy.optimizer, critic and critic.optimizer]


def move_learner(learner: LearnerRole, device: str) -> int:
    """Every state of `learner` to `device` (whole in one process, this rank's shards on a sharded rank)."""
    return move_states(*learner_states(learner), device)
