"""`learner.offload=between_phases`: the learner's parameters, gradients and optimizer state leave the device while
the engine generates, and come back for the update (colocated time-sharing, relayrl/placement/time_sharing.py).

Everything the learner holds on a GPU moves: the policy (and its frozen reference), the critic, every optimizer
state tensor that lives on the device (AdamW's moments; its `step` counters stay on the CPU, as torch keeps them),
and the gradients, which are None between steps already. The cache is emptied after a move out, so the engine
can use what was freed. On a CPU learner there is nothing to move (the config resolves the setting to `none`).
"""

from __future__ import annotations

import torch


def move_states(models: list[torch.nn.Module | None], optimizers: list[torch.optim.Optimizer | None], device) -> int:
    """Move `models` and the device-resident state of `optimizers` to `device`; returns the bytes moved."""
    moved = 0
    for model in filter(None, models):
        moved += sum(p.numel() * p.element_size() for p in model.parameters())
        model.to(device)
    for optimizer in filter(None, optimizers):
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:  # not the scalar step counters
                    moved += value.numel() * value.element_size()
                    state[key] = value.to(device, non_blocking=True)
    if torch.device(device).type == "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return moved
