"""Rollout correction: reweight or drop tokens where the inference engine sampled off the learner's policy.

The engine (vLLM, bf16 kernels, its own batching) samples from a behaviour policy mu that differs from the
learner's pi_old on the same weights. With rho = pi_old / mu per token (from `old_logprobs` and
`behaviour_logprobs`, both [B, T]) these functions return either importance weights to multiply into the
per-token loss (truncated IS, "TIS") or a new 0/1 mask that drops outlying tokens or sequences ("MIS").
Weights are 0 outside `mask`; outputs are detached. Metrics are over unmasked tokens (a sequence-level
ratio counts once per token of its sequence): ratio_mean, ratio_max, and truncated_frac or masked_frac.
Leaves out: which correction a run uses and where the weights enter the loss (the learner's choice).
"""

from __future__ import annotations

import torch


def _log_ratio(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log(pi_old / mu) per token [B, T]; exactly 0 on masked tokens, whatever padding holds there."""
    return torch.where(mask.bool(), old_logprobs.detach() - behaviour_logprobs.detach(), 0.0)


def _sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, geometric: bool) -> torch.Tensor:
    """Per-sequence log-ratio broadcast to its tokens [B, T]: the sum, or the mean (log of the geometric mean)."""
    total = log_ratio.sum(-1, keepdim=True)
    if geometric:
        total = total / mask.sum(-1, keepdim=True).clamp(min=1)
    return total.expand_as(log_ratio)


def _metrics(ratio: torch.Tensor, on: torch.Tensor, hit: torch.Tensor, name: str) -> dict[str, torch.Tensor]:
    tokens = on.sum().clamp(min=1)
    return {
        "ratio_mean": (ratio * on).sum() / tokens,
        "ratio_max": ratio.masked_fill(~on, 0.0).max(),  # 0 when nothing is unmasked
        name: (hit & on).sum() / tokens,
    }


def _check_threshold(threshold: float) -> None:
    if threshold <= 0:
        raise ValueError(f"truncated importance sampling needs threshold > 0, got {threshold}")


def _check_bounds(lower: float, upper: float) -> None:
    if not 0 <= lower < upper:
        raise ValueError(f"ratio masking needs 0 <= lower < upper, got lower={lower}, upper={upper}")


def token_tis(
    old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor, threshold: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-level truncated IS: weight = min(exp(old - behaviour), threshold) per token [B, T]."""
    _check_threshold(threshold)
    on = mask.bool()
    ratio = torch.exp(_log_ratio(old_logprobs, behaviour_logprobs, mask))
    weights = ratio.clamp(max=threshold) * on
    return weights, _metrics(ratio, on, ratio > threshold, "truncated_frac")


def sequence_tis(
    old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor, threshold: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Sequence-level truncated IS: weight = min(exp(sum over the sequence of (old - behaviour)), threshold),
    the same weight on every token of the sequence [B, T]."""
    _check_threshold(threshold)
    on = mask.bool()
    ratio = torch.exp(_sequence_log_ratio(_log_ratio(old_logprobs, behaviour_logprobs, mask), mask, False))
    weights = ratio.clamp(max=threshold) * on
    return weights, _metrics(ratio, on, ratio > threshold, "truncated_frac")


def token_ratio_mask(
    old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor, lower: float, upper: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-level masking: drop tokens whose ratio exp(old - behaviour) is outside [lower, upper]. -> new mask."""
    _check_bounds(lower, upper)
    on = mask.bool()
    ratio = torch.exp(_log_ratio(old_logprobs, behaviour_logprobs, mask))
    outside = (ratio < lower) | (ratio > upper)
    return mask * ~outside, _metrics(ratio, on, outside, "masked_frac")


def sequence_ratio_mask(
    old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor, lower: float, upper: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Sequence-level masking: drop whole sequences whose geometric-mean ratio
    exp(mean over the sequence of (old - behaviour)) is outside [lower, upper]. -> new mask [B, T]."""
    _check_bounds(lower, upper)
    on = mask.bool()
    ratio = torch.exp(_sequence_log_ratio(_log_ratio(old_logprobs, behaviour_logprobs, mask), mask, True))
    outside = (ratio < lower) | (ratio > upper)
    return mask * ~outside, _metrics(ratio, on, outside, "masked_frac")
