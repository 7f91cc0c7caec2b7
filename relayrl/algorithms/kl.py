"""Per-token KL estimators to the reference, the KL-in-reward penalty, and the KL coefficient controllers.

Estimators map the sampled tokens' log-probs [B, T] (policy and reference) to per-token estimates [B, T]
of KL(pi || ref), for tokens sampled from pi; with r = ref - logp = log(ref(y) / pi(y)):

    name  value              unbiased  >= 0  gradient as a loss, E_pi[grad]
    k1    logp - ref = -r    yes       no    0 (only the score function: use it in the reward, not the loss)
    k2    r^2 / 2            no        yes   grad KL(pi || ref), the right one (verl calls it "mse")
    k3    exp(r) - r - 1     yes       yes   grad KL(ref || pi), the *reverse* direction (Tang & Munos 2025)
    abs   |r|                no        yes   E|r| >= KL; a heuristic penalty (verl "abs")

k3 is the low-variance choice for *measuring* the KL (and the GRPO default), but as a differentiated loss
term it pulls toward the reference in the mass-covering direction KL(ref || pi); k2 is the estimator whose
loss gradient matches KL(pi || ref). Leaves out: where the penalty is applied (the learner decides between
the loss, via losses.kl_penalty, and the reward, via kl_in_reward).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """logp - ref: the naive estimator. Unbiased for KL(pi || ref), high variance, negative for some tokens."""
    return logprobs - ref_logprobs


def k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """(logp - ref)^2 / 2: biased (an f-divergence, ~KL when pi is near ref), low variance, >= 0."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's low-variance unbiased estimator: exp(r) - r - 1 with r = ref - policy (always >= 0).

    Caveat: differentiated as a loss on on-policy samples its expected gradient is that of KL(ref || pi),
    not KL(pi || ref) (Tang & Munos 2025, "On a few pitfalls in KL divergence gradient estimation").
    """
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


def abs_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """|logp - ref|: biased (its expectation is >= KL(pi || ref)), >= 0."""
    return (logprobs - ref_logprobs).abs()


KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KL_ESTIMATORS: dict[str, KLEstimator] = {"k1": k1, "k2": k2, "k3": k3, "abs": abs_kl}


def kl_estimator(name: str) -> KLEstimator:
    if name not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {name!r}; expected one of {', '.join(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[name]


def kl_in_reward(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, estimator: str, coef: float
) -> torch.Tensor:
    """Per-token reward penalty -coef * kl [B, T], 0 on masked tokens and detached (rewards carry no gradient).

    Added to the token rewards before the advantages (the InstructGPT/PPO-RLHF placement); k1 is the usual
    estimator here since the penalty enters through the advantage, not through its own gradient.
    """
    with torch.no_grad():
        return -coef * kl_estimator(estimator)(logprobs, ref_logprobs) * mask


class FixedKLController:
    """A constant KL coefficient; `update` is a no-op, so callers need not tell the two controllers apart."""

    def __init__(self, coef: float):
        self.coef = coef

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.coef


class AdaptiveKLController:
    """Proportional control of the KL coefficient toward a target KL (Ziegler et al. 2019; as in OpenRLHF).

    error = clip(current_kl / target - 1, -0.2, 0.2); coef *= 1 + error * n_steps / horizon, where
    n_steps counts the samples (or steps) the measured KL covers and horizon sets the time constant.
    """

    def __init__(self, init_coef: float, target: float, horizon: float):
        if init_coef < 0 or target <= 0 or horizon <= 0:
            raise ValueError(
                f"adaptive KL needs init_coef >= 0, target > 0, horizon > 0; got "
                f"init_coef={init_coef}, target={target}, horizon={horizon}"
            )
        self.coef, self.target, self.horizon = init_coef, target, horizon

    def update(self, current_kl: float, n_steps: int) -> float:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.coef *= 1.0 + error * n_steps / self.horizon
        return self.coef
