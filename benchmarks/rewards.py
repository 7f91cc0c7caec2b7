"""Reward functions owned by the benchmarks (not built into relayrl).

`digit_fraction` is the dense, verifiable reward of the decode-heavy regime of `peer_trl.py` (`--regime b`):
a randomly initialised model writing 128 tokens never matches an answer exactly, so exact match is always 0
there and nothing would be learned; the share of digits in the completion moves from the first step. It has
relayrl's reward signature (as `relayrl.rewards.verifiers.exact_match`), so relayrl loads it with
`reward.fn=benchmarks/rewards.py:digit_fraction` and TRL's `GRPOTrainer` calls the same function object.
"""

from __future__ import annotations

from typing import Any


def digit_fraction(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
    """Fraction of each completion's characters that are digits 0-9 (0.0 for an empty completion)."""
    return [sum(ch in "0123456789" for ch in text) / len(text) if text else 0.0 for text in completions]
