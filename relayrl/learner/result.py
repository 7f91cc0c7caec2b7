"""What one learner update hands back to the step: `UpdateResult`, the same from a `LearnerRole` in this process, a
Ray actor behind its proxy, or W sharded ranks joined (relayrl/learner/process_group.py, `merge_results`).

It crosses a Ray actor boundary every step, so it holds plain Python values only (no tensors) and stays small:
the metrics, a few numbers per policy version, and the pre-update log-probs of the rows the step logs. No torch
is imported here: the driver unpickles it without loading the learner's modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# |learner - behaviour| log-prob gaps of the trained tokens, per policy version that sampled them:
# {version: (sum, max, tokens)} (relayrl/learner/policy.py, `mismatch_by_version`)
MismatchByVersion = dict[int, tuple[float, float, int]]


@dataclass(frozen=True)
class UpdateResult:
    """`metrics`: the update's statistics (loss/*, actor/*, critic/*, lr, learner/* counts), as logged.
    `mismatch`: the gaps by version, which the step splits by lag into mismatch/* and drift/*
    (relayrl/metrics/step_metrics.py); empty when the actor did not train (a critic's warm-up).
    `sample_logprobs`: the pre-update log-probs [row][target column] of the first rows the step logs to
    samples.jsonl (as many as the controller asked for), None when it asked for none."""

    metrics: dict[str, float]
    mismatch: MismatchByVersion = field(default_factory=dict)
    sample_logprobs: list[list[float]] | None = None
