"""Per-token log-probs and entropies from the final hidden states, without full-vocabulary logits.

The learner needs, for each response token, log pi(token) and the entropy of pi at that position, where pi is
the distribution the engine sampled from (temperature, top-k/top-p); both come from one log-softmax over the
vocabulary (`logits_stats`), never a second pass for the entropy. Going through `model(...).logits` builds
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

from relayrl.algorithms.sampling_mask import truncate_logits


def head_stats(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    targets: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    chunk: int,
    entropy_grad: bool,
    suppressed: tuple[int, ...] = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-prob of each target, entropy at its position): hidden [N, H], targets [N] -> [N], [N] (fp32).
    `chunk` <= 0 or N <= chunk: one piece, no recomputation. The entropy carries gradients only when
    `entropy_grad` (an entropy bonus); otherwise it is a metric and nothing of it is kept for the backward."""
    args = (head.weight, head.bias, temperature, top_k, top_p, entropy_grad, suppressed)
    if chunk <= 0 or hidden.shape[0] <= chunk:
        return _stats(hidden, targets, *args)
    pieces = [
        checkpoint(_stats, h, t, *args, use_reentrant=False) if torch.is_grad_enabled() else _stats(h, t, *args)
        for h, t in zip(hidden.split(chunk), targets.split(chunk))
    ]
    return torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces])


def _stats(hidden, targets, weight, bias, temperature, top_k, top_p, entropy_grad, suppressed):
    logits = F.linear(hidden, weight, bias)
    return logits_stats(logits, targets, temperature, top_k, top_p, entropy_grad, suppressed)


def logits_stats(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    entropy_grad: bool,
    suppressed: tuple[int, ...] = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same from logits [N, V] the model computed itself (train.logits_chunk=0). `suppressed`: token ids the
    engines never sample (a vision-language model's image placeholders, relayrl/data/vision.py), out of the
    distribution here as there.

    One log-softmax over the vocabulary serves both: the log-prob is read from it and the entropy summed
    over it (an entropy bonus differentiates through the same tensor). Its output is what the backward
    keeps, one [N, V] tensor, as a logsumexp would keep its input."""
    logits = logits.float()
    never = torch.tensor(suppressed, dtype=torch.long, device=logits.device) if suppressed else None
    if never is not None:
        logits = logits.index_fill(-1, never, float("-inf"))
    logp_all = torch.log_softmax(truncate_logits(logits / temperature, top_k, top_p), dim=-1)  # [N, V]
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [N]
    if never is not None:  # an image token shown in an observation (never sampled, never trained): 0, not -inf, so that
        logp = torch.where(torch.isin(targets, never), 0.0, logp)  # exp(logp - old) is not -inf - -inf = nan
    if entropy_grad:
        return logp, entropy_of(logp_all)
    with torch.no_grad():
        return logp, entropy_of(logp_all.detach())


def entropy_of(logp_all: torch.Tensor) -> torch.Tensor:
    """Entropy of each row of log-probabilities: [N, V] -> [N]. -inf entries (a top-k/top-p mask) add 0."""
    # 0 * -inf is nan: clamping -inf to the most negative float makes those terms 0 (and their gradient 0)
    return -(logp_all.exp() * logp_all.clamp(min=torch.finfo(logp_all.dtype).min)).sum(-1)


def output_head(model) -> torch.nn.Module:
    """The model's LM head (a Linear over the final hidden states)."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"{type(model).__name__}'s output head is a {type(head).__name__}, not a Linear")
    return head
