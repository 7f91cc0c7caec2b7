"""Rollout correction (truncated IS and ratio masking, token and sequence level), checked by hand."""

import math

import pytest
import torch

from relayrl.algorithms.correction import sequence_ratio_mask, sequence_tis, token_ratio_mask, token_tis

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
# behaviour log-probs 0, so the ratio pi_old / mu is exp(old) = these numbers; 100 sits under the padding
RATIOS = torch.tensor([[1.0, 3.0, 0.5], [2.0, 0.25, 100.0]])
BEHAVIOUR = torch.zeros(2, 3)


def _old():
    return torch.log(RATIOS).requires_grad_(True)  # gradients must not reach through the weights


def test_token_tis_by_hand():
    weights, metrics = token_tis(_old(), BEHAVIOUR, MASK, threshold=2.0)
    # min(ratio, 2) per token; 0 under the padding
    assert weights.flatten().tolist() == pytest.approx([1.0, 2.0, 0.5, 2.0, 0.25, 0.0], abs=1e-6)
    assert not weights.requires_grad
    assert metrics["ratio_mean"].item() == pytest.approx((1 + 3 + 0.5 + 2 + 0.25) / 5, abs=1e-6)
    assert metrics["ratio_max"].item() == pytest.approx(3.0, abs=1e-6)  # the padded 100 is not seen
    assert metrics["truncated_frac"].item() == pytest.approx(1 / 5)  # only the 3.0


def test_sequence_tis_by_hand():
    weights, metrics = sequence_tis(_old(), BEHAVIOUR, MASK, threshold=1.2)
    # sequence ratios: 1 * 3 * 0.5 = 1.5 -> truncated to 1.2; 2 * 0.25 = 0.5 (padding excluded)
    assert weights.flatten().tolist() == pytest.approx([1.2, 1.2, 1.2, 0.5, 0.5, 0.0], abs=1e-6)
    assert not weights.requires_grad
    assert metrics["ratio_mean"].item() == pytest.approx((3 * 1.5 + 2 * 0.5) / 5, abs=1e-6)  # per token
    assert metrics["ratio_max"].item() == pytest.approx(1.5, abs=1e-6)
    assert metrics["truncated_frac"].item() == pytest.approx(3 / 5)  # the 3 tokens of sequence 1


def test_token_ratio_mask_by_hand():
    new_mask, metrics = token_ratio_mask(_old(), BEHAVIOUR, MASK, lower=0.4, upper=2.5)
    # 3.0 > 2.5 and 0.25 < 0.4 are dropped; the padding stays 0
    assert new_mask.flatten().tolist() == [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert metrics["masked_frac"].item() == pytest.approx(2 / 5)
    assert metrics["ratio_mean"].item() == pytest.approx((1 + 3 + 0.5 + 2 + 0.25) / 5, abs=1e-6)


def test_sequence_ratio_mask_by_hand():
    new_mask, metrics = sequence_ratio_mask(_old(), BEHAVIOUR, MASK, lower=0.8, upper=1.25)
    # geometric means: 1.5 ** (1/3) = 1.145 kept; 0.5 ** (1/2) = 0.707 < 0.8 drops the whole sequence
    assert new_mask.flatten().tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert metrics["masked_frac"].item() == pytest.approx(2 / 5)
    assert metrics["ratio_mean"].item() == pytest.approx((3 * 1.5 ** (1 / 3) + 2 * math.sqrt(0.5)) / 5, abs=1e-6)
    assert metrics["ratio_max"].item() == pytest.approx(1.5 ** (1 / 3), abs=1e-6)


def test_padding_may_hold_anything():
    behaviour = BEHAVIOUR.clone()
    behaviour[1, 2] = float("-inf")  # what an engine might leave where no token was sampled
    for correct in (token_tis, sequence_tis):
        weights, metrics = correct(_old(), behaviour, MASK, 2.0)
        assert torch.isfinite(weights).all() and all(torch.isfinite(v) for v in metrics.values())
    for correct in (token_ratio_mask, sequence_ratio_mask):
        new_mask, _ = correct(_old(), behaviour, MASK, 0.5, 2.0)
        assert new_mask[1, 2] == 0


def test_bad_bounds_are_errors():
    with pytest.raises(ValueError, match="threshold > 0"):
        token_tis(_old(), BEHAVIOUR, MASK, threshold=0.0)
    with pytest.raises(ValueError, match="lower < upper"):
        sequence_ratio_mask(_old(), BEHAVIOUR, MASK, lower=2.0, upper=0.5)
