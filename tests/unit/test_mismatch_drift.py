"""Engine-vs-learner log-prob gaps split by version lag: `mismatch/*` only over tokens sampled by the policy
being trained (numerics), `drift/*` over lagged tokens (the policy moved since it sampled them)."""

import pytest
import torch

from relayrl.learner.policy import mismatch_by_version, mismatch_metrics


def _batch():
    """Three rows of three target columns; row 0 fresh (version 5), row 1 two versions old, row 2 spans 4 and 5.
    Column 0 is a prompt position (mask 0) with a huge gap that must be ignored."""
    learner = torch.tensor([[9.0, -1.0, -2.0], [9.0, -1.0, -2.0], [9.0, -1.0, -2.0]])
    behaviour = torch.tensor([[0.0, -1.0001, -2.0002], [0.0, -1.5, -4.0], [0.0, -1.25, -2.0003]])
    mask = torch.tensor([[0.0, 1.0, 1.0]] * 3)
    versions = torch.tensor([[0, 5, 5], [0, 3, 3], [0, 4, 5]])
    return learner, behaviour, mask, versions


def test_lagged_tokens_are_drift_and_only_fresh_ones_are_mismatch():
    by_version = mismatch_by_version(*_batch())
    assert set(by_version) == {3, 4, 5}
    metrics = mismatch_metrics(by_version, trained_version=5)
    # fresh tokens: 1e-4, 2e-4 (row 0) and 3e-4 (row 2, column 2)
    assert metrics["mismatch/logprob_abs_mean"] == pytest.approx(2e-4, abs=1e-6)
    assert metrics["mismatch/logprob_abs_max"] == pytest.approx(3e-4, abs=1e-6)
    # lagged tokens: 0.5, 2.0 (row 1) and 0.25 (row 2, column 1)
    assert metrics["drift/logprob_abs_mean"] == pytest.approx(2.75 / 3)
    assert metrics["drift/logprob_abs_max"] == pytest.approx(2.0)
    assert metrics["drift/token_frac"] == pytest.approx(3 / 6)


def test_a_synchronous_batch_has_no_drift_and_a_fully_lagged_one_no_mismatch():
    learner, behaviour, mask, versions = _batch()
    behind = mismatch_metrics(mismatch_by_version(learner, behaviour, mask, versions), trained_version=6)
    assert "drift/logprob_abs_max" in behind and "mismatch/logprob_abs_max" not in behind  # e.g. one_step_off
    assert behind["drift/token_frac"] == 1.0
    fresh = mismatch_metrics(mismatch_by_version(learner[:1], behaviour[:1], mask[:1], versions[:1]), 5)
    assert fresh["drift/token_frac"] == 0.0 and "drift/logprob_abs_mean" not in fresh
    assert fresh["mismatch/logprob_abs_max"] == pytest.approx(2e-4, abs=1e-6)


def test_no_trained_token_gives_no_gap_metrics():
    learner, behaviour, mask, versions = _batch()
    assert mismatch_metrics(mismatch_by_version(learner, behaviour, mask * 0, versions), 5) == {}
