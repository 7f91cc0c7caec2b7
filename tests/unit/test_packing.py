"""Group packing (relayrl/learner/packing.py, layout.py): the row layout, and that packed and padded forwards
give the learner the same log-probs, losses and gradients over fewer positions."""

import pytest
import torch

from relayrl.errors import ConfigError
from relayrl.learner.batching import make_experience
from relayrl.learner.layout import ForwardLayout, Sampled
from relayrl.learner.packing import pack_groups, packed_positions, padded_positions
from relayrl.learner.policy import PolicyLearner, mismatch_metrics
from relayrl.types import Prompt, Rollout, Score
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


def test_packing_refuses_a_group_whose_samples_have_different_prompts():
    exp = _two_groups()
    exp.input_ids[1, 0] = 9
    with pytest.raises(ValueError, match="sample 1 of a group has a different prompt from sample 0"):
        pack_groups(exp, pad_id=0)


def test_auto_packs_only_when_it_saves_positions():
    exp = _experience(groups=4, n=4)
    config = type("C", (), {"_attn_implementation": "sdpa"})()
    layout = ForwardLayout("auto", 0, SAMPLED, config, "cpu")
    assert packed_positions(exp) < 0.9 * padded_positions(exp) and layout.chooses_packing(exp)
    single = exp.select(torch.arange(0, 16, 4))  # one sample per group: nothing is shared
    assert not layout.chooses_packing(single)
    assert not ForwardLayout("none", 0, SAMPLED, config, "cpu").chooses_packing(exp)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_and_padded_updates_have_the_same_loss_and_gradients(random_model_dir, attention):
    exp = _experience(groups=4, n=4)
    grads, stats = {}, {}
    for packing in ("none", "groups"):
        learner = PolicyLearner(_config(random_model_dir, micro_batch=8, packing=packing))
        learner.model.config._attn_implementation = attention
        learner.layout.attention = attention
        grads[packing], stats[packing] = _grads_of_first_step(learner, _experience(groups=4, n=4))
    for padded, packed in zip(grads["none"], grads["groups"]):
        torch.testing.assert_close(packed, padded, atol=2e-5, rtol=1e-4)
    assert stats["groups"]["loss/policy"] == pytest.approx(stats["none"]["loss/policy"], abs=1e-6)
    mismatch = {packing: mismatch_metrics(stats[packing]["mismatch/by_version"], 0) for packing in stats}
    key = "mismatch/logprob_abs_mean"
    assert mismatch["groups"][key] == pytest.approx(mismatch["none"][key], abs=1e-5)
    assert stats["groups"]["learner/packed_frac"] == 1.0 and stats["none"]["learner/packed_frac"] == 0.0
    assert stats["groups"]["learner/positions"] < stats["none"]["learner/positions"]
    assert 0 <= stats["groups"]["learner/padding_frac"] < stats["none"]["learner/padding_frac"]
    del exp


def test_a_model_that_ignores_the_packed_layout_is_stopped_with_one_message(random_model_dir):
    learner = PolicyLearner(_config(random_model_dir, packing="groups"))
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
        match="train.packing=groups needs sdpa or eager attention; LlamaForCausalLM uses 'flash_attention_2'",
    ):
        ForwardLayout("groups", 0, SAMPLED, config, "cpu")
