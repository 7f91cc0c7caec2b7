"""Group packing (relayrl/learner/packing.py, layout.py): the row layout, and that packed and padded forwards
give the learner the same log-probs, losses and gradients over fewer positions, with forked samples (env.tito=fork)
too: a sample whose prompt differs from its group's gets a row of its own and its trajectory's advantage."""

import math

import pytest
import torch

from relayrl.algorithms.advantages import grpo, make_inputs
from relayrl.algorithms.stage import estimate_advantages
from relayrl.errors import ConfigError
from relayrl.learner.batching import MicroBatcher, make_experience
from relayrl.learner.layout import ForwardLayout, Sampled
from relayrl.learner.packing import pack_groups, packed_positions, padded_positions
from relayrl.learner.policy import PolicyLearner, mismatch_metrics
from relayrl.placement.sections import learner_settings
from relayrl.types import Experience, Prompt, Rollout, Score, filled
from tests.unit.test_learner import _config, _experience, _grads_of_first_step

SAMPLED = Sampled(temperature=1.0, top_k=-1, top_p=1.0)


def _two_groups():
    a, b = Prompt("a", "", [5, 6, 7]), Prompt("b", "", [8, 9])
    rollouts = [
        Rollout(a, 0, [10, 11], "", [-1.0, -1.0], "stop", [0, 0]),
        Rollout(a, 1, [12], "", [-1.0], "stop", [0]),
        Rollout(b, 0, [13, 14, 15], "", [-1.0] * 3, "stop", [0] * 3),
        Rollout(b, 1, [], "", [], "length", []),
    ]
    return make_experience(rollouts, [Score(1.0)] * 4, pad_id=0)


def test_a_group_is_one_row_with_the_prompt_once_and_positions_restarting_per_response():
    packed = pack_groups(_two_groups(), pad_id=0)
    assert packed.input_ids.tolist() == [[5, 6, 7, 10, 11, 12], [8, 9, 13, 14, 15, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 2, 3, 4, 0]]
    assert packed.tokens == 11 and packed.positions == 12
    mask = packed.attention_mask[:, 0]
    # response 2 of group a (position 5) sees the prompt and itself, not response 1 (positions 3-4)
    assert mask[0, 5].tolist() == [True, True, True, False, False, True]
    assert mask[0, 4].tolist() == [True, True, True, True, True, False]
    assert mask[1, 5].tolist() == [False] * 5 + [True]  # padding sees only itself
    # (sample, target column) <- (row, predictor position): a response's first token from the prompt's end
    pairs = list(zip(packed.sample.tolist(), packed.column.tolist(), packed.row.tolist(), packed.position.tolist()))
    assert pairs == [(0, 2, 0, 2), (0, 3, 0, 3), (1, 2, 0, 2), (2, 1, 1, 1), (2, 2, 1, 2), (2, 3, 1, 3)]


def _group_with_a_fork():
    """env.tito=fork on an agent: trajectory 0 rewrote its history, so its last sample starts from the rebuilt
    call (another prompt, same id) and its fork (the sample before the rewrite, fork_of=0) has the first prompt."""
    a, rebuilt, b = Prompt("a", "", [5, 6, 7]), Prompt("a", "", [5, 6, 9, 9]), Prompt("b", "", [8, 9])
    rollouts = [
        Rollout(rebuilt, 0, [10, 11], "", [-1.0] * 2, "stop", [0] * 2),
        Rollout(a, 1, [12], "", [-1.0], "stop", [0]),
        Rollout(a, 2, [13, 14], "", [-1.0] * 2, "stop", [0] * 2, fork_of=0),
        Rollout(b, 0, [13, 14, 15], "", [-1.0] * 3, "stop", [0] * 3),
    ]
    return make_experience(rollouts, [Score(1.0), Score(0.0), Score(1.0), Score(1.0)], pad_id=0)


