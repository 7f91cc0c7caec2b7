"""The advantage stage of a step: the estimator bound to its settings, the learner's KL penalty when it is in
the reward, and DAPO's overlong filter, composed once from the config (`advantage_stage`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from relayrl.algorithms.advantages import ADVANTAGES, TOKEN_LEVEL, AdvantageInputs, make_inputs, turn_reward_tensor
from relayrl.algorithms.dapo import overlong_mask
from relayrl.types import filled

if TYPE_CHECKING:
    from relayrl.config import AlgorithmConfig
    from relayrl.types import Experience, Rollout


def advantage_stage(algorithm: AlgorithmConfig) -> Callable[[Experience, list[Rollout]], Experience]:
    """`stage(exp, rollouts) -> exp` with advantages and returns, as the `algorithm` section chose."""
    estimator = functools.partial(ADVANTAGES[algorithm.advantage], **advantage_knobs(algorithm))
    return functools.partial(
        estimate_advantages, estimator, algorithm.dapo.overlong_filter, per_turn=algorithm.advantage in TOKEN_LEVEL
    )


def estimate_advantages(
    advantage_fn: Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor | None]],
    overlong_filter: bool,
    exp: Experience,
    rollouts: list[Rollout],
    per_turn: bool = False,
) -> Experience:
    """Advantages and returns from the rewards (plus the learner's per-token KL penalty when it is in the
    reward), a group's statistics over its trajectories (not their forked samples); with DAPO's overlong filter,
    truncated responses count in their group but train nothing.
    `per_turn` (token-level estimators): a multi-turn trajectory's turns' rewards sit on their turns' ends."""
    placed = None
    if per_turn:
        placed = turn_reward_tensor(rollouts, filled(exp.prompt_lengths, "prompt_lengths"), exp.loss_mask.shape[1])
    members = None if exp.forks is None else ~exp.forks  # a forked sample is not a member of its group's baseline
    inputs = make_inputs(exp.rewards, exp.loss_mask, exp.group_ids, exp.values, placed, members)
    if exp.reward_penalty is not None:
        inputs.token_rewards = inputs.token_rewards + exp.reward_penalty
    exp.advantages, exp.returns = advantage_fn(inputs)
    if overlong_filter:
        exp.loss_mask = exp.loss_mask * overlong_mask(rollouts)[:, None]
    return exp


def advantage_knobs(algo: AlgorithmConfig) -> dict:
    """The `algorithm` values each estimator takes (the others have none)."""
    return {
        "grpo": {"std_normalize": algo.std_normalize},
        "reinforce_pp": {"gamma": algo.gamma},
        "gae": {"gamma": algo.gamma, "lam": algo.lam},
    }.get(algo.advantage, {})
