"""The PPO critic: the clipped value loss by hand, a zero-initialised head, and learning the returns."""

import pytest
import torch

from relayrl.config import load_config
from relayrl.learner.critic import Critic, clipped_value_loss
from relayrl.placement.sections import learner_settings
from tests.unit.test_learner import _experience


def test_clipped_value_loss_by_hand():
    values, old = torch.tensor([[1.0, 3.0]]), torch.zeros(1, 2)
    returns, mask = torch.tensor([[2.0, 0.0]]), torch.ones(1, 2)
    loss, clipped = clipped_value_loss(values, old, returns, mask, clip=0.5, normaliser=2)
    # token 1: (1-2)^2 = 1 vs clipped (0.5-2)^2 = 2.25 -> 0.5*2.25; token 2: (3-0)^2 = 9 vs (0.5-0)^2 -> 0.5*9
    assert loss.item() == pytest.approx((1.125 + 4.5) / 2)
    assert clipped.item() == 1


def test_critic_starts_at_zero_and_regresses_on_the_returns(random_model_dir):
    config = load_config(
        None,
        [
            f"model.path={random_model_dir}",
            "rollout.n=4",
            "rollout.prompts_per_step=4",
            "algorithm.advantage=gae",
            "critic.lr=1e-2",
            "critic.value_clip=10",
        ],
    )
    critic = Critic(learner_settings(config), "cpu")
    exp = _experience()
    exp.values = critic.values(exp)
    assert torch.equal(exp.values, torch.zeros_like(exp.loss_mask))
    exp.returns = exp.rewards[:, None] * exp.loss_mask  # regress every response token on its reward
    first = critic.update(exp)["critic/value_loss"]
    for _ in range(15):
        exp.values = critic.values(exp)
        last = critic.update(exp)["critic/value_loss"]
    assert last < 0.5 * first
    assert critic.values(exp)[exp.loss_mask.bool()].abs().sum() > 0
