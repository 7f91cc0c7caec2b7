"""How a step's batch is divided among learner ranks and joined again, and the config checks (no processes)."""

import pytest
import torch

from relayrl.errors import ConfigError, PlacementError
from relayrl.learner.process_group import (
    merge_experience,
    merge_results,
    merge_stats,
    rank_settings,
    sample_rows_of,
    split_by_groups,
)
from relayrl.learner.result import UpdateResult
from relayrl.placement.sections import learner_settings
from tests.unit.test_sharded_scenarios import config, experience


def test_each_rank_takes_whole_groups_in_order_and_the_parts_join_back():
    exp = experience()  # 4 groups of 4, ragged
    parts = split_by_groups(exp, 2)
    assert [p.group_ids.tolist() for p in parts] == [[0] * 4 + [1] * 4, [2] * 4 + [3] * 4]
    for part in parts:
        part.old_logprobs = part.loss_mask * 2.0  # what each rank's prepare fills in, at its own width
    joined = merge_experience(exp, parts)
    assert torch.equal(joined.old_logprobs, exp.loss_mask * 2.0)


def test_ranks_need_the_same_number_of_rows():
    exp = experience(groups=3)
    with pytest.raises(PlacementError, match="placement.learner_ranks=2 must divide the step's groups"):
        split_by_groups(exp, 2)


def test_stats_add_losses_and_weigh_means_by_tokens():
    stats = [
        {"loss/policy": 0.25, "actor/entropy": 1.0, "actor/ratio_max": 1.5, "lr": 0.1},
        {"loss/policy": 0.5, "actor/entropy": 4.0, "actor/ratio_max": 1.2, "lr": 0.1},
    ]
    merged = merge_stats(stats, tokens=[3.0, 1.0])
    assert merged["loss/policy"] == 0.75 and merged["lr"] == 0.1 and merged["actor/ratio_max"] == 1.5
    assert merged["actor/entropy"] == pytest.approx((3 * 1.0 + 1 * 4.0) / 4)


def test_the_ranks_results_join_gaps_by_version_and_the_logged_rows_in_rank_order():
    """The gaps by version add up; each rank sends its share of the logged rows, rank 0's first: the batch's order."""
    results = [
        UpdateResult({"loss/policy": 0.25}, {3: (2.0, 0.5, 4), 2: (1.0, 0.1, 1)}, [[0.1, 0.2], [0.3]]),
        UpdateResult({"loss/policy": 0.5}, {3: (1.0, 0.7, 2)}, [[0.4, 0.5, 0.6]]),
    ]
    merged = merge_results(results, tokens=[3.0, 1.0])
    assert merged.metrics == {"loss/policy": 0.75}
    assert merged.mismatch == {3: (3.0, 0.7, 6), 2: (1.0, 0.1, 1)}
    assert merged.sample_logprobs == [[0.1, 0.2], [0.3], [0.4, 0.5, 0.6]]
    none = [UpdateResult({"loss/policy": 0.25}), UpdateResult({"loss/policy": 0.5})]  # a step that logs no samples
    assert merge_results(none, tokens=[1.0, 1.0]).sample_logprobs is None


def test_each_rank_is_asked_for_its_share_of_the_logged_rows():
    """The step logs the batch's first rows: rank 0's rows come first, then rank 1's; a rank past them sends none."""
    parts = split_by_groups(experience(), 2)  # 8 rows each
    assert sample_rows_of(parts, 0) == [0, 0]
    assert sample_rows_of(parts, 6) == [6, 0]
    assert sample_rows_of(parts, 10) == [8, 2]
    assert sample_rows_of(parts, 100) == [8, 8]


def test_learner_ranks_config_errors_name_the_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"placement.learner_ranks=2 .* needs placement.mode=ray"):
        config(tmp_path, ["placement.learner_ranks=2"])
    odd = config(tmp_path, ["rollout.prompts_per_step=3"])
    with pytest.raises(ConfigError, match=r"rollout.prompts_per_step=3 must divide by placement.learner_ranks=2"):
        rank_settings(learner_settings(odd), 2)
    share = rank_settings(
        learner_settings(config(tmp_path, ["train.mini_batch=8"])), 2
    )  # 16 rows a step, 2 optimizer steps
    assert (share.rollout.prompts_per_step, share.mini_batch, share.updates_per_step) == (2, 4, 2)
