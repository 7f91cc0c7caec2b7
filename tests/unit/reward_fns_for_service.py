"""Reward functions the service tests load by spec (`tests.unit.reward_fns_for_service:<name>`) in workers."""

import os
import time


def length(prompts, completions, **columns):
    return [float(len(c)) for c in completions]


def hang_on_marker(prompts, completions, **columns):
    """Hangs (sleeps an hour) on any completion containing HANG; raises on RAISE; NaN on NAN."""
    if any("HANG" in c for c in completions):
        time.sleep(3600)
    if any("RAISE" in c for c in completions):
        raise ValueError("boom")
    return [float("nan") if "NAN" in c else 1.0 for c in completions]


def die_on_marker(prompts, completions, **columns):
    if any("DIE" in c for c in completions):
        os._exit(3)
    return [1.0] * len(completions)


def needs_column(prompts, completions, **columns):
    if "answer" not in columns:
        from relayrl.errors import RewardError

        raise RewardError("needs_column needs an 'answer' column")
    return [1.0] * len(completions)


def parts(prompts, completions, **columns):
    return [{"correct": 1.0, "format": 0.5} for _ in completions]


def trl_raise_on_marker(completions, **kwargs):
    """TRL's convention (by keyword; None = does not apply): raises on RAISE, skips SKIP, else 1."""
    if any("RAISE" in c for c in completions):
        raise ValueError("boom in a TRL-style reward")
    return [None if "SKIP" in c else 1.0 for c in completions]