def test_a_sample_whose_prompt_differs_from_its_groups_gets_a_row_of_its_own():
    exp = _group_with_a_fork()
    assert exp.group_ids.tolist() == [0, 0, 0, 1] and exp.forks is not None and exp.forks.tolist()[2]
    packed = pack_groups(exp, pad_id=0)
    # the rebuilt call's sample alone; the other trajectory and the fork share the first prompt; then group b
    assert packed.input_ids.tolist() == [[5, 6, 9, 9, 10, 11], [5, 6, 7, 12, 13, 14], [8, 9, 13, 14, 15, 0]]
    assert packed.position_ids[1].tolist() == [0, 1, 2, 3, 3, 4]
    assert packed_positions(exp) == packed.positions == 3 * 6  # three rows (not two groups) x the widest
    pairs = list(zip(packed.sample.tolist(), packed.column.tolist(), packed.row.tolist(), packed.position.tolist()))
    assert pairs[:3] == [(0, 3, 0, 3), (0, 4, 0, 4), (1, 2, 1, 2)] and pairs[3:5] == [(2, 2, 1, 2), (2, 3, 1, 4)]
    # train.micro_batch_tokens: a unit is a packed row (6, 6 and 5 positions), not the group (counted as 9, over)
    parts = MicroBatcher(rows=4, tokens=6, whole_groups=True).split(torch.arange(4), exp)
    assert sorted(part.tolist() for part in parts) == [[0], [1, 2], [3]]


def test_auto_packs_only_when_it_saves_positions():
    exp = _experience(groups=4, n=4)
    config = type("C", (), {"_attn_implementation": "sdpa"})()
    layout = ForwardLayout("auto", 0, SAMPLED, config, "cpu")
    assert packed_positions(exp) < 0.9 * padded_positions(exp) and layout.chooses_packing(exp)
    single = exp.select(torch.arange(0, 16, 4))  # one sample per group: nothing is shared
    assert not layout.chooses_packing(single)
    assert not ForwardLayout("none", 0, SAMPLED, config, "cpu").chooses_packing(exp)
    assert not ForwardLayout("auto", 0, SAMPLED, config, "cuda").chooses_packing(exp)  # no dense mask on a GPU
    flex = type("C", (), {"_attn_implementation": "flex_attention"})()
    assert ForwardLayout("auto", 0, SAMPLED, flex, "cuda").chooses_packing(exp)  # a block mask instead


def test_packing_groups_on_a_gpu_without_flex_attention_is_refused_naming_the_setting():
    config = type("C", (), {"_attn_implementation": "sdpa", "architectures": ["LlamaForCausalLM"]})()
    with pytest.raises(ConfigError, match="train.packing=groups on a GPU needs model.attention=flex_attention"):
        ForwardLayout("groups", 0, SAMPLED, config, "cuda")
    ForwardLayout("groups", 0, SAMPLED, config, "cpu")  # CPU: SDPA's dense mask, measured equal (tests above)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_and_padded_updates_have_the_same_loss_and_gradients(random_model_dir, attention):
    exp = _experience(groups=4, n=4)
    grads, stats, mismatch = {}, {}, {}
    for packing in ("none", "groups"):
        learner = PolicyLearner(learner_settings(_config(random_model_dir, micro_batch=8, packing=packing)))
        learner.model.config._attn_implementation = attention
        learner.layout.attention = attention
        grads[packing], result = _grads_of_first_step(learner, _experience(groups=4, n=4))
        stats[packing], mismatch[packing] = result.metrics, mismatch_metrics(result.mismatch, 0)
    for padded, packed in zip(grads["none"], grads["groups"]):
        torch.testing.assert_close(packed, padded, atol=2e-5, rtol=1e-4)
    assert stats["groups"]["loss/policy"] == pytest.approx(stats["none"]["loss/policy"], abs=1e-6)
    key = "mismatch/logprob_abs_mean"
    assert mismatch["groups"][key] == pytest.approx(mismatch["none"][key], abs=1e-5)
    assert stats["groups"]["learner/packed_frac"] == 1.0 and stats["none"]["learner/packed_frac"] == 0.0
    assert stats["groups"]["learner/positions"] < stats["none"]["learner/positions"]
    assert 0 <= stats["groups"]["learner/padding_frac"] < stats["none"]["learner/padding_frac"]
    del exp


def test_a_model_that_ignores_the_packed_layout_is_stopped_with_one_message(random_model_dir):
    learner = PolicyLearner(learner_settings(_config(random_model_dir, packing="groups")))
    backbone = learner.model.base_model
    forward = backbone.forward

    def ignores_positions(*args, position_ids=None, **kwargs):  # as a model without position-id support would
        return forward(*args, **kwargs)

    backbone.forward = ignores_positions
    with pytest.raises(
        ConfigError,
        match="forward of LlamaForCausalLM .*group-packed rows.* gives log-probs up to .* "
        "Set train.packing=none or train.logits_chunk=0",
    ):
        learner.update(_experience())


