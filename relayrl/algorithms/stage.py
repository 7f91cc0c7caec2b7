"""The advantage stage of a step: the estimator bound to its settings, the learner's KL penalty when it is in
the reward, DAPO's overlong filter, and a teacher's distillation signal (alone, added to the advantages, or in the
rewards), composed once from the config (`advantage_stage`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from relayrl.algorithms.advantages import ADVANTAGES, TOKEN_LEVEL, AdvantageInputs, make_inputs, turn_reward_tensor
from relayrl.algorithms.dapo import overlong_mask
from relayrl.algorithms.distill import distill_advantages, distill_reward_penalty
from relayrl.types import filled

if TYPE_CHECKING:
    from relayrl.config import AlgorithmConfig
    from relayrl.types import Experience, Rollout


Stage = Callable[["Experience", list["Rollout"]], "Experience"]  # (exp, rollouts) -> exp with advantages


def advantage_stage(algorithm: AlgorithmConfig, teacher: bool = False) -> Stage:
    """`stage(exp, rollouts) -> exp` with advantages and returns, as the `algorithm` section chose; `teacher`: the
    batch carries the teacher's log-probs (`teacher.path`), whose signal `algorithm.distill` places."""
    distill = algorithm.distill
    if algorithm.advantage == "distill":
        return functools.partial(distill_only, distill.coef, algorithm.dapo.overlong_filter)
    estimator = functools.partial(ADVANTAGES[algorithm.advantage], **advantage_knobs(algorithm))
    stage = functools.partial(
        estimate_advantages, estimator, algorithm.dapo.overlong_filter, per_turn=algorithm.advantage in TOKEN_LEVEL
    )
    if not teacher:
        return stage
    return functools.partial(with_distill_reward if distill.mode == "reward" else with_distill, stage, distill.coef)


def distill_only(coef: float, overlong_filter: bool, exp: Experience, rollouts: list[Rollout]) -> Experience:
    """algorithm.advantage=distill: coef x (log teacher - log student) per policy token, no reward advantage (a
    KL-to-the-reference penalty in the reward, if any, is added per token as well); no returns."""
    old, teacher = filled(exp.old_logprobs, "old_logprobs"), filled(exp.teacher_logprobs, "teacher_logprobs")
    exp.advantages = coef * distill_advantages(old, teacher, exp.loss_mask)
    if exp.reward_penalty is not None:
        exp.advantages = exp.advantages + exp.reward_penalty * exp.loss_mask
    exp.returns = None
    if overlong_filter:
        exp.loss_mask = exp.loss_mask * overlong_mask(rollouts)[:, None]
    return exp


def with_distill(stage: Stage, coef: float, exp: Experience, rollouts: list[Rollout]) -> Experience:
    """algorithm.distill.mode=advantage beside a reward: the reward estimator's advantages + coef x the
    distillation advantage per policy token."""
    old, teacher = filled(exp.old_logprobs, "old_logprobs"), filled(exp.teacher_logprobs, "teacher_logprobs")
    signal = distill_advantages(old, teacher, exp.loss_mask)  # before the overlong filter changes the mask
    exp = stage(exp, rollouts)
    exp.advantages = filled(exp.advantages, "advantages") + coef * signal
    return exp


def with_distill_reward(stage: Stage, coef: float, exp: Experience, rollouts: list[Rollout]) -> Experience:
    """algorithm.distill.mode=reward: -coef x (log student - log teacher) per token joins the token rewards (beside
    a reference KL penalty there, if any), and the reward estimator makes the advantages."""
    old, teacher = filled(exp.old_logprobs, "old_logprobs"), filled(exp.teacher_logprobs, "teacher_logprobs")
    penalty = distill_reward_penalty(old, teacher, exp.loss_mask, coef)
    exp.reward_penalty = penalty if exp.reward_penalty is None else exp.reward_penalty + penalty
    return stage(exp, rollouts)


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
