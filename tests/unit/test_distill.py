"""On-policy distillation's signal: hand-computed advantages and metric, the three ways the stage places it, and
the sign: a policy-loss step on the distillation advantage lowers the reverse KL to the teacher (tiny models)."""

import functools

import pytest
import torch

from relayrl.algorithms.distill import distill_advantages, distill_metrics, distill_reward_penalty, reverse_kl
from relayrl.algorithms.losses import POLICY_LOSSES
from relayrl.algorithms.stage import advantage_stage
from relayrl.config import load_config
from relayrl.learner.batching import make_experience
from relayrl.models.tiny import build_tiny_model
from relayrl.types import Prompt, Rollout, Score

OLD = torch.tensor([[0.0, -1.0, -2.0, -0.5], [0.0, -0.3, -0.7, 0.0]])  # [B, T] the student's pre-update log-probs
TEACHER = torch.tensor([[0.0, -0.2, -3.0, -0.5], [0.0, -0.3, -0.1, 0.0]])
MASK = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])  # policy tokens only (prompt, observation: 0)


def test_advantage_is_teacher_minus_student_on_policy_tokens_only():
    expected = torch.tensor([[0.0, 0.8, -1.0, 0.0], [0.0, 0.0, 0.6, 0.0]])
    assert torch.allclose(distill_advantages(OLD, TEACHER, MASK), expected)


def test_reverse_kl_is_the_mean_of_student_minus_teacher_over_policy_tokens():
    # per token: -0.8, 1.0, 0.0 | 0.0, -0.6 -> mean -0.4 / 5
    assert reverse_kl(OLD, TEACHER, MASK) == pytest.approx(-0.08)
    assert distill_metrics(OLD, TEACHER, MASK) == {"distill/reverse_kl": pytest.approx(-0.08)}
    assert distill_metrics(OLD, None, MASK) == {}  # a step the teacher did not score reports nothing
    assert reverse_kl(OLD, TEACHER, torch.zeros_like(MASK)) == 0.0


def test_reward_mode_is_the_reference_kl_in_reward_path_with_k1():
    penalty = distill_reward_penalty(OLD, TEACHER, MASK, 0.5)
    assert torch.allclose(penalty, 0.5 * distill_advantages(OLD, TEACHER, MASK))


def _batch():
    """Two groups of two single-prompt rollouts, with the student's and the teacher's log-probs filled."""
    prompt, other = Prompt("a", "", [5, 6]), Prompt("b", "", [7, 8])
    rollouts = [
        Rollout(prompt, 0, [9, 10, 11], "", [-1.0] * 3, "stop", [0] * 3),
        Rollout(prompt, 1, [9, 12], "", [-1.0] * 2, "stop", [0] * 2),
        Rollout(other, 0, [13], "", [-1.0], "stop", [0]),
        Rollout(other, 1, [13, 14], "", [-1.0] * 2, "stop", [0] * 2),
    ]
    exp = make_experience(rollouts, [Score(1.0), Score(0.0), Score(1.0), Score(1.0)], pad_id=0)
    gen = torch.Generator().manual_seed(0)
    exp.old_logprobs = -torch.rand(exp.loss_mask.shape, generator=gen) * exp.loss_mask
    exp.teacher_logprobs = -torch.rand(exp.loss_mask.shape, generator=gen) * exp.loss_mask
    return exp, rollouts


def _stage(model_dir, *overrides, teacher=True):
    config = load_config(None, [f"model.path={model_dir}", f"teacher.path={model_dir}", "rollout.n=2", *overrides])
    return advantage_stage(config.algorithm, teacher=teacher)


def test_distill_alone_trains_on_the_signal_scaled_by_coef(random_model_dir):
    exp, rollouts = _batch()
    signal = distill_advantages(exp.old_logprobs, exp.teacher_logprobs, exp.loss_mask)
    out = _stage(random_model_dir, "algorithm.advantage=distill", "algorithm.distill.coef=0.5")(exp, rollouts)
    assert torch.allclose(out.advantages, 0.5 * signal)
    assert out.returns is None


