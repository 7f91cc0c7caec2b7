"""Per-token log-probs and entropies from the final hidden states, without full-vocabulary logits.

The learner needs, for each response token, log pi(token) and the entropy of pi at that position, where pi is
the distribution the engine sampled from (temperature, top-k/top-p). Going through `model(...).logits` builds
[rows, positions, V] logits for every position, prompt and padding included, and the fp32 log-softmax over
them: for a 150k vocabulary and 8 x 1024 positions that is 5 GB before the backward keeps its copy.

Here the head runs only at the positions that predict a response token, `chunk` positions at a time: each
chunk's logits live only while its log-probs and entropies are taken, and the backward recomputes them
(activation checkpointing), so the peak is one chunk's [chunk, V] logits whatever the sequence length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from relayrl.algorithms.losses import entropy_from_logits
from relayrl.algorithms.sampling_mask import truncate_logits
from relayrl.learner.batching import token_logprobs


def head_stats(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    targets: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    chunk: int,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-prob of each target, entropy at its position): hidden [N, H], targets [N] -> [N], [N] (fp32).
    `chunk` <= 0 or N <= chunk: one piece, no recomputation. The entropy carries gradients only when
    `entropy_grad` (an entropy bonus); otherwise it is a metric and nothing of it is kept for the backward."""
    args = (head.weight, head.bias, temperature, top_k, top_p, entropy_grad)
    if chunk <= 0 or hidden.shape[0] <= chunk:
        return _stats(hidden, targets, *args)
    pieces = [
        checkpoint(_stats, h, t, *args, use_reentrant=False) if torch.is_grad_enabled() else _stats(h, t, *args)
        for h, t in zip(hidden.split(chunk), targets.split(chunk))
    ]
    return torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces])


def _stats(hidden, targets, weight, bias, temperature, top_k, top_p, entropy_grad):
    return logits_stats(F.linear(hidden, weight, bias), targets, temperature, top_k, top_p, entropy_grad)


def logits_stats(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, top_k: int, top_p: float, entropy_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same from logits [N, V] the model computed itself (train.logits_chunk=0)."""
    logits = truncate_logits(logits.float() / temperature, top_k, top_p)
    logp = token_logprobs(logits, targets)
    if entropy_grad:
        return logp, entropy_from_logits(logits)
    with torch.no_grad():
        return logp, entropy_from_logits(logits.detach())


def output_head(model) -> torch.nn.Module:
    """The model's LM head (a Linear over the final hidden states)."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"{type(model).__name__}'s output head is a {type(head).__name__}, not a Linear")
    return head
