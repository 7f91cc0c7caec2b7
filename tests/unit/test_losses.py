"""Aggregation modes, PPO clip-higher / dual-clip, GSPO and the entropy bonus, worked out by hand."""

import math

import pytest
import torch

from relayrl.algorithms.losses import (
    AGGREGATIONS,
    POLICY_LOSSES,
    aggregate,
    entropy_bonus,
    gspo_loss,
    kl_penalty,
    mini_batch_normaliser,
    ppo_clip_loss,
)
from tests.reference import entropy_from_logits

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


# ------------------------------------------------------------------------------------------ aggregation
def test_token_mean_by_hand():
    assert aggregate(VALUES, MASK, "token_mean").item() == pytest.approx((1 + 2 + 4) / 3)


def test_seq_mean_token_mean_by_hand():
    # sequence means 1.5 and 4, then their mean
    assert aggregate(VALUES, MASK, "seq_mean_token_mean").item() == pytest.approx(((1 + 2) / 2 + 4 / 1) / 2)


def test_seq_mean_token_sum_norm_by_hand():
    # Dr. GRPO: sequence sums 3 and 4, each / max_tokens = 4, then the mean over 2 sequences
    value = aggregate(VALUES, MASK, "seq_mean_token_sum_norm", max_tokens=4)
    assert value.item() == pytest.approx(((1 + 2) / 4 + 4 / 4) / 2)
    assert mini_batch_normaliser(MASK, "seq_mean_token_sum_norm", max_tokens=4) == 2 * 4


def test_normaliser_by_hand_per_mode():
    assert mini_batch_normaliser(MASK, "token_mean") == 3
    assert mini_batch_normaliser(MASK, "seq_mean_token_mean") == 2
    # an explicit normaliser replaces the divisor: sums 7 / 10; per-sequence means 1.5 + 4 = 5.5 / 10
    assert aggregate(VALUES, MASK, "token_mean", normaliser=10).item() == pytest.approx(0.7)
    assert aggregate(VALUES, MASK, "seq_mean_token_mean", normaliser=10).item() == pytest.approx(0.55)


def test_unknown_mode_and_missing_max_tokens_are_errors():
    with pytest.raises(ValueError, match="token_mean, seq_mean_token_mean, seq_mean_token_sum_norm"):
        aggregate(VALUES, MASK, "seq_mean")
    with pytest.raises(ValueError, match="max_tokens"):
        aggregate(VALUES, MASK, "seq_mean_token_sum_norm")


def _uneven_batch():
    torch.manual_seed(0)
    lengths = torch.tensor([1, 5, 2, 4])  # uneven response lengths, T = 5
    mask = (torch.arange(5)[None, :] < lengths[:, None]).float()
    return torch.randn(4, 5, requires_grad=True), mask


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_micro_batches_of_1_and_3_reproduce_the_mini_batch_value_and_gradient(mode):
    values, mask = _uneven_batch()
    full = aggregate(values, mask, mode, max_tokens=6)
    (full_grad,) = torch.autograd.grad(full, values)
    normaliser = mini_batch_normaliser(mask, mode, max_tokens=6)  # computed once, on the whole mini-batch
    split = sum(aggregate(values[part], mask[part], mode, normaliser) for part in (slice(0, 1), slice(1, 4)))
    (split_grad,) = torch.autograd.grad(split, values)
    assert split.item() == pytest.approx(full.item(), abs=1e-6)
    assert torch.allclose(split_grad, full_grad, atol=1e-7)


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_padding_changes_no_mode(mode):
    values, mask = _uneven_batch()
    padded_values = torch.cat([values.detach(), torch.full((4, 3), 100.0)], dim=1)  # garbage under the padding
    padded_mask = torch.cat([mask, torch.zeros(4, 3)], dim=1)
    assert aggregate(padded_values, padded_mask, mode, max_tokens=6).item() == pytest.approx(
        aggregate(values.detach(), mask, mode, max_tokens=6).item(), abs=1e-6
    )


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_a_fully_masked_row_counts_as_absent(mode):
    values, mask = _uneven_batch()
    with_empty = torch.cat([mask, torch.zeros(1, 5)])
    assert aggregate(torch.cat([values, torch.ones(1, 5)]), with_empty, mode, max_tokens=6).item() == pytest.approx(
        aggregate(values, mask, mode, max_tokens=6).item(), abs=1e-6
    )