def test_distill_beside_grpo_adds_coef_times_the_signal_to_the_reward_advantage(random_model_dir):
    exp, rollouts = _batch()
    signal = distill_advantages(exp.old_logprobs, exp.teacher_logprobs, exp.loss_mask)
    reward_only = _stage(random_model_dir, teacher=False)(_batch()[0], rollouts).advantages
    out = _stage(random_model_dir, "algorithm.distill.coef=0.25")(exp, rollouts)
    assert torch.allclose(out.advantages, reward_only + 0.25 * signal)
    assert reward_only[2:].abs().sum() == 0  # the flat group: all its signal is the teacher's
    assert out.advantages[2:].abs().sum() > 0


def test_distill_in_the_reward_enters_the_token_rewards_before_the_estimator(random_model_dir):
    exp, rollouts = _batch()
    penalty = distill_reward_penalty(exp.old_logprobs, exp.teacher_logprobs, exp.loss_mask, 2.0)
    out = _stage(
        random_model_dir, "algorithm.distill.mode=reward", "algorithm.distill.coef=2.0", "algorithm.advantage=rloo"
    )(exp, rollouts)
    assert torch.equal(out.reward_penalty, penalty)
    # rloo of the sequence rewards plus the summed penalty: row 0 against row 1 in group a
    totals = torch.tensor([1.0, 0.0, 1.0, 1.0]) + penalty.sum(dim=1)
    expected = torch.stack([totals[0] - totals[1], totals[1] - totals[0], totals[2] - totals[3], totals[3] - totals[2]])
    assert torch.allclose(out.advantages.sum(dim=1) / out.loss_mask.sum(dim=1), expected, atol=1e-6)


# ---------------------------------------------------------------------------- the gradient's direction


def _next_token_logp(model, prompt: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(model(input_ids=prompt[None]).logits[0, -1].float(), -1)  # [V]


def _exact_reverse_kl(student, teacher, prompt) -> float:
    with torch.no_grad():
        s, t = _next_token_logp(student, prompt), _next_token_logp(teacher, prompt)
    return float((s.exp() * (s - t)).sum())


def _step_on_distill_advantage(sign: float) -> tuple[float, float]:
    """KL(student || teacher) at one position before and after one SGD step of the ppo_clip loss on samples
    from the student whose advantages are sign x (log teacher - log student)."""
    student = build_tiny_model(vocab_size=24, hidden=32, layers=1, heads=2, intermediate=64, seed=1)
    teacher = build_tiny_model(vocab_size=24, hidden=32, layers=1, heads=2, intermediate=64, seed=2)
    prompt = torch.tensor([1, 5, 7, 9])
    before = _exact_reverse_kl(student, teacher, prompt)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        old = _next_token_logp(student, prompt)
        tokens = torch.multinomial(old.exp(), 4096, replacement=True, generator=gen)  # the student's own samples
        teacher_logp = _next_token_logp(teacher, prompt)[tokens]
    logp = _next_token_logp(student, prompt)[tokens][:, None]  # [N, 1] with gradients
    mask = torch.ones_like(logp)
    advantages = sign * distill_advantages(old[tokens][:, None], teacher_logp[:, None], mask)
    loss, _ = functools.partial(POLICY_LOSSES["ppo_clip"], clip_eps=0.2, agg="token_mean")(
        logp, logp.detach(), advantages, mask, normaliser=float(mask.sum())
    )
    loss.backward()
    with torch.no_grad():
        for param in student.parameters():
            param -= 0.5 * param.grad
    return before, _exact_reverse_kl(student, teacher, prompt)


def test_a_step_on_the_distill_advantage_lowers_the_reverse_kl_to_the_teacher():
    before, after = _step_on_distill_advantage(+1.0)
    assert after < before * 0.95, (before, after)


def test_the_opposite_sign_would_raise_it():  # the test above is not passing by accident
    before, after = _step_on_distill_advantage(-1.0)
    assert after > before, (before, after)
