"""Advantage estimators, one function each, registered by name. Pure functions on tensors."""

from __future__ import annotations

from typing import Callable

import torch

ADVANTAGES: dict[str, Callable[..., torch.Tensor]] = {}


def register(name: str):
    def wrap(fn):
        ADVANTAGES[name] = fn
        return fn
    return wrap


@register("grpo")
def grpo(rewards: torch.Tensor, group_ids: torch.Tensor, std_normalize: bool = True,
         eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantage per response: (r - mean_group) / (std_group + eps), or r - mean_group.

    rewards [B], group_ids [B] -> advantages [B]. The std is the unbiased sample std of the group
    (as in DeepSeekMath); a group whose rewards are all equal gets advantage exactly 0.
    """
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    sums = torch.zeros(len(counts), dtype=rewards.dtype).index_add_(0, inverse, rewards)
    means = sums / counts
    centred = rewards - means[inverse]
    if not std_normalize:
        return centred
    squares = torch.zeros(len(counts), dtype=rewards.dtype).index_add_(0, inverse, centred**2)
    std = torch.sqrt(squares / (counts - 1).clamp(min=1))[inverse]
    return torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))


def degenerate_group_fraction(rewards: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Fraction of groups whose rewards are all equal (they carry no GRPO signal)."""
    groups = torch.unique(group_ids)
    flat = sum(bool((rewards[group_ids == g] == rewards[group_ids == g][0]).all()) for g in groups)
    return flat / len(groups)