def test_empty_batch_aggregates_to_zero():
    assert aggregate(VALUES, torch.zeros(2, 3), "seq_mean_token_mean").item() == 0.0


# ------------------------------------------------------------------------------------------ PPO clip
def test_clip_higher_asymmetric_bounds_by_hand():
    logp = torch.log(torch.tensor([[1.25, 0.75]])).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0]])
    loss, metrics = ppo_clip_loss(logp, torch.zeros(1, 2), adv, torch.ones(1, 2), eps_low=0.2, eps_high=0.28)
    # 1.25 < 1 + 0.28: not clipped for A > 0 -> -1.25; 0.75 < 1 - 0.2 -> clipped to 0.8 for A < 0 -> +0.8
    assert loss.item() == pytest.approx((-1.25 + 0.8) / 2, abs=1e-6)
    assert metrics["clip_tokens"].item() == 1
    loss.backward()
    # d(-ratio * A)/dlogp = -ratio * A = -1.25 on the unclipped token, over 2 tokens; the clipped one is 0
    assert logp.grad[0].tolist() == pytest.approx([-1.25 / 2, 0.0], abs=1e-6)
    # the symmetric clip_eps=0.2 clips the first token to 1.2; eps_high overrides only the upper side
    symmetric, _ = ppo_clip_loss(logp, torch.zeros(1, 2), adv, torch.ones(1, 2), clip_eps=0.2)
    assert symmetric.item() == pytest.approx((-1.2 + 0.8) / 2, abs=1e-6)
    override, _ = ppo_clip_loss(logp, torch.zeros(1, 2), adv, torch.ones(1, 2), clip_eps=0.2, eps_high=0.28)
    assert override.item() == pytest.approx(loss.item())


def test_dual_clip_by_hand():
    # tokens (ratio, A): (5, -2) dual-clipped, (2, -2) below the bound, (5, +1) ordinary clip
    logp = torch.log(torch.tensor([[5.0, 2.0, 5.0]])).requires_grad_(True)
    adv = torch.tensor([[-2.0, -2.0, 1.0]])
    loss, metrics = ppo_clip_loss(logp, torch.zeros(1, 3), adv, torch.ones(1, 3), clip_eps=0.2, dual_clip_c=3.0)
    # token 1: -min(5*-2, 1.2*-2) = 10, capped at c*|A| = 3*2 = 6; token 2: -min(-4, -2.4) = 4 < 6;
    # token 3: -min(5, 1.2) = -1.2
    assert loss.item() == pytest.approx((6 + 4 - 1.2) / 3, abs=1e-6)
    assert metrics["dual_clip_tokens"].item() == 1
    assert metrics["clip_tokens"].item() == 1  # only token 3 hits the ordinary clip
    assert metrics["ratio_sum"].item() == pytest.approx(12.0)
    assert metrics["ratio_max"].item() == pytest.approx(5.0)
    loss.backward()
    # the cap is a constant: gradient 0 on token 1; token 2: -ratio * A = 4, over 3 tokens; token 3 clipped
    assert logp.grad[0].tolist() == pytest.approx([0.0, 4 / 3, 0.0], abs=1e-6)
    without, off_metrics = ppo_clip_loss(logp, torch.zeros(1, 3), adv, torch.ones(1, 3), clip_eps=0.2)
    assert without.item() == pytest.approx((10 + 4 - 1.2) / 3, abs=1e-5)
    assert off_metrics["dual_clip_tokens"].item() == 0


def test_bad_clip_settings_are_errors():
    args = (torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))
    with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
        ppo_clip_loss(*args, clip_eps=0.2, dual_clip_c=1.0)
    with pytest.raises(ValueError, match="clip_eps"):
        ppo_clip_loss(*args)


