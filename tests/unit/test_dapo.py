"""DAPO's dynamic sampling, overlong filtering and soft overlong punishment, worked out by hand."""

import pytest
import torch

from relayrl.algorithms.dapo import GroupCollector, informative, overlong_mask, soft_overlong_penalty, split_groups
from relayrl.types import Prompt, Rollout, Score


def _rollout(prompt_id: str, index: int, finish_reason: str = "stop") -> Rollout:
    prompt = Prompt(id=prompt_id, text=prompt_id, token_ids=[1])
    return Rollout(prompt, index, [5, 6], "ab", [-0.1, -0.2], finish_reason, [0, 0])


def _round(groups: dict[str, list[float]]) -> tuple[list[Rollout], list[Score]]:
    """{prompt id: its responses' rewards} -> prompt-major rollouts and aligned scores, as the engine gives."""
    rollouts = [_rollout(pid, i) for pid, rewards in groups.items() for i in range(len(rewards))]
    scores = [Score(reward) for rewards in groups.values() for reward in rewards]
    return rollouts, scores


def _ids(rollouts):
    return [r.sample_id for r in rollouts]


def test_split_groups_two_groups_of_three():
    rollouts, scores = _round({"a": [1.0, 0.0, 1.0], "b": [0.0, 0.0, 0.5]})
    groups = split_groups(rollouts, scores)
    assert [_ids(rs) for rs, _ in groups] == [["a#0", "a#1", "a#2"], ["b#0", "b#1", "b#2"]]
    assert [[s.reward for s in ss] for _, ss in groups] == [[1.0, 0.0, 1.0], [0.0, 0.0, 0.5]]


def test_split_groups_rejects_batches_that_are_not_prompt_major():
    rollouts, scores = _round({"a": [1.0, 0.0, 1.0]})
    with pytest.raises(ValueError, match="3 rollouts but 2 scores"):
        split_groups(rollouts, scores[:2])
    with pytest.raises(ValueError, match=r"row 0 \(a#1\)"):  # a batch cannot start mid-group
        split_groups(rollouts[1:], scores[1:])
    with pytest.raises(ValueError, match=r"row 1 \(a#2\)"):  # a#1 is missing
        split_groups([rollouts[0], rollouts[2]], [scores[0], scores[2]])
    with pytest.raises(ValueError, match=r"row 1 \(b#1\)"):  # b#1 follows a#0 but belongs to another prompt
        split_groups([rollouts[0], _rollout("b", 1)], scores[:2])


def test_informative_is_false_only_for_flat_groups():
    assert not informative([Score(1.0), Score(1.0), Score(1.0)])  # all correct
    assert not informative([Score(0.0), Score(0.0)])  # all wrong
    assert not informative([Score(0.7)])  # one response has nothing to compare with
    assert informative([Score(1.0), Score(0.0), Score(1.0)])
    # a spread of 0.25 (exact in binary) is above eps=0.2 but not above eps=0.25
    assert informative([Score(0.5), Score(0.75)], eps=0.2)
    assert not informative([Score(0.5), Score(0.75)], eps=0.25)


def test_group_collector_keeps_the_earliest_informative_groups_until_full():
    collector = GroupCollector(target_groups=3, max_rounds=4)
    assert not collector.full and not collector.exhausted
    with pytest.raises(RuntimeError, match="0/3 groups after 0/4 rounds"):
        collector.take()

    collector.add(*_round({"a": [1.0, 1.0], "b": [0.0, 1.0], "c": [0.0, 0.0]}))  # keeps b; drops a, c
    assert collector.metrics() == {
        "dynamic/rounds": 1.0,
        "dynamic/kept_groups": 1.0,
        "dynamic/dropped_groups": 2.0,
        "dynamic/filled": 0.0,
    }
    collector.add(*_round({"d": [0.5, 0.5], "e": [0.0, 0.0]}))  # keeps none; drops d, e
    assert not collector.full and not collector.exhausted  # 1/3 groups, 2/4 rounds
    # keeps f, h, i (the batch overshoots to 4 kept groups); drops g
    collector.add(*_round({"f": [1.0, 0.0], "g": [1.0, 1.0], "h": [0.0, 0.5], "i": [1.0, 0.0]}))
    assert collector.full and not collector.exhausted  # 4 >= 3 groups after 3/4 rounds
    # 3 rounds; kept b, f, h, i = 4; dropped a, c, d, e, g = 5
    assert collector.metrics() == {
        "dynamic/rounds": 3.0,
        "dynamic/kept_groups": 4.0,
        "dynamic/dropped_groups": 5.0,
        "dynamic/filled": 1.0,
    }

    rollouts, scores = collector.take()  # exactly 3 groups, the earliest: b, f, h (i is discarded)
    assert _ids(rollouts) == ["b#0", "b#1", "f#0", "f#1", "h#0", "h#1"]
    assert [s.reward for s in scores] == [0.0, 1.0, 1.0, 0.0, 0.0, 0.5]
    assert len(split_groups(rollouts, scores)) == 3  # still prompt-major for the rest of the step


