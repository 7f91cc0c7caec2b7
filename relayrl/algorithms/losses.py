"""Policy losses and the one aggregation function. Per-token tensors are [B, T] with a 0/1 `mask`."""

from __future__ import annotations

import torch

from relayrl.algorithms.kl import KL_ESTIMATORS


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, normaliser: float | None = None) -> torch.Tensor:
    """Reduce per-token values [B, T] to a scalar.

    token_mean: sum over all unmasked tokens / their count. `normaliser` overrides the count so that a
    micro-batch can be divided by the token count of its whole mini-batch: gradient accumulation then
    reproduces the full mini-batch loss exactly.
    """
    if mode != "token_mean":
        raise ValueError(f"unknown loss aggregation {mode!r}")
    count = mask.sum() if normaliser is None else normaliser
    return (values * mask).sum() / max(float(count), 1.0)


def ppo_clip_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, clip_eps: float, agg: str = "token_mean",
                  normaliser: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate: -min(ratio * A, clip(ratio, 1-eps, 1+eps) * A), ratio = exp(logp - old).

    logprobs, old_logprobs, advantages, mask: [B, T]. Returns (loss, metrics) with metric *sums* over
    unmasked tokens (the caller divides once per step) so micro-batching does not change them.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    loss = aggregate(per_token, mask, agg, normaliser)
    with torch.no_grad():
        on = mask.bool()
        metrics = {
            "clip_tokens": ((clipped < unclipped) & on).sum().float(),
            "ratio_sum": (ratio * mask).sum(),
            "ratio_max": ratio[on].max() if on.any() else torch.tensor(1.0),
        }
    return loss, metrics


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, estimator: str,
               agg: str = "token_mean", normaliser: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(aggregated KL to the reference, sum of per-token KL over unmasked tokens)."""
    per_token = KL_ESTIMATORS[estimator](logprobs, ref_logprobs)
    return aggregate(per_token, mask, agg, normaliser), (per_token * mask).sum().detach()


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of softmax(logits): [B, T, V] -> [B, T]."""
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)
