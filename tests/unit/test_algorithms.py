"""GRPO advantages, the PPO clipped loss, k3 KL, aggregation and the lr schedule, checked by hand."""

import math

import pytest
import torch

from relayrl.algorithms.advantages import degenerate_group_fraction, grpo, make_inputs
from relayrl.algorithms.kl import k3
from relayrl.algorithms.losses import aggregate, kl_penalty, ppo_clip_loss
from relayrl.learner.optim import lr_factor
from tests.reference import token_logprobs


def test_degenerate_group_has_exactly_zero_advantage_and_gradient():
    rewards = torch.tensor([0.86, 0.86, 0.86])  # in float32, (3 x 0.86) / 3 is one rounding step off 0.86
    adv, _ = grpo(make_inputs(rewards, torch.ones(3, 4), torch.zeros(3, dtype=torch.long)))
    assert torch.equal(adv, torch.zeros(3, 4))
    logits = torch.randn(3, 4, 5, requires_grad=True)
    logp = token_logprobs(logits, torch.randint(0, 5, (3, 4)))
    loss, _ = ppo_clip_loss(logp, logp.detach(), adv, torch.ones(3, 4), clip_eps=0.2)
    loss.backward()
    assert torch.count_nonzero(logits.grad) == 0
    assert degenerate_group_fraction(torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1])) == 0.5


def test_ppo_clip_loss_by_hand():
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1]])).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    loss, metrics = ppo_clip_loss(logp, old, adv, torch.ones(1, 3), clip_eps=0.2)
    # token 1: min(1.5, 1.2)*1 -> -1.2 (clipped); token 2: min(-0.5, -0.8) -> +0.8 (clipped); token 3: -2.2
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 2.2) / 3, abs=1e-6)
    assert metrics["clip_tokens"].item() == 2
    assert metrics["ratio_sum"].item() == pytest.approx(3.1, abs=1e-6)
    assert metrics["ratio_max"].item() == pytest.approx(1.5, abs=1e-6)
    loss.backward()
    # clipped tokens carry no gradient; d(-ratio*A)/dlogp = -ratio*A, divided by 3 tokens
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.0, -2.2 / 3], abs=1e-6)


def test_loss_ignores_masked_tokens():
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))
    loss, metrics = ppo_clip_loss(
        logp, torch.zeros(1, 3), torch.tensor([[1.0, -1.0, 2.0]]), torch.tensor([[1.0, 1.0, 0.0]]), clip_eps=0.2
    )
    assert loss.item() == pytest.approx((-1.2 + 0.8) / 2, abs=1e-6)
    assert metrics["ratio_max"].item() == pytest.approx(1.5, abs=1e-6)


def test_k3_by_hand_and_nonnegative():
    logp, ref = torch.log(torch.tensor([0.5, 0.25])), torch.log(torch.tensor([0.25, 0.25]))
    # r = ref - logp: ln(0.5) and 0 -> exp(r) - r - 1 = 0.5 + ln 2 - 1, and 0
    assert k3(logp, ref).tolist() == pytest.approx([0.5 + math.log(2) - 1, 0.0], abs=1e-6)
    assert (k3(torch.randn(100), torch.randn(100)) >= 0).all()
    value, total = kl_penalty(logp[None], ref[None], torch.ones(1, 2), "k3")
    assert value.item() == pytest.approx((0.5 + math.log(2) - 1) / 2, abs=1e-6)
    assert total.item() == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)


def test_token_mean_aggregation_with_a_mini_batch_normaliser():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate(values, mask, "token_mean").item() == pytest.approx(7 / 3)
    # two halves divided by the whole batch's token count add up to the whole
    halves = aggregate(values[:1], mask[:1], "token_mean", 3) + aggregate(values[1:], mask[1:], "token_mean", 3)
    assert halves.item() == pytest.approx(7 / 3)
    with pytest.raises(ValueError):
        aggregate(values, mask, "seq_mean")


def test_token_logprobs_matches_log_softmax():
    logits, targets = torch.randn(2, 4, 7), torch.randint(0, 7, (2, 4))
    expected = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, targets), expected, atol=1e-6)


def test_lr_schedule():
    assert [lr_factor(s, 10, 2, "constant", 0.0) for s in (0, 1, 2, 9)] == [0.5, 1.0, 1.0, 1.0]
    assert lr_factor(2, 10, 2, "cosine", 0.1) == pytest.approx(1.0)
    assert lr_factor(6, 10, 2, "cosine", 0.1) == pytest.approx(0.55)
    assert lr_factor(10, 10, 2, "cosine", 0.1) == pytest.approx(0.1)
