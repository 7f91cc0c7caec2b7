"""The trajectory view's data and page: a logged sample cut into policy and env segments with the learner-vs-engine
gap per sampled token and, with a teacher, the student-minus-teacher gap (relayrl/metrics/trajectories.py), and the
report's rendering of the best and worst, coloured by the one or the other."""

from __future__ import annotations

import json
import re

import pytest
import torch

from relayrl.learner.batching import make_experience
from relayrl.metrics.report import write_report
from relayrl.metrics.samples import sample_rows
from relayrl.metrics.trajectories import gap_colour, teacher_colour, trajectories_section
from relayrl.types import Prompt, Rollout, Score

WORDS = {1: "Q", 2: "x", 3: "y", 4: "<obs>", 5: "z", 6: "w", 7: "<s>"}


def decode(ids):
    return "".join(WORDS[i] for i in ids)


def _batch(offsets=(0.01, -0.002, 0.0, 0.3, 1e-4), mask=(1, 1, 0, 1, 1), turn_rewards=((1, 0.0), (4, 1.0))):
    """One multi-turn rollout: two sampled tokens (turn 1, version 3), one observation token, two sampled tokens
    (turn 2, version 4); the learner's log-probs are the behaviour ones plus `offsets`."""
    prompt = Prompt(id="p0", text="Q", token_ids=[7, 1])
    behaviour = [-0.5, -1.0, 0.0, -0.2, -0.1]
    rollout = Rollout(
        prompt=prompt,
        group_index=0,
        response_ids=[2, 3, 4, 5, 6],
        response_text="xy<obs>zw",
        behaviour_logprobs=behaviour,
        finish_reason="stop",
        versions=[3, 3, 0, 4, 4],
        loss_mask=list(mask),
        turn_rewards=list(turn_rewards),
    )
    exp = make_experience([rollout], [Score(1.0)], pad_id=0)
    exp.advantages = torch.ones_like(exp.behaviour_logprobs)
    learner = (exp.behaviour_logprobs + torch.tensor([[0.0, *offsets]])).tolist()  # column 1+k: response token k
    return rollout, exp, learner


def test_a_multi_turn_sample_is_cut_into_policy_and_env_segments_with_per_token_gaps():
    rollout, exp, learner = _batch()
    (row,) = sample_rows(0, [rollout], [Score(1.0)], exp, 4, decode, learner)
    first, env, second = row["segments"]
    assert first == {
        "by": "policy",
        "text": "xy",
        "tokens": ["x", "y"],
        "gap": [pytest.approx(0.01), pytest.approx(-0.002)],
        "versions": [3],
        "reward": 0.0,
    }
    assert env == {"by": "env", "text": "<obs>"}
    assert second["tokens"] == ["z", "w"] and second["versions"] == [4] and second["reward"] == 1.0
    assert second["gap"] == [pytest.approx(0.3), pytest.approx(1e-4, rel=1e-2)]
    assert "".join(s["text"] for s in row["segments"]) == rollout.response_text


def test_two_turns_with_nothing_between_are_two_segments_and_an_untrained_token_has_no_gap():
    rollout, exp, learner = _batch(turn_rewards=((1, 0.5), (4, 1.0)), mask=(1, 1, 1, 1, 1))
    exp.loss_mask[0, 5] = 0.0  # the last token (target column 1 + 4) filtered out of the loss (DAPO's overlong filter)
    (row,) = sample_rows(0, [rollout], [Score(1.0)], exp, 4, decode, learner)
    assert [s["text"] for s in row["segments"]] == ["xy", "<obs>zw"]
    assert [s["reward"] for s in row["segments"]] == [0.5, 1.0]
    assert row["segments"][1]["gap"][-1] is None


def test_a_single_turn_sample_is_one_segment_and_without_a_decoder_no_segments_are_logged():
    rollout, exp, _ = _batch()
    rollout.loss_mask, rollout.turn_rewards = None, None
    exp = make_experience([rollout], [Score(1.0)], pad_id=0)
    exp.advantages = torch.zeros_like(exp.behaviour_logprobs)
    (row,) = sample_rows(0, [rollout], [Score(1.0)], exp, 4, decode)
    (segment,) = row["segments"]
    assert segment["text"] == rollout.response_text and segment["gap"] == [None] * 5  # the learner sent none
    assert "segments" not in sample_rows(0, [rollout], [Score(1.0)], exp, 4)[0]


def test_with_a_teacher_each_policy_token_carries_the_student_minus_teacher_gap():
    rollout, exp, learner = _batch()  # the student (pre-update learner): -0.49, -1.002, (obs), 0.1, -0.0999
    teacher = [-1.0, -0.5, -9.0, -0.5, -0.1]  # per response token; the observation's is never shown
    exp.teacher_logprobs = torch.tensor([[0.0, *teacher]])  # column 1+k: response token k
    exp.loss_mask[0, 5] = 0.0  # the last token not trained
    (row,) = sample_rows(0, [rollout], [Score(1.0)], exp, 4, decode, learner)
    first, env, second = row["segments"]
    # x: the student more sure than the teacher (+), y: less sure (-)
    assert first["teacher_gap"] == [pytest.approx(0.51), pytest.approx(-0.502)]
    assert second["teacher_gap"] == [pytest.approx(0.6), None] and second["gap"][-1] is None
    assert "teacher_gap" not in env
    assert first["gap"] == [pytest.approx(0.01), pytest.approx(-0.002)]  # the engine gap beside it, unchanged
    exp.teacher_logprobs = None  # a run without a teacher: no key at all
    (plain,) = sample_rows(0, [rollout], [Score(1.0)], exp, 4, decode, learner)
    assert not any("teacher_gap" in segment for segment in plain["segments"])