def test_packing_groups_needs_an_attention_that_takes_a_custom_mask(random_model_dir):
    config = type("C", (), {"_attn_implementation": "flash_attention_2", "architectures": ["LlamaForCausalLM"]})()
    with pytest.raises(
        ConfigError,
        match="train.packing=groups needs sdpa or eager or flex_attention attention; LlamaForCausalLM uses "
        "'flash_attention_2'",
    ):
        ForwardLayout("groups", 0, SAMPLED, config, "cpu")


def _long_group() -> Experience:
    """One prompt and two 512-token responses: rows long enough for FlexAttention's 128-position blocks."""
    prompt = Prompt("a", "", [5, 6, 7, 8])
    rollouts = [Rollout(prompt, i, [10 + i] * 512, "", [-1.0] * 512, "stop", [0] * 512) for i in range(2)]
    return make_experience(rollouts, [Score(1.0), Score(0.0)], pad_id=0)


@pytest.mark.parametrize(
    "exp",
    [_two_groups(), _experience(groups=4, n=4), _long_group(), _group_with_a_fork()],
    ids=["ragged", "4x4", "long", "fork"],
)
def test_the_flex_block_mask_allows_exactly_what_the_dense_mask_allows(exp):
    from torch.nn.attention.flex_attention import create_mask

    packed = pack_groups(exp, pad_id=0)
    block = packed.flex_mask("cpu")
    rows, _, width, _ = packed.attention_mask.shape
    assert torch.equal(create_mask(block.mask_mod, rows, 1, width, width, device="cpu"), packed.attention_mask)


def test_the_flex_block_mask_skips_the_blocks_where_one_response_would_see_another():
    from torch.nn.attention.flex_attention import create_block_mask

    packed = pack_groups(_long_group(), pad_id=0)
    width = packed.input_ids.shape[1]
    causal = create_block_mask(lambda b, h, q, k: k <= q, 1, None, width, width, device="cpu")
    assert packed.flex_mask("cpu").sparsity() > causal.sparsity() + 10  # percent of blocks skipped


def test_packed_rows_through_flex_attention_give_the_padded_log_probs(random_model_dir):
    """The forward only: torch has no FlexAttention backward on CPU (benchmarks/gpu_check.sh's learner step checks
    the gradients on a GPU). Compiles flex_attention once (~10 s on 2 cores)."""
    exp = _experience(groups=4, n=4)
    padded = PolicyLearner(learner_settings(_config(random_model_dir, micro_batch=8, packing="none"))).logprobs(exp)
    learner = PolicyLearner(learner_settings(_config(random_model_dir, micro_batch=8, packing="groups")))
    learner.network.set_attn_implementation("flex_attention")  # what model.attention does on a GPU
    learner.layout.attention = "flex_attention"
    packed = learner.logprobs(exp)
    assert learner.layout.take_counts()["learner/packed_frac"] == 1.0
    torch.testing.assert_close(packed[exp.loss_mask.bool()], padded[exp.loss_mask.bool()], atol=2e-5, rtol=1e-4)


def test_flex_attention_is_refused_on_cpu_by_its_key(random_model_dir):
    with pytest.raises(
        ConfigError, match="model.attention=flex_attention: torch .* has no FlexAttention backward on cpu"
    ):
        PolicyLearner(learner_settings(_config(random_model_dir, extra=["model.attention=flex_attention"])))


def test_model_attention_switches_the_learners_kernel(random_model_dir):
    learner = PolicyLearner(
        learner_settings(_config(random_model_dir, extra=["model.attention=eager", "algorithm.kl.coef=0.1"]))
    )
    assert learner.layout.attention == "eager"
    assert learner.reference is not None and learner.reference.config._attn_implementation == "eager"


