"""Policy losses, the entropy bonus, and the one aggregation function they all share.

Per-token tensors are [B, T] with a 0/1 `mask`. A loss returns (scalar loss, metrics); metrics are *sums*
over unmasked tokens (and a max), so micro-batching leaves them unchanged and the caller divides once per
step. Leaves out: advantages (advantages.py), KL estimators (kl.py), off-policy correction of the engine's
sampling (correction.py), the top-k/top-p sampling mask (sampling_mask.py).

Normaliser contract (the same for every mode): `aggregate` returns numerator / normaliser, where the
numerator is a plain sum over the rows of a batch. A caller that splits a mini-batch into micro-batches
passes every micro-batch `normaliser=mini_batch_normaliser(mini_mask, mode, max_tokens)`, computed once
from the mask of the whole mini-batch (the mask actually passed to the loss, after any rollout-correction
masking); the micro-batch values (and gradients) then add up exactly to the mini-batch's. A row with no
unmasked token counts as absent in every mode.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from relayrl.algorithms.kl import kl_estimator

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def _check_mode(mode: str) -> None:
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {', '.join(AGGREGATIONS)}")


def mini_batch_normaliser(mask: torch.Tensor, mode: str, max_tokens: int | None = None) -> float:
    """The divisor `aggregate` uses for `mask` [B, T] taken as one whole mini-batch.

    token_mean: unmasked tokens. seq_mean_token_mean: sequences (rows with >= 1 unmasked token).
    seq_mean_token_sum_norm: those sequences * max_tokens (the constant of Dr. GRPO, e.g. rollout.max_tokens).
    """
    _check_mode(mode)
    if mode == "token_mean":
        return float(mask.sum())
    sequences = float((mask.sum(-1) > 0).sum())
    if mode == "seq_mean_token_mean":
        return sequences
    if max_tokens is None:
        raise ValueError(
            "loss aggregation 'seq_mean_token_sum_norm' divides by a constant: pass max_tokens "
            "(e.g. rollout.max_tokens) or normaliser=mini_batch_normaliser(mask, mode, max_tokens)"
        )
    return sequences * max_tokens


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: str, normaliser: float | None = None, max_tokens: int | None = None
) -> torch.Tensor:
    """Reduce per-token values [B, T] to a scalar.

    token_mean:              sum of unmasked values / token count.
    seq_mean_token_mean:     mean over each sequence's tokens, then mean over sequences.
    seq_mean_token_sum_norm: each sequence's token *sum* / max_tokens, then mean over sequences (Dr. GRPO:
                             no length normalisation, so long and short responses weigh per token alike).
    `normaliser` replaces the divisor (see the module docstring); by default the batch is its own mini-batch.
    """
    _check_mode(mode)
    mask = mask.to(values.dtype)
    if mode == "seq_mean_token_mean":
        numerator = ((values * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum()  # sum of per-sequence means
    else:
        numerator = (values * mask).sum()
    if normaliser is None:
        normaliser = mini_batch_normaliser(mask, mode, max_tokens)
    return numerator / max(float(normaliser), 1.0)  # an empty batch gives 0, not nan


# ---------------------------------------------------------------------------------------------- policy losses
def _clip_range(clip_eps: float | None, eps_low: float | None, eps_high: float | None) -> tuple[float, float]:
    """(eps_low, eps_high); each defaults to the symmetric clip_eps. Clip-higher (DAPO): eps_high > eps_low."""
    low = clip_eps if eps_low is None else eps_low
    high = clip_eps if eps_high is None else eps_high
    if low is None or high is None:
        raise ValueError("policy loss needs clip_eps, or both eps_low and eps_high")
    if not 0 <= low < 1 or high < 0:
        raise ValueError(f"clip range needs 0 <= eps_low < 1 and eps_high >= 0, got eps_low={low}, eps_high={high}")
    return low, high


def _clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None,
    agg: str,
    normaliser: float | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-min(r A, clip(r, 1-eps_low, 1+eps_high) A), optionally dual-clipped; ratio, advantages, mask: [B, T]."""
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    dual = torch.zeros_like(mask, dtype=torch.bool)
    if dual_clip_c is not None:
        if dual_clip_c <= 1:
            raise ValueError(f"dual_clip_c must be > 1 (it bounds the loss at c*|A| for A < 0), got {dual_clip_c}")
        # Ye et al. 2020: for A < 0 a huge ratio would make the loss unbounded; cap it at c*|A| (no gradient there)
        bound = -dual_clip_c * advantages
        dual = (advantages < 0) & (per_token > bound)
        per_token = torch.where(dual, bound, per_token)
    loss = aggregate(per_token, mask, agg, normaliser)
    with torch.no_grad():
        on = mask.bool()
        metrics = {
            "clip_tokens": ((clipped < unclipped) & on).sum().float(),
            "dual_clip_tokens": (dual & on).sum().float(),
            "ratio_sum": (ratio * mask).sum(),
            "ratio_max": ratio.masked_fill(~on, 0.0).max(),  # 0 when nothing is unmasked
        }
    return loss, metrics


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float | None = None,
    agg: str = "token_mean",
    normaliser: float | None = None,
    *,
    eps_low: float | None = None,
    eps_high: float | None = None,
    dual_clip_c: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with per-token ratio exp(logp - old): -min(r A, clip(r, 1-eps_low, 1+eps_high) A).

    logprobs, old_logprobs, advantages, mask: [B, T]. `clip_eps` is the symmetric range; `eps_low`/`eps_high`
    override either side (DAPO clip-higher). `dual_clip_c` (> 1, None = off) caps the loss of A < 0 tokens at
    c*|A|. Metrics: clip_tokens, dual_clip_tokens, ratio_sum (sums over unmasked tokens), ratio_max.
    """
    low, high = _clip_range(clip_eps, eps_low, eps_high)
    ratio = torch.exp(logprobs - old_logprobs)
    return _clipped_surrogate(ratio, advantages, mask, low, high, dual_clip_c, agg, normaliser)


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float | None = None,
    agg: str = "token_mean",
    normaliser: float | None = None,
    *,
    eps_low: float | None = None,
    eps_high: float | None = None,
    dual_clip_c: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (Zheng et al. 2025): the PPO surrogate on one ratio per sequence, clipped per sequence.

    s_i = exp(mean over sequence i's unmasked tokens of (logp - old)), the geometric-mean token ratio. In the
    "GSPO-token" form every token carries s_i,t = sg[s_i] * pi_t / sg[pi_t]: the value is s_i for all of
    the sequence's tokens, and d s_i,t / d logp_t = s_i, so with agg="seq_mean_token_mean" (the paper's
    1/G sum_i) the gradient equals the sequence-level objective's, while per-token advantages stay possible.
    The paper's range is small and asymmetric (eps_low=3e-4, eps_high=4e-4). Same arguments and metrics as
    ppo_clip_loss (metrics count tokens, each carrying its sequence's ratio).
    """
    low, high = _clip_range(clip_eps, eps_low, eps_high)
    token_mask = mask.to(logprobs.dtype)
    tokens = token_mask.sum(-1).clamp(min=1)  # [B]
    seq_log_ratio = ((logprobs - old_logprobs) * token_mask).sum(-1) / tokens  # [B]
    ratio = torch.exp(seq_log_ratio.detach())[:, None] * torch.exp(logprobs - logprobs.detach())  # [B, T]
    return _clipped_surrogate(ratio, advantages, mask, low, high, dual_clip_c, agg, normaliser)


PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
POLICY_LOSSES: dict[str, PolicyLoss] = {"ppo_clip": ppo_clip_loss, "gspo": gspo_loss}


# ---------------------------------------------------------------------------------------------- regularisers
def entropy_bonus(
    entropy: torch.Tensor, mask: torch.Tensor, coef: float, agg: str = "token_mean", normaliser: float | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-coef * aggregated entropy [B, T] (adding it to the loss raises entropy); metrics: entropy_sum."""
    loss = -coef * aggregate(entropy, mask, agg, normaliser)
    return loss, {"entropy_sum": (entropy * mask).sum().detach()}


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    estimator: str,
    agg: str = "token_mean",
    normaliser: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(aggregated KL to the reference, sum of per-token KL over unmasked tokens). See kl.py for estimators."""
    per_token = kl_estimator(estimator)(logprobs, ref_logprobs)
    return aggregate(per_token, mask, agg, normaliser), (per_token * mask).sum().detach()
