"""The learner on a tiny random model: experience layout, micro-batch invariance, which passes run."""

import pytest
import torch

from relayrl.algorithms.advantages import grpo, make_inputs
from relayrl.config import load_config
from relayrl.learner.batching import make_experience
from relayrl.learner.policy import PolicyLearner
from relayrl.placement.sections import learner_settings
from relayrl.types import Prompt, Rollout, Score


def _config(model_dir, extra=(), **train):
    overrides = [f"model.path={model_dir}", "rollout.n=4", "rollout.prompts_per_step=4", "train.lr=1e-3"]
    overrides += [f"train.{k}={v}" for k, v in train.items()] + list(extra)
    return load_config(None, overrides)


def _experience(seed=0, groups=4, n=4, vocab=16):
    """Rollouts of varied prompt and response lengths with made-up rewards (two groups flat)."""
    gen = torch.Generator().manual_seed(seed)
    rollouts, scores = [], []
    for g in range(groups):
        prompt_ids = torch.randint(4, vocab, (3 + g,), generator=gen).tolist()
        prompt = Prompt(id=f"p{g}", text="", token_ids=prompt_ids)
        for i in range(n):
            length = 1 + (g + i) % 5
            response = torch.randint(4, vocab, (length,), generator=gen).tolist()
            rollouts.append(Rollout(prompt, i, response, "", [-1.0] * length, "stop", [0] * length))
            scores.append(Score(float((g + i) % 2) if g < 2 else 1.0))
    exp = make_experience(rollouts, scores, pad_id=0)
    exp.advantages, _ = grpo(make_inputs(exp.rewards, exp.loss_mask, exp.group_ids))
    return exp


def _grads_of_first_step(learner, exp):
    captured = []

    def hook(optimizer, args, kwargs):
        if not captured:
            captured.extend(p.grad.clone() for p in learner.model.parameters())

    learner.optimizer.register_step_pre_hook(hook)
    return captured, learner.update(exp)  # the UpdateResult


def test_experience_aligns_response_tokens_to_targets():
    prompt = Prompt(id="a", text="", token_ids=[5, 6, 7])
    rollouts = [
        Rollout(prompt, 0, [8, 9], "", [-0.1, -0.2], "stop", [3, 3]),
        Rollout(prompt, 1, [10], "", [-0.3], "length", [3]),
    ]
    exp = make_experience(rollouts, [Score(1.0), Score(0.0)], pad_id=0)
    assert exp.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 6, 7, 10, 0]]
    assert exp.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # target column j is token j+1: responses start at column len(prompt) - 1 = 2
    assert exp.loss_mask.tolist() == [[0, 0, 1, 1], [0, 0, 1, 0]]
    assert exp.behaviour_logprobs[0].tolist() == pytest.approx([0, 0, -0.1, -0.2])
    assert exp.versions.tolist() == [[0, 0, 3, 3], [0, 0, 3, 0]]
    assert exp.group_ids.tolist() == [0, 0]


OBJECTIVES = [
    [],
    ["algorithm.loss_agg=seq_mean_token_mean"],
    ["algorithm.loss_agg=seq_mean_token_sum_norm", "rollout.max_tokens=8"],
    ["algorithm.policy_loss=gspo", "algorithm.loss_agg=seq_mean_token_mean"],
    ["algorithm.entropy_coef=0.01", "algorithm.clip_eps_high=0.28", "algorithm.dual_clip_c=3"],
]


@pytest.mark.parametrize("objective", OBJECTIVES, ids=lambda o: "+".join(o) or "default")
@pytest.mark.parametrize("micro", [3, 5])
def test_micro_batches_change_neither_loss_nor_gradients(random_model_dir, micro, objective):
    exp = _experience()
    whole = PolicyLearner(learner_settings(_config(random_model_dir, micro_batch=16, extra=objective)))
    split = PolicyLearner(learner_settings(_config(random_model_dir, micro_batch=micro, extra=objective)))
    grads_whole, stats_whole = _grads_of_first_step(whole, exp)
    grads_split, stats_split = _grads_of_first_step(split, exp)
    assert any(g.abs().sum() > 0 for g in grads_whole)
    for a, b in zip(grads_whole, grads_split):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert stats_split.metrics["loss/policy"] == pytest.approx(stats_whole.metrics["loss/policy"], abs=1e-6)
    assert stats_split.metrics["actor/entropy"] == pytest.approx(stats_whole.metrics["actor/entropy"], rel=1e-5)


