"""Per-request sampling seeds, shared by every engine and by the schedules that split a batch into requests.

Every sample draws from a random stream of its own, fixed by what it is (the step's seed and the prompt's place in
the batch, or for a multi-turn turn its trajectory and turn), never by which other requests share its batch or
call: so the same run draws the same samples whatever the timing (vLLM seeds each request; the HF engine gives
each row a generator of its own)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relayrl.types import Sampling


def request_seed(seed: int | None, index: int, n: int) -> int | None:
    """The seed of request `index`. vLLM seeds the j-th of a request's n samples with seed + j, so request
    seeds are spaced n apart: every sample of the batch gets its own random stream. (One seed shared by
    all requests would draw the same sample for every prompt.)"""
    return None if seed is None else seed * 1_000_003 + index * n


def prompt_seeds(sampling: Sampling, count: int) -> list[int | None]:
    """The request seed of each of a call's `count` prompts (sample j of a prompt draws with seed + j): the
    caller's own (`sampling.seeds`), else spaced from the batch seed by the prompt's index in the whole batch."""
    if sampling.seeds is not None:
        if len(sampling.seeds) != count:
            raise ValueError(f"{len(sampling.seeds)} request seeds for {count} prompts")
        return list(sampling.seeds)
    return [request_seed(sampling.seed, sampling.request_offset + i, sampling.n) for i in range(count)]


def share_of(sampling: Sampling, offset: int, count: int) -> Sampling:
    """The sampling of the prompts [offset, offset + count) of a call split over replicas: the same seeds as
    the whole call would give them."""
    seeds = None if sampling.seeds is None else sampling.seeds[offset : offset + count]
    return dataclasses.replace(sampling, request_offset=sampling.request_offset + offset, seeds=seeds)


def turn_seed(seed: int | None, trajectory: int, turn: int) -> int | None:
    """The seed of a multi-turn trajectory's `turn`-th turn: fixed by which trajectory and which turn, never by
    when the turn reached the engine (environment steps return in any order), so the same run draws the
    same turns. Turns are spaced 4099 apart per trajectory, more than any trajectory's turn count."""
    return None if seed is None else seed * 1_000_003 + trajectory * 4099 + turn
