"""The parity probe: after a push, do the engine and the learner assign the same log-probs?"""

from __future__ import annotations

from relayrl.rollout.protocols import EngineGroup
from relayrl.sync.base import LearnerWeights


def parity_gap(learner: LearnerWeights, engines: EngineGroup, token_ids: list[int]) -> float:
    """Largest |engine - learner| teacher-forced log-prob on one fixed sequence."""
    ours = learner.sequence_logprobs(token_ids)
    theirs = engines.prompt_logprobs(token_ids)
    return max(abs(a - b) for a, b in zip(ours, theirs))
