"""AdamW and the learning-rate schedule (linear warmup, then constant or cosine to a floor)."""

from __future__ import annotations

import math

import torch


def build_optimizer(model: torch.nn.Module, lr: float, weight_decay: float, betas: tuple[float, float]):
    params = [p for p in model.parameters() if p.requires_grad]
    kernel = adamw_kernel(params[0].device.type if params else "cpu")
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas, **kernel)


def adamw_kernel(device_type: str) -> dict[str, bool]:
    """AdamW's implementation for parameters on `device_type`. On a GPU the fused kernel: one launch per step for
    every parameter (torchtitan's default; DTensor shards included), where foreach takes several multi-tensor
    launches per op. On CPU foreach: one multi-tensor kernel per op instead of a Python loop over parameters
    (torch's default there is the loop, ~3 ms a step for a small model's ~30 tensors). Both compute AdamW's same
    update (tests/unit/test_optim.py)."""
    return {"fused": True} if device_type == "cuda" else {"foreach": True}


def lr_factor(step: int, total: int, warmup: int, schedule: str, min_ratio: float) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based) of `total`."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer, total: int, warmup: int, schedule: str, min_ratio: float):
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total, warmup, schedule, min_ratio)
    )
