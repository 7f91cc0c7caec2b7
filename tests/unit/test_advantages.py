"""Advantage estimators worked out by hand on tiny batches, and the invariances every estimator keeps."""

import math

import pytest
import torch
import torch.nn.functional as F

from relayrl.algorithms.advantages import (
    ADVANTAGES,
    AdvantageInputs,
    degenerate_group_fraction,
    dr_grpo,
    gae,
    grpo,
    make_inputs,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
    sequence_rewards,
)

# Five responses to two prompts, a prompt column first and right padding after (lengths 3, 2, 1, 2, 2).
# Group 7 (rows 0, 2, 4) has rewards 3, 0, 0: mean 1, unbiased variance (2^2 + 1 + 1) / 2 = 3.
# Group 2 (rows 1, 3) is flat at 0.5.
REWARDS = torch.tensor([3.0, 0.5, 0.0, 0.5, 0.0])
GROUPS = torch.tensor([7, 2, 7, 2, 7])
MASK = torch.tensor(
    [[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]]
)
VALUES = torch.arange(20.0).reshape(5, 4) / 10


def _per_row(values):
    """One advantage per response, on each of its response tokens."""
    return torch.tensor(values)[:, None] * MASK


def test_make_inputs_puts_each_reward_on_the_last_response_token():
    inputs = make_inputs(
        torch.tensor([2.0, 3.0]), torch.tensor([[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]), torch.tensor([0, 0])
    )
    assert inputs.token_rewards.tolist() == [[0.0, 0.0, 2.0, 0.0], [3.0, 0.0, 0.0, 0.0]]
    assert sequence_rewards(inputs).tolist() == [2.0, 3.0]
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        make_inputs(torch.tensor([2.0, 3.0]), torch.tensor([[0.0, 1.0], [0.0, 0.0]]), torch.tensor([0, 0]))


def test_grpo_on_tokens_by_hand():
    adv, returns = grpo(make_inputs(REWARDS, MASK, GROUPS), eps=0.0)
    s = math.sqrt(3)  # group 7: (R - 1) / sqrt(3); group 2 is flat -> 0
    assert torch.allclose(adv, _per_row([2 / s, 0.0, -1 / s, 0.0, -1 / s]), atol=1e-6)
    assert returns is None
    adv, _ = grpo(make_inputs(REWARDS, MASK, GROUPS), std_normalize=False)
    assert torch.allclose(adv, _per_row([2.0, 0.0, -1.0, 0.0, -1.0]), atol=1e-6)


def test_grpo_advantages_by_hand():
    # the pre-registry example, one token per response
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 3.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
    adv, _ = grpo(make_inputs(rewards, torch.ones(8, 1), groups), std_normalize=True, eps=0.0)
    # group 0: mean .5, unbiased std sqrt(1/3); group 1: flat; group 2: mean 1.5, std sqrt(4.5)
    s0, s2 = math.sqrt(1 / 3), math.sqrt(4.5)
    expected = [0.5 / s0, -0.5 / s0, 0.5 / s0, -0.5 / s0, 0.0, 0.0, -1.5 / s2, 1.5 / s2]
    assert adv[:, 0].tolist() == pytest.approx(expected, abs=1e-6)


def test_grpo_without_std_is_group_centred():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 3.0])
    groups = torch.tensor([7, 7, 7, 2, 2])  # ids need not be contiguous or sorted
    adv, _ = grpo(make_inputs(rewards, torch.ones(5, 1), groups), std_normalize=False)
    assert adv[:, 0].tolist() == pytest.approx([1 / 3, -2 / 3, 1 / 3, -1.5, 1.5], abs=1e-6)


def test_grpo_flat_group_is_exactly_zero_even_with_zero_eps():
    # in float32 the mean of three 0.86s is one rounding step below 0.86; the flat group must still give 0
    rewards = torch.tensor([0.86, 0.86, 0.86, 0.0, 1.0])
    groups = torch.tensor([4, 4, 4, 9, 9])
    for eps in (0.0, 1e-6):
        adv, _ = grpo(make_inputs(rewards, torch.ones(5, 2), groups), eps=eps)
        assert torch.equal(adv[:3], torch.zeros(3, 2))
    assert degenerate_group_fraction(rewards, groups) == 0.5


