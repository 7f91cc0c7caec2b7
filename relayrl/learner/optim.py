"""AdamW and the learning-rate schedule (linear warmup, then constant or cosine to a floor)."""

from __future__ import annotations

import math

import torch


def build_optimizer(model: torch.nn.Module, lr: float, weight_decay: float, betas: tuple[float, float]):
    params = [p for p in model.parameters() if p.requires_grad]
    # foreach: one multi-tensor kernel per op instead of a Python loop over parameters (torch picks it on GPU
    # only; on CPU the loop costs ~3 ms a step for a small model's ~30 tensors)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas, foreach=True)


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
