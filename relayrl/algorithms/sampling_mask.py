"""The top-k / top-p mask of the sampler, applied to the learner's logits so it scores the distribution the
engine actually sampled from.

With top-k or top-p on, vLLM samples from a truncated, renormalised distribution (and, in
`processed_logprobs` mode, returns its log-probs as the behaviour log-probs). `truncate_logits` sets the
logits vLLM drops to -inf, so `log_softmax` of the result is that distribution. Leaves out: temperature
(the caller divides the logits by it first, as vLLM does before truncating), min_p, penalties.

The convention, read from vllm/v1/sample/ops/topk_topp_sampler.py (vLLM 0.32: `Sampler.sample` applies
temperature, then min_p, then `apply_top_k_top_p`; its PyTorch reference `apply_top_k_top_p_pytorch`;
on GPU the Triton kernel in topk_topp_triton.py states the same contract):
  * top-k first, by logit: a token is kept iff its logit >= the k-th largest logit (the PyTorch path
    keeps every token tied with the k-th; the Triton kernel keeps exactly k, the lowest indices first).
    top_k <= 0 or >= vocab size is off (SamplingParams -1/0 mean "all").
  * then top-p, on the distribution *renormalised over the top-k survivors*: sort ascending, cumulative
    sum of the softmax, drop tokens with cumsum <= 1 - p (1 - p in float32); the largest token is always
    kept. Equivalently: in descending order, a token is kept iff the probability mass strictly before it
    is < p -- the smallest prefix whose mass reaches p. [0.5, 0.3, 0.1, 0.1] with p = 0.7 keeps 0.5 and 0.3
    (the mass before the first 0.1 is 0.8 >= 0.7). top_p >= 1 is off.
We threshold at the logit of the last kept token, so tokens *exactly tied* with it are all kept, where
vLLM's sort order may drop some (ties have measure zero for real logits); the float32 arithmetic is the
PyTorch path's, so a boundary token whose cumsum lies within rounding of 1 - p may differ from the Triton
kernel's pivot search.
"""

from __future__ import annotations

import torch

ROW_CHUNK_ELEMENTS = 1 << 24  # the sort runs over row chunks of at most this many logits, bounding its temporaries


def _kept_floor(rows: torch.Tensor, top_k: int, top_p: torch.Tensor | None) -> torch.Tensor:
    """Smallest kept logit per row: rows [n, V] (float32) -> [n, 1]."""
    # [n, k] with top_k (only the survivors are needed), else [n, V]
    ascending = rows.topk(top_k, dim=-1).values.flip(-1) if top_k else rows.sort(dim=-1).values
    if top_p is None:
        return ascending[:, :1]
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)  # renormalised over the top-k survivors
    dropped = cumulative <= 1 - top_p
    dropped[:, -1] = False  # at least one token
    first_kept = dropped.sum(-1, keepdim=True)  # dropped is a prefix: cumulative sums never decrease
    return ascending.gather(-1, first_kept)


@torch.no_grad()
def _kept_floors(logits: torch.Tensor, top_k: int, top_p: torch.Tensor | None) -> torch.Tensor:
    rows = logits.reshape(-1, logits.shape[-1])
    chunk = max(1, ROW_CHUNK_ELEMENTS // rows.shape[-1])
    floors = [_kept_floor(part.float(), top_k, top_p) for part in rows.split(chunk)]
    return torch.cat(floors).reshape(*logits.shape[:-1], 1)


def truncate_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Logits [..., V] (already temperature-scaled) with every token vLLM would not sample set to -inf.

    Differentiable (the kept logits pass gradients through); the input is not modified. Off
    (top_k <= 0 or >= V, and top_p >= 1) returns `logits` itself. Memory: one output tensor like `logits`
    and a bool mask, plus sort temporaries bounded by ROW_CHUNK_ELEMENTS (top-p without top-k only).
    """
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    vocab = logits.shape[-1]
    top_k = top_k if 0 < top_k < vocab else 0
    # vLLM holds p as float32 and computes 1 - p there; doing the same keeps the boundary bit-identical
    p = torch.tensor(top_p, dtype=torch.float32, device=logits.device) if top_p < 1 else None
    if not top_k and p is None:
        return logits
    floors = _kept_floors(logits, top_k, p)
    return logits.masked_fill(logits < floors, float("-inf"))