def test_dr_grpo_by_hand():
    adv, returns = dr_grpo(make_inputs(REWARDS, MASK, GROUPS))
    assert torch.allclose(adv, _per_row([3.0 - 1, 0.0, 0.0 - 1, 0.0, 0.0 - 1]), atol=1e-6)  # R - group mean
    assert returns is None


def test_rloo_leave_one_out_by_hand():
    adv, returns = rloo(make_inputs(REWARDS, MASK, GROUPS))
    # row 0: 3 - mean(0, 0); rows 2 and 4: 0 - mean(3, 0); the flat group: 0.5 - 0.5
    assert torch.allclose(adv, _per_row([3.0 - 0.0, 0.0, 0.0 - 1.5, 0.0, 0.0 - 1.5]), atol=1e-6)
    assert returns is None
    alone, _ = rloo(make_inputs(torch.tensor([4.0]), torch.ones(1, 2), torch.tensor([1])))
    assert torch.equal(alone, torch.zeros(1, 2))  # nobody to leave one out against


def test_reinforce_pp_return_to_go_and_whitening_by_hand():
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    inputs = make_inputs(torch.tensor([2.0, -1.0]), mask, torch.tensor([0, 1]))
    adv, returns = reinforce_pp(inputs, gamma=0.5)
    # returns-to-go: row 0 [0.5 * 2, 2] = [1, 2], row 1 [-1]. Mean 2/3, deviations 1/3, 4/3, -5/3,
    # population variance (1 + 16 + 25) / 9 / 3 = 14/9 -> divide the deviations by sqrt(14)/3
    r = math.sqrt(14)
    assert torch.allclose(adv, torch.tensor([[1 / r, 4 / r], [-5 / r, 0.0]]), atol=1e-6)
    assert returns is None
    adv, _ = reinforce_pp(inputs)  # gamma 1: [2, 2], [-1]; mean 1, variance (1 + 1 + 4) / 3 = 2
    assert torch.allclose(
        adv, torch.tensor([[1 / math.sqrt(2), 1 / math.sqrt(2)], [-2 / math.sqrt(2), 0.0]]), atol=1e-6
    )


def test_reinforce_pp_baseline_by_hand():
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    inputs = make_inputs(torch.tensor([3.0, 1.0, 5.0]), mask, torch.tensor([0, 0, 1]))
    adv, _ = reinforce_pp_baseline(inputs)
    # group 0 mean 2 -> shaped rewards 1, -1; group 1 (alone) -> 0. Returns-to-go: [1, 1], [-1], [0, 0].
    # mean 1/5, deviations 4/5, 4/5, -6/5, -1/5, -1/5; variance (16+16+36+1+1)/25/5 = 14/25 -> / (sqrt(14)/5)
    r = math.sqrt(14)
    assert torch.allclose(adv, torch.tensor([[4 / r, 4 / r], [-6 / r, 0.0], [-1 / r, -1 / r]]), atol=1e-6)


