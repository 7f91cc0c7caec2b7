"""`train.micro_batch_tokens`: micro-batches filled by forward positions, not counted in samples.

The loss must not notice the split: identical gradients for token-budget and count micro-batching on ragged
lengths, for every `algorithm.loss_agg`, padded and group-packed.
"""

from __future__ import annotations

import pytest
import torch

from relayrl.algorithms.advantages import grpo, make_inputs
from relayrl.config import dump_config, load_config
from relayrl.errors import ConfigError
from relayrl.learner.batching import MicroBatcher, even_out, make_experience
from relayrl.learner.policy import PolicyLearner
from relayrl.placement.sections import learner_settings
from relayrl.types import Prompt, Rollout, Score
from tests.unit.test_learner import _config, _grads_of_first_step

LOSS_AGGS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


def _ragged(groups=4, n=4, vocab=16):
    """Prompts of 2..8 tokens, responses of 1..14: no two micro-batches of a count split have the same width."""
    gen = torch.Generator().manual_seed(7)
    rollouts, scores = [], []
    for g in range(groups):
        prompt = Prompt(id=f"p{g}", text="", token_ids=torch.randint(4, vocab, (2 + 2 * g,), generator=gen).tolist())
        for i in range(n):
            length = 1 + (5 * g + 3 * i) % 14
            response = torch.randint(4, vocab, (length,), generator=gen).tolist()
            rollouts.append(Rollout(prompt, i, response, "", [-1.0] * length, "stop", [0] * length))
            scores.append(Score(float((g * n + i) % 3 == 0)))
    exp = make_experience(rollouts, scores, pad_id=0)
    exp.advantages, _ = grpo(make_inputs(exp.rewards, exp.loss_mask, exp.group_ids))
    return exp


def test_a_token_budget_fills_micro_batches_by_positions_and_isolates_an_over_budget_sample():
    exp = _ragged()
    lengths = exp.attention_mask.sum(dim=1)
    batcher = MicroBatcher(rows=16, tokens=16)
    with pytest.warns(RuntimeWarning, match="over train.micro_batch_tokens=16"):
        parts = batcher.split(torch.randperm(16), exp)
    assert sorted(torch.cat(parts).tolist()) == list(range(16))  # every sample once
    for part in parts:
        assert len(part) * int(lengths[part].max()) <= 16 or len(part) == 1
    over = [part for part in parts if int(lengths[part].max()) > 16]
    assert over and all(len(part) == 1 for part in over)
    counts = batcher.take_counts()
    assert counts == {"learner/micro_batches": len(parts), "learner/over_budget_units": len(over)}
    grouped = MicroBatcher(rows=16, tokens=70, whole_groups=True).split(torch.randperm(16), exp)
    assert len(grouped) < 4 and any(len(part) == 4 for part in grouped)  # several groups share, one is alone
    assert all(len(part) == 4 * len(set(exp.group_ids[part].tolist())) for part in grouped)  # whole groups only


@pytest.mark.parametrize("packing", ["none", "groups"])
@pytest.mark.parametrize("loss_agg", LOSS_AGGS)
def test_token_budget_and_count_micro_batches_give_identical_gradients(random_model_dir, loss_agg, packing):
    extra = [f"algorithm.loss_agg={loss_agg}", "rollout.max_tokens=16", "algorithm.entropy_coef=0.01"]
    count = PolicyLearner(learner_settings(_config(random_model_dir, micro_batch=5, packing=packing, extra=extra)))
    budget = PolicyLearner(
        learner_settings(_config(random_model_dir, micro_batch_tokens=18, packing=packing, extra=extra))
    )
    with pytest.warns(RuntimeWarning, match="micro-batch of its own"):  # 18 positions: under the longest samples
        grads_budget, budget_result = _grads_of_first_step(budget, _ragged())
    grads_count, count_result = _grads_of_first_step(count, _ragged())
    stats_budget, stats_count = budget_result.metrics, count_result.metrics
    assert stats_budget["learner/micro_batches"] > 1 and stats_budget["learner/over_budget_units"] >= 1
    assert any(g.abs().sum() > 0 for g in grads_count)
    for a, b in zip(grads_count, grads_budget):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)
    assert stats_budget["loss/policy"] == pytest.approx(stats_count["loss/policy"], abs=1e-6)
    assert stats_budget["actor/entropy"] == pytest.approx(stats_count["actor/entropy"], rel=1e-5)


def test_setting_both_micro_batch_keys_is_an_error_naming_both_and_a_dump_reloads(tmp_path):
    with pytest.raises(ConfigError, match="train.micro_batch or train.micro_batch_tokens, not both"):
        load_config(None, ["train.micro_batch=4", "train.micro_batch_tokens=512"])
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(load_config(None, ["train.micro_batch_tokens=512"])))
    assert load_config(path, []).train.micro_batch_tokens == 512


def test_the_planner_sizes_activations_from_the_token_budget():
    from relayrl.planner.estimate import workload_from_config

    base = ["rollout.prompts_per_step=8", "rollout.n=8", "data.max_prompt_tokens=64", "rollout.max_tokens=192"]
    count = workload_from_config(load_config(None, base + ["train.micro_batch=16"]))
    budget = workload_from_config(load_config(None, base + ["train.micro_batch_tokens=1024"]))
    assert (count.micro_batch, budget.micro_batch) == (16, 4)  # 1024 positions hold 4 rows of 256
    longest = workload_from_config(load_config(None, base + ["train.micro_batch_tokens=100"]))
    assert longest.micro_batch == 1  # one sequence over the budget still takes a micro-batch


def test_ranks_even_out_their_micro_batch_counts_by_halving_the_widest():
    parts = [torch.tensor([0, 1, 2, 3, 4]), torch.tensor([5])]
    evened = even_out(parts, target=4)
    assert [p.tolist() for p in evened] == [[0, 1], [2], [3, 4], [5]]
    assert even_out(parts) == parts  # one process: nothing to match
    with pytest.raises(ValueError, match="cannot make 7 micro-batches of 6 samples"):
        even_out(parts, target=7)