def test_padding_does_not_change_logprobs(random_model_dir):
    learner = PolicyLearner(learner_settings(_config(random_model_dir)))
    exp = _experience()
    short = learner.logprobs(exp.select(torch.tensor([0])))  # trimmed to its own length
    padded = learner.logprobs(exp)[0, : short.shape[1]]
    response = exp.loss_mask[0, : short.shape[1]].bool()  # log-probs are defined on response tokens
    torch.testing.assert_close(short[0][response], padded[response], atol=1e-5, rtol=1e-5)


def test_single_on_policy_step_skips_the_old_logprob_pass(random_model_dir):
    learner = PolicyLearner(learner_settings(_config(random_model_dir)))
    assert not learner.needs_old_logprobs and learner.reference is None
    exp = _experience()
    learner.fill_logprobs(exp)
    assert exp.old_logprobs is None and exp.ref_logprobs is None
    before = [p.detach().clone() for p in learner.model.parameters()]
    stats = learner.update(exp).metrics
    assert stats["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # on-policy: ratio exactly 1
    assert stats["actor/clip_frac"] == 0.0
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))


@pytest.mark.parametrize("train", [{"epochs": 2}, {"mini_batch": 8}])
def test_several_updates_per_step_compute_old_logprobs(random_model_dir, train):
    learner = PolicyLearner(learner_settings(_config(random_model_dir, **train)))
    assert learner.needs_old_logprobs
    exp = _experience()
    learner.fill_logprobs(exp)
    torch.testing.assert_close(exp.old_logprobs, learner.logprobs(exp))
    stats = learner.update(exp).metrics
    assert stats["actor/ratio_max"] > 1.0  # later mini-batches / epochs see a moved policy


def test_reference_is_loaded_only_with_a_kl_coefficient(random_model_dir):
    config = load_config(
        None, [f"model.path={random_model_dir}", "rollout.n=4", "rollout.prompts_per_step=4", "algorithm.kl.coef=0.1"]
    )
    learner = PolicyLearner(learner_settings(config))
    assert learner.reference is not None
    assert not any(p.requires_grad for p in learner.reference.parameters())
    exp = _experience()
    learner.fill_logprobs(exp)
    torch.testing.assert_close(exp.ref_logprobs, learner.logprobs(exp))
    stats = learner.update(exp).metrics
    assert stats["actor/kl"] == pytest.approx(0.0, abs=1e-6)  # identical before the step
    assert learner.update(exp).metrics["actor/kl"] > 0  # the policy has moved away from the reference


def test_missing_model_path_is_a_clear_error(tmp_path):
    from relayrl.errors import ModelError

    with pytest.raises(ModelError, match="no config.json"):
        PolicyLearner(learner_settings(_config(tmp_path / "nowhere")))


def test_groups_follow_generation_order_not_prompt_ids():
    """Two different prompts that share an id (or one prompt drawn twice) stay two GRPO groups."""
    a, b = Prompt(id="same", text="", token_ids=[5]), Prompt(id="same", text="", token_ids=[6])
    rollouts = [Rollout(p, i, [7], "", [-1.0], "stop", [0]) for p in (a, b) for i in range(2)]
    exp = make_experience(rollouts, [Score(1.0)] * 4, pad_id=0)
    assert exp.group_ids.tolist() == [0, 0, 1, 1]


def test_staleness_counts_optimizer_steps_per_mini_batch(random_model_dir):
    stats = PolicyLearner(learner_settings(_config(random_model_dir, mini_batch=4))).update(_experience()).metrics
    # 16 responses in mini-batches of 4: the mini-batches are 0, 1, 2, 3 optimizer steps stale
    assert stats["stale/mean"] == 1.5 and stats["stale/max"] == 3.0
    on_policy = PolicyLearner(learner_settings(_config(random_model_dir))).update(_experience()).metrics
    assert on_policy["stale/mean"] == 0.0 and on_policy["loss/total"] == on_policy["loss/policy"]


