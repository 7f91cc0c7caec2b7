"""Rewards: the batched protocol, built-in verifiers, user functions, and the guard that checks outputs."""

from relayrl.rewards.base import RewardFn, load_reward, score_rollouts

__all__ = ["RewardFn", "load_reward", "score_rollouts"]
