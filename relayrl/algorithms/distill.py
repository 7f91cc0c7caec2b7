"""On-policy distillation's signal: the per-token reverse KL to a teacher on the student's own samples.

For a token y_t the student sampled, log pi_student(y_t) - log pi_teacher(y_t) is a one-sample (k1) estimate of
the reverse KL(pi_student || pi_teacher) at that position. Its negative,

    A_t = log pi_teacher(y_t) - log pi_student_old(y_t)        (on policy tokens, 0 elsewhere; no discount)

is the per-token advantage: the policy loss -A_t * ratio_t then raises the tokens the teacher likes more than the
student does and lowers the others, so a gradient step lowers the reverse KL (tests/unit/test_distill.py shows it
on a tiny model). It goes through the same policy loss, importance correction and loss mask as RL (multi-turn:
policy tokens only). All functions here are pure tensor functions, [B, T] as the `Experience` lays them out.

Leaves out: where the teacher's log-probs come from (relayrl/learner/teacher.py) and how the stage combines the
signal with a reward estimator (relayrl/algorithms/stage.py).
"""

from __future__ import annotations

import torch

from relayrl.algorithms.kl import kl_in_reward


def distill_advantages(old_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A_t = log pi_teacher - log pi_student (pre-update) per token, 0 off the mask: all [B, T]."""
    return (teacher_logprobs - old_logprobs) * mask


def distill_reward_penalty(
    old_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor, coef: float
) -> torch.Tensor:
    """algorithm.distill.mode=reward: -coef x (log student - log teacher) per token [B, T], for the token rewards:
    the same code path (and k1 estimator) as the reference's KL when algorithm.kl.placement=reward."""
    return kl_in_reward(old_logprobs, teacher_logprobs, mask, "k1", coef)


def reverse_kl(old_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of log pi_student - log pi_teacher over the policy tokens (`distill/reverse_kl`); 0 without any."""
    trained = mask.bool()
    if not trained.any():
        return 0.0
    return float((old_logprobs - teacher_logprobs)[trained].mean())


def distill_metrics(old_logprobs: torch.Tensor | None, teacher_logprobs: torch.Tensor | None, mask) -> dict:
    """`distill/reverse_kl` for a step whose batch the teacher scored; {} for one it did not."""
    if teacher_logprobs is None or old_logprobs is None:
        return {}
    return {"distill/reverse_kl": reverse_kl(old_logprobs, teacher_logprobs, mask)}
