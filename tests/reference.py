"""Plain reference implementations the tests check relayrl's fused or chunked paths against (not used by relayrl)."""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] without materialising the full log-softmax: [B, T, V], [B, T] -> [B, T]."""
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of softmax(logits): [B, T, V] -> [B, T]. -inf logits (a top-k/top-p mask) add 0."""
    logp = torch.log_softmax(logits, dim=-1)
    # 0 * -inf is nan: clamping -inf to the most negative float makes those terms 0 (and their gradient 0)
    return -(logp.exp() * logp.clamp(min=torch.finfo(logp.dtype).min)).sum(-1)


def trainable_count(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
