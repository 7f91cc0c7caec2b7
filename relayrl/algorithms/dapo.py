"""DAPO's data-side changes (Yu et al. 2025, "DAPO: An Open-Source LLM RL System at Scale"), as pure functions.

Owns: dynamic sampling (drop groups whose rewards are all equal, collect informative groups over several
generation rounds until a batch is full), overlong filtering (no gradient on truncated responses) and the
soft overlong punishment (a length penalty added to the reward).

`DynamicSampling` is the collector the sync schedule picks at construction when dynamic sampling is on: it
runs the rounds through a function it is given, which generates and scores one round.

Deliberately left out: Clip-Higher (the asymmetric clip range) and token-level loss aggregation, which are
loss settings in losses.py; generating and scoring, which the schedules do (relayrl/schedules/modes.py).
Nothing here does I/O or touches a model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from relayrl.types import Rollout, Score

Group = tuple[list[Rollout], list[Score]]


def split_groups(rollouts: list[Rollout], scores: list[Score]) -> list[Group]:
    """Prompt-major rollouts and their aligned scores -> one (rollouts, scores) pair per prompt, in order.

    A group starts at `group_index` 0 and counts up by one; anything else means the batch is not
    prompt-major (or scores are misaligned), which is an error, not something to guess around.
    """
    if len(rollouts) != len(scores):
        raise ValueError(f"{len(rollouts)} rollouts but {len(scores)} scores: they must be aligned one to one")
    groups: list[Group] = []
    for row, (rollout, score) in enumerate(zip(rollouts, scores)):
        if rollout.group_index == 0:
            groups.append(([], []))
        elif not groups or rollout.group_index != len(groups[-1][0]) or rollout.prompt.id != groups[-1][0][0].prompt.id:
            raise ValueError(
                f"row {row} ({rollout.sample_id}) does not continue the group before it: "
                "rollouts must be prompt-major with group_index 0, 1, ..., n-1"
            )
        groups[-1][0].append(rollout)
        groups[-1][1].append(score)
    return groups


def informative(group_scores: list[Score], eps: float = 0.0) -> bool:
    """True when the group's rewards differ by more than eps (max - min > eps).

    A flat group (all correct or all wrong) has zero variance, so every GRPO advantage in it is 0 and it
    only dilutes the batch. Filter on the task reward *before* adding `soft_overlong_penalty`, or a group
    that differs only in length counts as informative (verl's DAPO recipe filters on accuracy).
    """
    rewards = [score.reward for score in group_scores]
    return max(rewards) - min(rewards) > eps


class GroupCollector:
    """Dynamic sampling: keep the informative groups of up to `max_rounds` generation rounds, until
    `target_groups` of them are collected.

    The caller's loop:

        collector = GroupCollector(prompts_per_step, max_rounds)
        while not (collector.full or collector.exhausted):
            collector.add(*generate_and_score(sampler.next(prompts_per_step)))
        rollouts, scores = collector.take()

    The paper samples until the batch is full, however long it takes; we cap the rounds instead. When
    they run out first, `take` returns the fewer groups collected (possibly none) and `dynamic/filled`
    is 0: train on the smaller batch, or skip the update when it is empty. Flat groups are never used to
    pad the batch, since they carry no signal.
    """

    def __init__(self, target_groups: int, max_rounds: int):
        if target_groups < 1 or max_rounds < 1:
            raise ValueError(
                f"GroupCollector needs target_groups >= 1 and max_rounds >= 1, "
                f"got target_groups={target_groups}, max_rounds={max_rounds}"
            )
        self.target_groups, self.max_rounds = target_groups, max_rounds
        self.groups: list[Group] = []  # informative groups, in the order they were generated
        self.rounds = self.dropped = 0

    def add(self, rollouts: list[Rollout], scores: list[Score]) -> None:
        """One generation round: keep its informative groups, count the flat ones as dropped."""
        if self.exhausted:
            raise RuntimeError(f"GroupCollector.add called after max_rounds={self.max_rounds} rounds")
        self.rounds += 1
        for group in split_groups(rollouts, scores):
            if informative(group[1]):
                self.groups.append(group)
            else:
                self.dropped += 1

    @property
    def full(self) -> bool:
        return len(self.groups) >= self.target_groups

    @property
    def exhausted(self) -> bool:
        return self.rounds >= self.max_rounds

    def take(self) -> tuple[list[Rollout], list[Score]]:
        """The first `target_groups` groups collected (all of them if not full), flattened prompt-major.

        Groups beyond the target (the last round overshot) are discarded.
        """
        if not (self.full or self.exhausted):
            raise RuntimeError(
                f"GroupCollector.take called with {len(self.groups)}/{self.target_groups} "
                f"groups after {self.rounds}/{self.max_rounds} rounds: keep generating"
            )
        picked = self.groups[: self.target_groups]
        return [r for rs, _ in picked for r in rs], [s for _, ss in picked for s in ss]

    def metrics(self) -> dict[str, float]:
        """kept_groups counts every informative group collected, including any beyond the target."""
        return {
            "dynamic/rounds": float(self.rounds),
            "dynamic/kept_groups": float(len(self.groups)),
            "dynamic/dropped_groups": float(self.dropped),
            "dynamic/filled": float(self.full),
        }


class DynamicSampling:
    """Collect a step's batch over generation rounds: `collect(generate_round)` calls `generate_round(0)`,
    `generate_round(1)`, ... (each returns one round's prompt-major rollouts and scores) until
    `target_groups` informative groups are kept or `max_rounds` have run. When no round had an informative
    group, the last round's batch is trained as it is (a zero-signal step)."""

    def __init__(self, target_groups: int, max_rounds: int):
        self.target_groups, self.max_rounds = target_groups, max_rounds

    def collect(self, generate_round: Callable[[int], Group]) -> tuple[list[Rollout], list[Score], dict[str, float]]:
        collector = GroupCollector(self.target_groups, self.max_rounds)
        while not (collector.full or collector.exhausted):
            rollouts, scores = generate_round(collector.rounds)
            collector.add(rollouts, scores)
        kept = collector.take()
        rollouts, scores = kept if kept[0] else (rollouts, scores)
        return rollouts, scores, collector.metrics()


def add_overlong_penalty(rollouts: list[Rollout], scores: list[Score], max_tokens: int, buffer: int) -> list[Score]:
    """The scores with `soft_overlong_penalty` added to each reward (and kept as the `overlong` component).
    Apply it after any dynamic-sampling filter, which judges the task reward alone."""
    penalty = soft_overlong_penalty([len(r.response_ids) for r in rollouts], max_tokens, buffer)
    return [
        Score(s.reward + float(p), {**s.components, "overlong": float(p)}, s.error) for s, p in zip(scores, penalty)
    ]


def overlong_mask(rollouts: list[Rollout]) -> torch.Tensor:
    """[B] 1.0 for responses that finished, 0.0 for those cut at max_tokens (finish_reason "length").

    The caller multiplies each row of the loss mask by it: a truncated response was not judged on a
    finished answer, so its reward is noise, and DAPO gives it no gradient instead. It still counts in
    its group's reward statistics for the other responses.
    """
    return torch.tensor([0.0 if r.finish_reason == "length" else 1.0 for r in rollouts])


def soft_overlong_penalty(lengths: torch.Tensor | list[int], max_tokens: int, buffer: int) -> torch.Tensor:
    """DAPO's soft overlong punishment, [B] response lengths -> [B] penalty to ADD to the rewards.

    With L_max = max_tokens and L_cache = buffer, a response of |y| tokens gets
        0                                   if |y| <= L_max - L_cache
        (L_max - L_cache - |y|) / L_cache   if L_max - L_cache < |y| <= L_max   (0 down to -1)
        -1                                  if |y| > L_max
    Our engines stop at their max_tokens, so the -1 branch only applies when the max_tokens passed here
    is smaller than the engine's.
    """
    if not 0 < buffer <= max_tokens:
        raise ValueError(
            f"soft_overlong_penalty needs 0 < buffer <= max_tokens, got buffer={buffer}, max_tokens={max_tokens}"
        )
    lengths = torch.as_tensor(lengths, dtype=torch.float32)  # [B]
    free = max_tokens - buffer  # longest response with no penalty
    ramp = (free - lengths) / buffer  # [B]
    return torch.where(
        lengths <= free, torch.zeros_like(lengths), torch.where(lengths <= max_tokens, ramp, -torch.ones_like(lengths))
    )
