"""KL estimators, their loss gradients, KL-in-reward and the KL controllers, checked by hand."""

import math

import pytest
import torch

from relayrl.algorithms.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    abs_kl,
    k1,
    k2,
    k3,
    kl_in_reward,
)

LN2 = math.log(2)
# two tokens: the policy gives them 0.5 and 0.25, the reference 0.25 and 0.5
LOGP, REF = torch.log(torch.tensor([0.5, 0.25])), torch.log(torch.tensor([0.25, 0.5]))


def test_k1_by_hand():
    assert k1(LOGP, REF).tolist() == pytest.approx([LN2, -LN2], abs=1e-6)  # logp - ref; can be negative


def test_k2_by_hand():
    assert k2(LOGP, REF).tolist() == pytest.approx([0.5 * LN2**2, 0.5 * LN2**2], abs=1e-6)


def test_k3_by_hand():
    # r = ref - logp = -ln 2 and +ln 2: exp(r) - r - 1 = 0.5 + ln 2 - 1 and 2 - ln 2 - 1
    assert k3(LOGP, REF).tolist() == pytest.approx([LN2 - 0.5, 1 - LN2], abs=1e-6)


def test_abs_by_hand():
    assert abs_kl(LOGP, REF).tolist() == pytest.approx([LN2, LN2], abs=1e-6)


def test_registry_names():
    assert {"k1": k1, "k2": k2, "k3": k3, "abs": abs_kl} == KL_ESTIMATORS


def test_nonnegative_estimators():
    torch.manual_seed(0)
    logp, ref = torch.randn(1000), torch.randn(1000)
    for name in ("k2", "k3", "abs"):
        assert (KL_ESTIMATORS[name](logp, ref) >= 0).all(), name


def _categoricals():
    pi = torch.tensor([0.4, 0.25, 0.15, 0.12, 0.08])
    ref = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.2])
    return pi, ref


def test_k1_and_k3_averaged_over_samples_from_pi_estimate_the_kl():
    pi, ref = _categoricals()
    true_kl = float((pi * (pi / ref).log()).sum())  # ~0.155
    samples = torch.multinomial(pi, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    logp, ref_logp = pi.log()[samples], ref.log()[samples]
    assert k1(logp, ref_logp).mean().item() == pytest.approx(true_kl, abs=0.01)
    assert k3(logp, ref_logp).mean().item() == pytest.approx(true_kl, abs=0.01)
    exact_k2 = float((pi * k2(pi.log(), ref.log())).sum())  # E_pi[k2], exactly: ~0.158, biased
    assert abs(exact_k2 - true_kl) > 1e-3


def _expected_loss_gradient(estimator, logits, ref):
    """E_{y ~ pi}[grad estimator(log pi(y), log ref(y))], exactly: the sampling weights carry no gradient."""
    logp = torch.log_softmax(logits, -1)
    return torch.autograd.grad((logp.exp().detach() * estimator(logp, ref.log())).sum(), logits)[0]


def test_k2_loss_gradient_is_that_of_kl_pi_ref_and_k3s_is_that_of_kl_ref_pi():
    pi, ref = _categoricals()
    logits = pi.log().clone().requires_grad_(True)
    logp = torch.log_softmax(logits, -1)
    forward_kl = torch.autograd.grad((logp.exp() * (logp - ref.log())).sum(), logits)[0]  # KL(pi || ref)
    logp = torch.log_softmax(logits, -1)
    reverse_kl = torch.autograd.grad((ref * (ref.log() - logp)).sum(), logits)[0]  # KL(ref || pi)
    assert torch.allclose(_expected_loss_gradient(k2, logits, ref), forward_kl, atol=1e-6)
    assert torch.allclose(_expected_loss_gradient(k3, logits, ref), reverse_kl, atol=1e-6)
    assert not torch.allclose(forward_kl, reverse_kl, atol=1e-3)
    assert torch.allclose(_expected_loss_gradient(k1, logits, ref), torch.zeros(5), atol=1e-6)


def test_kl_in_reward_by_hand():
    logp = LOGP[None].clone().requires_grad_(True)
    penalty = kl_in_reward(logp, REF[None], torch.tensor([[1.0, 0.0]]), "k1", coef=0.1)
    assert penalty.tolist()[0] == pytest.approx([-0.1 * LN2, 0.0], abs=1e-6)  # -coef * kl, 0 when masked
    assert not penalty.requires_grad
    with pytest.raises(ValueError, match="k1, k2, k3, abs"):
        kl_in_reward(logp, REF[None], torch.ones(1, 2), "kl", coef=0.1)


def test_adaptive_controller_by_hand():
    controller = AdaptiveKLController(init_coef=0.1, target=6.0, horizon=10_000)
    # KL 9: error 9/6 - 1 = 0.5, clipped to 0.2; coef *= 1 + 0.2 * 256 / 10000
    first = 0.1 * (1 + 0.2 * 256 / 10_000)  # = 0.100512
    assert controller.update(9.0, n_steps=256) == pytest.approx(first)
    # KL 5.4: error 0.9 - 1 = -0.1 (inside the clip); coef *= 1 - 0.1 * 512 / 10000
    assert controller.update(5.4, n_steps=512) == pytest.approx(first * (1 - 0.1 * 512 / 10_000))
    assert controller.coef == pytest.approx(0.1 * 1.00512 * 0.99488)
    with pytest.raises(ValueError, match="target > 0"):
        AdaptiveKLController(init_coef=0.1, target=0.0, horizon=10_000)


def test_fixed_controller_never_moves():
    controller = FixedKLController(0.05)
    assert controller.update(100.0, n_steps=256) == 0.05 and controller.coef == 0.05