def _experience_with_forks(groups=4, n=4, vocab=16):
    """`_experience`'s shape where trajectory 0 of every group forked (env.tito=fork on an agent that rewrote its
    history): its last sample starts from a longer, rebuilt prompt, and its fork (the sample before, the first
    prompt, fork_of=0) comes after the group's members with trajectory 0's reward. GRPO advantages as the step's."""
    gen = torch.Generator().manual_seed(1)

    def ids(count):
        return torch.randint(4, vocab, (count,), generator=gen).tolist()

    def sample(prompt, index, length, fork_of=None):
        return Rollout(prompt, index, ids(length), "", [-1.0] * length, "stop", [0] * length, fork_of=fork_of)

    rollouts, scores = [], []
    for g in range(groups):
        prompt = Prompt(f"p{g}", "", ids(3 + g))
        rebuilt = Prompt(f"p{g}", "", prompt.token_ids + ids(2))
        rollouts += [sample(rebuilt if i == 0 else prompt, i, 1 + (g + i) % 5) for i in range(n)]
        rollouts.append(sample(prompt, n, 2, fork_of=0))
        scores += [Score(float((g + i) % 2)) for i in range(n)] + [Score(float(g % 2))]
    exp = make_experience(rollouts, scores, pad_id=0)
    return estimate_advantages(grpo, False, exp, rollouts)


def test_a_forked_sample_takes_its_trajectorys_advantage_and_the_baseline_counts_trajectories():
    exp, n = _experience_with_forks(), 4
    advantages = filled(exp.advantages, "advantages")
    for g in range(4):
        first, fork = g * (n + 1), g * (n + 1) + n
        own = advantages[first][exp.loss_mask[first].bool()]
        assert torch.all(advantages[fork][exp.loss_mask[fork].bool()] == own[0]) and torch.all(own == own[0])
    members = torch.arange(len(exp))[~filled(exp.forks, "forks")]
    kept = exp.select(members)  # the batch without its forks: its trajectories' advantages are the same
    expected, _ = grpo(make_inputs(kept.rewards, kept.loss_mask, kept.group_ids))
    torch.testing.assert_close(advantages[members][kept.loss_mask.bool()], expected[kept.loss_mask.bool()])


def test_packed_and_padded_log_probs_agree_with_a_forked_sample(random_model_dir):
    exp = _experience_with_forks()
    padded = PolicyLearner(learner_settings(_config(random_model_dir, micro_batch=8, packing="none"))).logprobs(exp)
    learner = PolicyLearner(learner_settings(_config(random_model_dir, micro_batch=8, packing="groups")))
    packed = learner.logprobs(exp)
    assert learner.layout.take_counts()["learner/packed_frac"] == 1.0
    torch.testing.assert_close(packed[exp.loss_mask.bool()], padded[exp.loss_mask.bool()], atol=2e-5, rtol=1e-4)


def test_an_update_with_forked_samples_runs_packed_as_padded(random_model_dir):
    """The crash this guards: `_pack_group` refused a group whose fork had another prompt (packing auto or groups)."""
    grads, stats = {}, {}
    for packing in ("none", "auto", "groups"):
        learner = PolicyLearner(learner_settings(_config(random_model_dir, micro_batch=8, packing=packing)))
        grads[packing], result = _grads_of_first_step(learner, _experience_with_forks())
        stats[packing] = result.metrics
    assert stats["groups"]["learner/packed_frac"] == 1.0 and stats["none"]["learner/packed_frac"] == 0.0
    assert stats["auto"]["learner/packed_frac"] > 0  # auto packs here: 144 positions packed, 240 padded
    for packing in ("auto", "groups"):
        for padded, packed in zip(grads["none"], grads[packing]):
            torch.testing.assert_close(packed, padded, atol=2e-5, rtol=1e-4)
        assert stats[packing]["loss/policy"] == pytest.approx(stats["none"]["loss/policy"], abs=1e-6)


@pytest.mark.parametrize("mini_batch", [16, 8])
def test_a_step_with_forks_takes_the_optimizer_steps_the_schedule_counts(random_model_dir, mini_batch):
    """Forks add rows (20 rows here for a rollout batch of 16): the step still takes updates_per_step optimizer steps (1 at
    mini_batch=16, 2 at 8), the added rows spread over them, so the learning-rate schedule lasts train.steps and the
    single-update case stays on-policy (no old log-prob pass, `logp.detach()` as old)."""
    learner = PolicyLearner(learner_settings(_config(random_model_dir, micro_batch=8, mini_batch=mini_batch)))
    exp = _experience_with_forks()
    assert len(exp) == 20 and learner.updates_per_step == 16 // mini_batch
    result = learner.update(exp)
    assert learner.scheduler.last_epoch == learner.updates_per_step
    assert math.isfinite(result.metrics["loss/policy"])
