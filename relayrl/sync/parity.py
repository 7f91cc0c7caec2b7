"""The parity probe: after a push, do the engine and the learner assign the same log-probs?"""

from __future__ import annotations


def parity_gap(learner, engine, token_ids: list[int]) -> float:
    """Largest |engine - learner| teacher-forced log-prob on one fixed sequence."""
    ours = learner.sequence_logprobs(token_ids)
    theirs = engine.prompt_logprobs(token_ids)
    return max(abs(a - b) for a, b in zip(ours, theirs))
