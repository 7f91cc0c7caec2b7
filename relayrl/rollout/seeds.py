"""Per-request sampling seeds, shared by every engine and by the schedules that split a batch into requests."""

from __future__ import annotations


def request_seed(seed: int | None, index: int, n: int) -> int | None:
    """The seed of request `index`. vLLM seeds the j-th of a request's n samples with seed + j, so request
    seeds are spaced n apart: every sample of the batch gets its own random stream. (One seed shared by
    all requests would draw the same sample for every prompt.)"""
    return None if seed is None else seed * 1_000_003 + index * n


def turn_seed(seed: int | None, trajectory: int, turn: int) -> int | None:
    """The seed of a multi-turn trajectory's `turn`-th turn: fixed by which trajectory and which turn, never by
    when the turn reached the engine (environment steps return in any order), so the same run draws the
    same turns. Turns are spaced 4099 apart per trajectory, more than any trajectory's turn count."""
    return None if seed is None else seed * 1_000_003 + trajectory * 4099 + turn