# ------------------------------------------------------------------------------------------ GSPO
def test_gspo_by_hand():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # sequence 1: mean log-ratio (0.3 + 0 + 0) / 3 = 0.1; sequence 2: (-0.04 + 0) / 2 = -0.02 (5.0 is padding)
    logp = torch.tensor([[0.3, 0.0, 0.0], [-0.04, 0.0, 5.0]], requires_grad=True)
    adv = torch.tensor([[1.0], [-1.0]]).expand(2, 3)
    loss, metrics = gspo_loss(logp, torch.zeros(2, 3), adv, mask, clip_eps=0.05, agg="seq_mean_token_mean")
    s1, s2 = math.exp(0.1), math.exp(-0.02)
    # s1 = 1.105 > 1.05 with A > 0: every token of sequence 1 clipped to 1.05 -> loss -1.05 per token;
    # s2 = 0.980 is inside [0.95, 1.05]: -(s2 * -1) = s2 per token. Mean over tokens, then over sequences.
    assert loss.item() == pytest.approx((-1.05 + s2) / 2, abs=1e-6)
    assert metrics["clip_tokens"].item() == 3
    assert metrics["ratio_sum"].item() == pytest.approx(3 * s1 + 2 * s2, abs=1e-5)  # each token carries s_i
    assert metrics["ratio_max"].item() == pytest.approx(s1, abs=1e-6)
    loss.backward()
    # token-level form: d s_i,t / d logp_t = s_i; sequence 2's tokens: s2 / (2 tokens * 2 sequences)
    assert logp.grad.flatten().tolist() == pytest.approx([0.0, 0.0, 0.0, s2 / 4, s2 / 4, 0.0], abs=1e-6)


def test_gspo_gradient_matches_the_naive_sequence_level_objective():
    torch.manual_seed(1)
    mask = (torch.arange(6)[None, :] < torch.tensor([6, 3, 4, 1, 5])[:, None]).float()
    old = torch.randn(5, 6)
    logp = (old + 0.1 * torch.randn(5, 6)).requires_grad_(True)
    adv = torch.randn(5, 1).expand(5, 6)
    eps_low, eps_high = 0.02, 0.03  # some sequences clip, some do not
    loss, metrics = gspo_loss(logp, old, adv, mask, eps_low=eps_low, eps_high=eps_high, agg="seq_mean_token_mean")
    (grad,) = torch.autograd.grad(loss, logp)
    # naive: s_i = exp(mean_t (logp - old)) differentiated directly, objective averaged over sequences
    s = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))
    a = adv[:, 0]
    naive = -torch.minimum(s * a, torch.clamp(s, 1 - eps_low, 1 + eps_high) * a).mean()
    (naive_grad,) = torch.autograd.grad(naive, logp)
    assert 0 < metrics["clip_tokens"].item() < mask.sum().item()
    assert loss.item() == pytest.approx(naive.item(), abs=1e-6)
    assert torch.allclose(grad, naive_grad, atol=1e-6)


def test_policy_loss_registry_shares_one_signature():
    logp, mask = torch.zeros(2, 3), torch.ones(2, 3)
    for name, loss_fn in POLICY_LOSSES.items():
        loss, metrics = loss_fn(
            logp, logp, torch.ones(2, 3), mask, 0.2, "token_mean", None, eps_low=0.2, eps_high=0.28, dual_clip_c=3.0
        )
        assert loss.item() == pytest.approx(-1.0), name  # ratio 1, A = 1
        assert set(metrics) == {"clip_tokens", "dual_clip_tokens", "ratio_sum", "ratio_max"}


# ------------------------------------------------------------------------------------------ regularisers
def test_entropy_bonus_by_hand():
    entropy = torch.tensor([[1.0, 2.0, 3.0]])
    loss, metrics = entropy_bonus(entropy, torch.tensor([[1.0, 1.0, 0.0]]), coef=0.1)
    assert loss.item() == pytest.approx(-0.1 * (1 + 2) / 2)  # minus: lowering the loss raises the entropy
    assert metrics["entropy_sum"].item() == pytest.approx(3.0)


def test_entropy_of_truncated_logits_is_finite():
    logits = torch.tensor([[[0.0, 0.0, float("-inf")]]], requires_grad=True)
    entropy = entropy_from_logits(logits)
    assert entropy.item() == pytest.approx(math.log(2))  # two equally likely tokens
    entropy.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_kl_penalty_names_the_unknown_estimator():
    with pytest.raises(ValueError, match="k1, k2, k3, abs"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), "k4")
