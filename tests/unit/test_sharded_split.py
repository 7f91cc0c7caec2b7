"""How a step's batch is divided among learner ranks and joined again, and the config checks (no processes)."""

import itertools
import random

import pytest
import torch

from relayrl.errors import ConfigError, PlacementError
from relayrl.learner.process_group import (
    PADDING_GROUP,
    balanced_cuts,
    merge_experience,
    merge_results,
    merge_stats,
    rank_settings,
    sample_rows_of,
    share_bounds,
    split_by_groups,
)
from relayrl.learner.result import UpdateResult
from relayrl.placement.sections import learner_settings
from tests.unit.test_sharded_scenarios import config, experience, forked_experience


def test_each_rank_takes_whole_groups_in_order_and_the_parts_join_back():
    exp = experience()  # 4 groups of 4, ragged
    parts = split_by_groups(exp, 2)
    assert [p.group_ids.tolist() for p in parts] == [[0] * 4 + [1] * 4, [2] * 4 + [3] * 4]
    for part in parts:
        part.old_logprobs = part.loss_mask * 2.0  # what each rank's prepare fills in, at its own width
    joined = merge_experience(exp, parts)
    assert torch.equal(joined.old_logprobs, exp.loss_mask * 2.0)


def test_groups_of_different_sizes_are_split_whole_and_the_smaller_share_is_padded():
    """Groups of 5, 4, 6 and 4 rows (forks): 9 and 10 rows; rank 0's padding row trains nothing and is left out when
    the parts join."""
    exp, _ = forked_experience()
    exp.advantages = torch.ones_like(exp.loss_mask)
    assert share_bounds(exp, 2) == [(0, 9), (9, 19)]
    first, second = split_by_groups(exp, 2)
    assert len(first) == len(second) == 10
    assert first.group_ids.tolist() == [0] * 5 + [1] * 4 + [PADDING_GROUP]
    assert second.group_ids.tolist() == [2] * 6 + [3] * 4
    pad = first.select(torch.tensor([9]))
    shortest = int(exp.attention_mask[:9].sum(dim=1).argmin())
    assert torch.equal(pad.input_ids[0], exp.input_ids[shortest, : pad.input_ids.shape[1]])
    assert pad.loss_mask.sum() == 0 and pad.advantages.sum() == 0 and not pad.forks.any()
    assert exp.loss_mask[shortest].sum() > 0 and exp.group_ids.min() == 0  # the batch itself is untouched
    for part in (first, second):
        part.old_logprobs = part.loss_mask * 2.0
        part.old_logprobs[part.group_ids == PADDING_GROUP] = 7.0  # what a rank computes for its padding
    assert torch.equal(merge_experience(exp, [first, second]).old_logprobs, exp.loss_mask * 2.0)
    assert sample_rows_of([first, second], 12) == [9, 3]  # the batch's first 12 rows: not rank 0's padding


def test_shares_are_as_even_as_contiguous_whole_groups_allow():
    """Against every way to cut the groups into W non-empty contiguous runs: the largest share is the least."""
    rng = random.Random(0)
    for _ in range(300):
        sizes = [rng.randint(1, 8) for _ in range(rng.randint(1, 9))]
        world = rng.randint(1, len(sizes))
        starts = balanced_cuts(sizes, world)
        assert len(starts) == world and starts[0] == 0 and starts == sorted(set(starts))
        best = min(_largest(sizes, [0, *cuts]) for cuts in itertools.combinations(range(1, len(sizes)), world - 1))
        assert _largest(sizes, starts) == best, (sizes, world)


def _largest(sizes: list[int], starts: list[int]) -> int:
    ends = [*starts[1:], len(sizes)]
    return max(sum(sizes[s:e]) for s, e in zip(starts, ends))


def test_groups_of_one_size_are_split_as_before():
    exp = experience(groups=6)  # 6 groups of 4
    assert share_bounds(exp, 3) == [(0, 8), (8, 16), (16, 24)]
    assert [len(p) for p in split_by_groups(exp, 3)] == [8, 8, 8]


def test_fewer_groups_than_ranks_is_refused():
    exp = experience(groups=1)
    with pytest.raises(
        PlacementError, match="placement.learner_ranks=2 needs at least 2 groups in a step, this one has 1"
    ):
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