def test_group_collector_exhausted_before_full_returns_what_it_has():
    collector = GroupCollector(target_groups=2, max_rounds=2)
    collector.add(*_round({"a": [0.0, 0.0], "b": [1.0, 0.0]}))  # keeps b; drops a
    collector.add(*_round({"c": [1.0, 1.0]}))  # drops c
    assert collector.exhausted and not collector.full  # 2/2 rounds, 1/2 groups
    assert collector.metrics() == {
        "dynamic/rounds": 2.0,
        "dynamic/kept_groups": 1.0,
        "dynamic/dropped_groups": 2.0,
        "dynamic/filled": 0.0,
    }
    rollouts, scores = collector.take()  # the smaller batch: b only, never padded with the flat a or c
    assert _ids(rollouts) == ["b#0", "b#1"]
    assert [s.reward for s in scores] == [1.0, 0.0]
    with pytest.raises(RuntimeError, match="after max_rounds=2"):
        collector.add(*_round({"d": [1.0, 0.0]}))


def test_group_collector_with_only_flat_groups_takes_nothing():
    collector = GroupCollector(target_groups=1, max_rounds=1)
    collector.add(*_round({"a": [1.0, 1.0]}))
    assert collector.take() == ([], [])  # the caller skips the update
    assert collector.metrics()["dynamic/filled"] == 0.0


def test_group_collector_rejects_empty_targets():
    with pytest.raises(ValueError, match="target_groups=0, max_rounds=1"):
        GroupCollector(target_groups=0, max_rounds=1)
    with pytest.raises(ValueError, match="target_groups=2, max_rounds=0"):
        GroupCollector(target_groups=2, max_rounds=0)


def test_overlong_mask_zeroes_truncated_responses():
    rollouts = [
        _rollout("a", 0, "stop"),
        _rollout("a", 1, "length"),
        _rollout("b", 0, "stop"),
        _rollout("b", 1, "length"),
    ]
    mask = overlong_mask(rollouts)
    assert mask.tolist() == [1.0, 0.0, 1.0, 0.0]
    loss_mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])  # [B=4, T-1=2]
    assert (loss_mask * mask[:, None]).tolist() == [[1.0, 1.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.0]]


def test_soft_overlong_penalty_by_hand():
    # L_max = 8, L_cache = 4: no penalty up to 8 - 4 = 4 tokens, then (4 - |y|) / 4, and -1 past 8
    # |y| = 0, 4 -> 0;  5 -> -1/4;  6 -> -2/4;  7 -> -3/4;  8 -> -4/4;  9 -> -1 (over L_max)
    expected = [0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0]
    assert soft_overlong_penalty([0, 4, 5, 6, 7, 8, 9], max_tokens=8, buffer=4).tolist() == expected
    penalty = soft_overlong_penalty(torch.tensor([0, 4, 5, 6, 7, 8, 9]), max_tokens=8, buffer=4)
    assert penalty.dtype == torch.float32 and penalty.tolist() == expected
    # added to rewards: a correct 7-token answer keeps 1 - 3/4
    assert (torch.tensor([1.0, 1.0]) + soft_overlong_penalty([3, 7], 8, 4)).tolist() == [1.0, 0.25]
    # buffer == max_tokens: the ramp starts at 0 tokens, |y| = 2 -> (0 - 2) / 8
    assert soft_overlong_penalty([0, 2], max_tokens=8, buffer=8).tolist() == [0.0, -0.25]


@pytest.mark.parametrize("buffer", [0, -1, 9])
def test_soft_overlong_penalty_rejects_invalid_buffers(buffer):
    with pytest.raises(ValueError, match=f"buffer={buffer}, max_tokens=8"):
        soft_overlong_penalty([4], max_tokens=8, buffer=buffer)