def test_the_teacher_colour_is_orange_above_blue_below_deeper_on_a_log_scale():
    def rgb(colour):
        return tuple(int(c) for c in re.match(r"rgb\((\d+),(\d+),(\d+)\)", colour).groups())

    assert teacher_colour(1e-3) == teacher_colour(-0.01) == teacher_colour(0.0) == "rgb(255,255,255)"
    assert teacher_colour(None) == "transparent"
    assert teacher_colour(3.5) == teacher_colour(50.0) == "rgb(255,127,14)"  # full orange: student more confident
    assert teacher_colour(-3.5) == "rgb(31,119,180)"  # full blue: the teacher more confident
    above = [rgb(teacher_colour(gap)) for gap in (0.03, 0.1, 0.3, 1.0)]
    below = [rgb(teacher_colour(-gap)) for gap in (0.03, 0.1, 0.3, 1.0)]
    assert all(r > b for r, _, b in above) and all(b > r for r, _, b in below)
    blues = [b for _, _, b in above]  # orange deepens: less and less blue
    assert blues == sorted(blues, reverse=True) and len(set(blues)) == 4


def test_the_gap_colour_runs_from_white_to_red_on_a_log_scale():
    reds = [gap_colour(gap) for gap in (1e-9, 1e-6, 1e-4, -1e-2, 0.1, 3.0)]
    assert reds[0] == reds[1] == "rgb(255,255,255)" and reds[-1] == reds[-2] == "rgb(214,39,40)"
    greens = [int(re.match(r"rgb\(\d+,(\d+),", c).group(1)) for c in reds]
    assert greens == sorted(greens, reverse=True) and len(set(greens)) == 4  # darker as |gap| grows
    assert gap_colour(0.0) == "rgb(255,255,255)" and gap_colour(None) == "transparent"


def _row(sample: str, reward: float, token: str = "x", step: int = 2) -> dict:
    segments = [
        {"by": "policy", "text": token, "tokens": [token], "gap": [0.05], "versions": [step]},
        {"by": "env", "text": "<tool_response>4</tool_response>"},
        {"by": "policy", "text": "y", "tokens": ["y"], "gap": [None], "versions": [step], "reward": reward},
    ]
    return {"step": step, "sample": sample, "prompt": "2+2=", "reward": reward, "segments": segments}


def test_the_view_shows_the_best_and_worst_of_the_last_step_escaped():
    rows = [_row("old#0", 9.0, step=0)] + [_row(f"p#{i}", float(i), "<b>" if i == 5 else "x") for i in range(6)]
    page = trajectories_section(rows)
    shown = re.findall(r"<h3>(\w+): sample ([^,]+), reward ([^,]+),", page)
    assert shown == [("best", "p#5", "5"), ("best", "p#4", "4"), ("worst", "p#1", "1"), ("worst", "p#0", "0")]
    assert "old#0" not in page and "<b>" not in page and "&lt;b&gt;" in page
    assert "&lt;tool_response&gt;4&lt;/tool_response&gt;" in page and "turn reward 5" in page
    assert f'style="background:{gap_colour(0.05)}" title="gap +0.05"' in page and 'title="gap not trained"' in page
    assert "teacher" not in page  # a run without a teacher: the engine-gap view alone
    assert trajectories_section([{"step": 0, "reward": 1.0}]) == ""  # rows logged before segments existed


def test_with_teacher_gaps_the_view_colours_by_them_and_shows_both_gaps():
    rows = [_row(f"p#{i}", float(i)) for i in range(4)]
    for row in rows:
        row["segments"][0]["teacher_gap"] = [0.8]
        row["segments"][2]["teacher_gap"] = [None]
    page = trajectories_section(rows)
    assert f'style="background:{teacher_colour(0.8)}" title="teacher gap +0.8 · gap +0.05"' in page
    assert 'style="background:transparent" title="teacher gap not trained · gap not trained"' in page
    assert f"background:{gap_colour(0.05)}" not in page  # not the engine-gap colours
    assert "teacher-student gap" in page and "distill/reverse_kl" in page  # the legend says what the colour is


def test_the_report_page_holds_the_trajectory_view(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward/mean": 0.5}) + "\n")
    (tmp_path / "samples.jsonl").write_text(json.dumps(_row("p#0", 1.0, step=0)) + "\n")
    page = write_report(tmp_path).read_text()
    assert "<h2>Trajectories</h2>" in page and page.index("<h2>Samples</h2>") < page.index("<h2>Trajectories</h2>")