def _gae_batch():
    # row 0: a 3-token response after one prompt column, a -0.1 per-token penalty on its first token;
    # row 1: a 1-token response, then padding whose values are garbage
    token_rewards = torch.tensor([[0.0, -0.1, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
    values = torch.tensor([[9.0, 0.5, 0.4, 0.2], [9.0, 0.3, 7.0, 7.0]])
    return AdvantageInputs(token_rewards, mask, torch.tensor([0, 1]), values)


def test_gae_by_hand():
    adv, returns = gae(_gae_batch(), gamma=0.9, lam=0.8)
    delta2 = 1.0 + 0.9 * 0.0 - 0.2  # 0.8: the value after the last token is 0
    delta1 = 0.0 + 0.9 * 0.2 - 0.4  # -0.22
    delta0 = -0.1 + 0.9 * 0.4 - 0.5  # -0.24
    a2 = delta2  # 0.8
    a1 = delta1 + 0.9 * 0.8 * a2  # 0.356
    a0 = delta0 + 0.9 * 0.8 * a1  # 0.01632
    short = 1.0 - 0.3  # row 1: one token, nothing after it
    assert torch.allclose(adv, torch.tensor([[0.0, a0, a1, a2], [0.0, short, 0.0, 0.0]]), atol=1e-6)
    assert torch.allclose(returns, torch.tensor([[0.0, a0 + 0.5, a1 + 0.4, a2 + 0.2], [0.0, 1.0, 0.0, 0.0]]), atol=1e-6)


def test_gae_padding_does_not_reach_the_shorter_row():
    batch = _gae_batch()
    alone = AdvantageInputs(batch.token_rewards[1:, :2], batch.mask[1:, :2], batch.group_ids[1:], batch.values[1:, :2])
    adv, returns = gae(batch, gamma=0.9, lam=0.8)
    adv_alone, returns_alone = gae(alone, gamma=0.9, lam=0.8)
    assert torch.equal(adv[1:, :2], adv_alone) and torch.equal(returns[1:, :2], returns_alone)


def test_gae_whitening_and_missing_values():
    batch = _gae_batch()
    adv, returns = gae(batch, gamma=0.9, lam=0.8, whiten=True)
    tokens = adv[batch.mask > 0]
    assert tokens.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert tokens.var(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)
    assert torch.equal(returns, gae(batch, gamma=0.9, lam=0.8)[1])  # returns come before whitening
    with pytest.raises(ValueError, match="values"):
        gae(make_inputs(REWARDS, MASK, GROUPS))


def test_registry_holds_exactly_these_estimators():
    assert set(ADVANTAGES) == {"grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"}
    for name, estimator in ADVANTAGES.items():
        adv, returns = estimator(make_inputs(REWARDS, MASK, GROUPS, VALUES))
        assert adv.shape == MASK.shape, name
        assert (returns is not None) == (name == "gae"), name


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_advantages_are_zero_outside_the_mask(name):
    adv, returns = ADVANTAGES[name](make_inputs(REWARDS, MASK, GROUPS, VALUES + 5.0))
    assert torch.all(adv[MASK == 0] == 0)
    if returns is not None:
        assert torch.all(returns[MASK == 0] == 0)


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_padding_side_and_amount_do_not_change_advantages(name):
    adv, _ = ADVANTAGES[name](make_inputs(REWARDS, MASK, GROUPS, VALUES))
    # one more column on the left, two on the right, with garbage values there
    padded = make_inputs(REWARDS, F.pad(MASK, (1, 2)), GROUPS, F.pad(VALUES, (1, 2), value=7.0))
    adv_padded, _ = ADVANTAGES[name](padded)
    assert torch.allclose(adv_padded[:, 1:-2], adv, atol=1e-6)
    assert torch.all(adv_padded[:, [0, -2, -1]] == 0)


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_row_order_and_group_labels_do_not_change_advantages(name):
    adv, _ = ADVANTAGES[name](make_inputs(REWARDS, MASK, GROUPS, VALUES))
    order = torch.tensor([3, 0, 4, 2, 1])
    relabelled = torch.where(GROUPS == 7, 100, -5)[order]  # any ids, in any order
    permuted = make_inputs(REWARDS[order], MASK[order], relabelled, VALUES[order])
    adv_permuted, _ = ADVANTAGES[name](permuted)
    assert torch.allclose(adv_permuted, adv[order], atol=1e-6)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_a_forked_sample_takes_its_trajectorys_advantage_and_is_not_a_group_member(name):
    """env.tito=fork: row 5 is the fork of row 0's trajectory (its reward, 3). Group 7's baseline stays that of its
    three trajectories, and the fork's tokens get row 0's advantage; counted as a member, it would move the mean."""
    adv, _ = ADVANTAGES[name](make_inputs(REWARDS, MASK, GROUPS))
    rewards, groups = torch.cat([REWARDS, torch.tensor([3.0])]), torch.cat([GROUPS, torch.tensor([7])])
    mask = torch.cat([MASK, torch.tensor([[0.0, 1.0, 1.0, 0.0]])])
    members = torch.tensor([True] * 5 + [False])
    forked, _ = ADVANTAGES[name](make_inputs(rewards, mask, groups, members=members))
    assert torch.allclose(forked[:5], adv, atol=1e-6)
    assert forked[5, 1:3].tolist() == pytest.approx([adv[0, 1].item()] * 2, abs=1e-6) and adv[0, 1] > 0
    counted, _ = ADVANTAGES[name](make_inputs(rewards, mask, groups))
    assert not torch.allclose(counted[:5], adv, atol=1e-3)  # the fork as a fourth member shifts the baseline