def test_kl_enters_the_total_loss_not_the_policy_loss(random_model_dir):
    config = load_config(
        None,
        [
            f"model.path={random_model_dir}",
            "rollout.n=4",
            "rollout.prompts_per_step=4",
            "algorithm.kl.coef=0.5",
            "train.epochs=2",
        ],
    )
    learner = PolicyLearner(learner_settings(config))
    exp = _experience()
    learner.fill_logprobs(exp)
    stats = learner.update(exp).metrics
    assert stats["loss/total"] == pytest.approx(stats["loss/policy"] + 0.5 * stats["actor/kl"], rel=1e-4, abs=1e-7)


@pytest.mark.parametrize("mode", ["tis_token", "tis_seq", "mask_token", "mask_seq"])
def test_rollout_correction_uses_the_behaviour_logprobs(random_model_dir, mode):
    learner = PolicyLearner(learner_settings(_config(random_model_dir, extra=[f"algorithm.correction.mode={mode}"])))
    # the correction compares the learner's pre-update log-probs: a separate pass, except for TIS on a single
    # on-policy mini-batch, whose weights come from the update's own forward
    assert learner.needs_old_logprobs == mode.startswith("mask")
    exp = _experience()  # behaviour log-probs are all -1: far from the learner's, so ratios are off 1
    learner.fill_logprobs(exp)
    stats = learner.update(exp).metrics
    assert stats["correction/ratio_mean"] != pytest.approx(1.0)
    frac = stats["correction/truncated_frac" if mode.startswith("tis") else "correction/masked_frac"]
    assert 0.0 <= frac <= 1.0


def test_kl_in_the_reward_forces_the_old_pass_and_reports_the_coefficient(random_model_dir):
    extra = [
        "algorithm.kl.coef=0.2",
        "algorithm.kl.placement=reward",
        "algorithm.kl.controller=adaptive",
        "algorithm.kl.target=0.01",
    ]
    learner = PolicyLearner(learner_settings(_config(random_model_dir, extra=extra)))
    assert learner.needs_old_logprobs and not learner.objective.kl_in_loss
    exp = _experience()
    learner.fill_logprobs(exp)
    assert torch.equal(learner.objective.reward_penalty(exp), torch.zeros_like(exp.loss_mask))  # policy == ref
    exp.advantages = torch.ones_like(exp.loss_mask) * exp.loss_mask
    first = learner.update(exp).metrics
    assert first["actor/kl_coef"] == 0.2 and first["actor/kl"] == 0.0
    learner.fill_logprobs(exp)
    assert learner.objective.reward_penalty(exp).abs().sum() > 0  # the policy moved away from the reference
    # KL 0 is below target: the adaptive controller lowered the coefficient by (1 - 0.2 * 16 / horizon)
    assert learner.update(exp).metrics["actor/kl_coef"] == pytest.approx(0.2 * (1 - 0.2 * 16 / 10_000))


@pytest.mark.parametrize("mode", ["tis_token", "tis_seq"])
def test_tis_in_the_update_pass_equals_tis_from_a_separate_old_pass(random_model_dir, mode):
    results = []
    for in_pass in (True, False):
        learner = PolicyLearner(
            learner_settings(
                _config(
                    random_model_dir,
                    micro_batch=8,
                    extra=[f"algorithm.correction.mode={mode}", "algorithm.correction.threshold=1.5"],
                )
            )
        )
        assert learner.correct_in_pass
        if not in_pass:
            learner.correct_in_pass, learner.needs_old_logprobs = False, True
        exp = _experience()  # behaviour log-probs spread on both sides of the learner's: some ratios pass 1.5
        exp.behaviour_logprobs = -5 * torch.rand(exp.loss_mask.shape, generator=torch.Generator().manual_seed(0))
        learner.fill_logprobs(exp)
        assert (exp.old_logprobs is None) == in_pass
        results.append(_grads_of_first_step(learner, exp))
    (grads_in, stats_in), (grads_sep, stats_sep) = results
    for a, b in zip(grads_in, grads_sep):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    for name in ("ratio_mean", "ratio_max", "truncated_frac"):
        assert stats_in.metrics[f"correction/{name}"] == pytest.approx(
            stats_sep.metrics[f"correction/{name}"], rel=1e-5
        )
    assert 0 < stats_in.metrics["correction/truncated_frac"] < 1
