"""The service's train-inference mismatch: the gap between the log-probs a `forward_backward`'s data carry from the
sampler (`logprobs`; importance_sampling, ppo, cispo, ... send them) and the trainer's for the same tokens, over
the tokens with a sampled log-prob (non-zero; the cookbook sends 0 for prompt tokens).

Like is compared with like: relayrl's engines report the log-probs of the distribution they sampled from (after
temperature, top-k, top-p), the trainer's `forward` answers the model's own (temperature 1, untruncated). `Samples`
remembers the settings each sequence the service sampled was drawn at (its prompt and sampled tokens, the newest
KEEP_SEQUENCES); a datum whose whole sequence (its model input and last target: the cookbook's `full_sequence`,
which a multi-turn datum shares with its last turn's sample) was sampled at other settings is scored again at them
for the gap (`SampledAt.logprobs`, the learner's own `logits_stats`: temperature, then vLLM's truncation), under
AS_SAMPLED beside the log-probs the client gets. A greedy sample (temperature 0: no distribution to score) is left
out and counted in `mismatch/left_out_data`. Data the service did not sample (off-policy, another sampler) are
compared as sent. A mean gap past MISMATCH_WARN is logged: the sampler served other weights than the trainer holds.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np
import torch

from relayrl.service.wire import Example, Sequence

log = logging.getLogger("relayrl.service")
MISMATCH_WARN = 0.1  # a mean |trainer - sampler| log-prob gap past this is logged: the sampler served other weights
KEEP_SEQUENCES = 10_000  # sampled sequences remembered (an RL step samples a few hundred)
AS_SAMPLED = "logprobs_as_sampled"  # a datum's trainer log-probs at its sample's settings (never sent back)


class SampledAt(NamedTuple):
    """The settings a sample was drawn at, as the SDK's `SamplingParams` give them."""

    temperature: float
    top_k: int  # <= 0: off
    top_p: float  # >= 1: off

    @classmethod
    def of(cls, params) -> SampledAt:
        top_k = -1 if params.top_k is None else params.top_k
        return cls(params.temperature, top_k, 1.0 if params.top_p is None else params.top_p)

    @property
    def own(self) -> bool:
        """Drawn from the model's own distribution: its log-probs are what `forward` answers."""
        return self.temperature == 1 and self.top_k <= 0 and self.top_p >= 1

    @torch.no_grad()
    def logprobs(self, logits: torch.Tensor, targets: torch.Tensor) -> np.ndarray:
        """The targets' log-probs [N] of the distribution sampled from, given the trainer's logits [N, V]."""
        from relayrl.learner.token_stats import logits_stats

        logp, _ = logits_stats(logits, targets, self.temperature, self.top_k, self.top_p, False)
        return logp.cpu().numpy().astype(np.float32)


class Samples:
    """The sequences the service sampled (the newest `keep`), each with the settings it was drawn at."""

    def __init__(self, keep: int = KEEP_SEQUENCES):
        self.keep = keep
        self.settings: dict[int, SampledAt] = {}  # hash of prompt + sampled tokens -> its settings; oldest first

    def add(self, prompt: list[int], sequences: list[Sequence], at: SampledAt) -> None:
        for seq in sequences:
            key = hash((*prompt, *seq.tokens))
            self.settings.pop(key, None)  # the newest sample of a sequence decides
            self.settings[key] = at
        for key in list(self.settings)[: max(0, len(self.settings) - self.keep)]:
            del self.settings[key]

    def sampled_at(self, example: Example) -> SampledAt | None:
        """The settings `example`'s sequence was sampled at here, or None (not sampled here)."""
        whole = (*example.tokens, int(example.inputs["target_tokens"][-1]))
        return self.settings.get(hash(whole))

    def to_score(self, example: Example) -> SampledAt | None:
        """The settings the trainer scores `example` at for the gap beside its own log-probs, or None (its own
        answer compares, or a greedy sample, left out)."""
        at = self.sampled_at(example) if "logprobs" in example.inputs else None
        return None if at is None or at.own or at.temperature == 0 else at


def mismatch_figures(model_id: str, examples: list[Example], outputs: list[dict], samples: Samples) -> dict:
    """`mismatch/logprob_abs_{mean,max}` over the data that carry the sampler's log-probs (none: no figure), each
    against the trainer's at its sample's settings, and `mismatch/left_out_data` for greedy samples; warns past
    MISMATCH_WARN."""
    gaps, left_out = [], 0
    for ex, out in zip(examples, outputs):
        if "logprobs" not in ex.inputs:
            continue
        at = samples.sampled_at(ex)
        if at is not None and at.temperature == 0:
            left_out += 1
            continue
        sampled = ex.inputs["logprobs"]
        gaps.append(np.abs(out.get(AS_SAMPLED, out["logprobs"]) - sampled)[sampled != 0])
    figures = {"mismatch/left_out_data": float(left_out)} if left_out else {}
    gaps = np.concatenate(gaps) if gaps else np.zeros(0)
    if gaps.size:
        figures["mismatch/logprob_abs_mean"] = float(gaps.mean())
        figures["mismatch/logprob_abs_max"] = float(gaps.max())
        if gaps.mean() > MISMATCH_WARN:
            log.warning(
                "%s: sampler vs trainer log-prob gap %.3f (mean over %d tokens) past %.2f: the samples came from "
                "other weights than the trainer holds",
                model_id,
                gaps.mean(),
                gaps.size,
                MISMATCH_WARN,
            )
    return figures
