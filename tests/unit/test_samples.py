"""`samples.jsonl` (relayrl/metrics/samples.py): the rows of a hand-built step, which steps are logged, a
resumed or re-used run directory never duplicating rows, and the report's best/worst table (HTML-escaped)."""

import json

import pytest
import torch

from relayrl.learner.batching import make_experience
from relayrl.metrics.report import write_report
from relayrl.metrics.samples import log_samples, sample_rows
from relayrl.run.jsonl import truncate_after
from relayrl.types import Prompt, Rollout, Score


def _step(rewards=(1.0, 0.0, 0.5, 0.25), texts=("11", "12", "<b>&", "9")):
    """Two groups of two; sample 2 spans versions 3 and 4; token advantages differ within sample 0."""
    prompts = [Prompt("p0", "5+6=", [5, 6, 7]), Prompt("p1", "4+5=", [4, 5, 7])]
    rollouts = [
        Rollout(
            prompts[i // 2],
            i % 2,
            [1] * (i + 1),
            texts[i],
            [-0.5] * (i + 1),
            "stop" if i != 3 else "length",
            [3] * i + [4],
        )
        for i in range(4)
    ]
    scores = [Score(r, {"correct": r, "format": 0.1}) for r in rewards]
    exp = make_experience(rollouts, scores, pad_id=0)
    exp.advantages = torch.zeros_like(exp.loss_mask)
    exp.advantages[exp.loss_mask.bool()] = torch.tensor([2.0, 1.0, 3.0, 4.0, 4.0, 4.0, 7.0, 7.0, 7.0, 7.0])
    return rollouts, scores, exp


def test_rows_hold_text_reward_components_sequence_advantage_versions_and_finish():
    rollouts, scores, exp = _step()
    rows = sample_rows(7, rollouts, scores, exp, max_per_step=3)
    assert [r["sample"] for r in rows] == ["p0#0", "p0#1", "p1#0"]  # the first samples, whole groups first
    assert rows[0] == {
        "step": 7,
        "sample": "p0#0",
        "prompt": "5+6=",
        "completion": "11",
        "reward": 1.0,
        "components": {"correct": 1.0, "format": 0.1},
        "advantage": 2.0,
        "versions": [4],
        "finish_reason": "stop",
        "tokens": 1,
    }
    assert rows[1]["advantage"] == pytest.approx(2.0)  # mean of its tokens' 1.0 and 3.0
    assert rows[2]["versions"] == [3, 4] and rows[2]["advantage"] == pytest.approx(4.0)


def test_a_sample_whose_reward_failed_says_what_it_raised():
    rollouts, scores, exp = _step()
    scores[1] = Score(0.0, error="sample p0#1 raised ValueError: cannot grade")  # reward.on_error=zero
    rows = sample_rows(0, rollouts, scores, exp, 4)
    assert rows[1]["reward_error"] == "sample p0#1 raised ValueError: cannot grade" and rows[1]["reward"] == 0.0
    assert "reward_error" not in rows[0]


def test_a_sample_with_no_trained_token_has_no_advantage():
    rollouts, scores, exp = _step()
    exp.loss_mask[1] = 0.0  # e.g. the DAPO overlong filter
    assert sample_rows(0, rollouts, scores, exp, 4)[1]["advantage"] is None


def _logged_steps(run_dir):
    return [json.loads(line)["step"] for line in (run_dir / "samples.jsonl").read_text().splitlines()]


def test_every_kth_step_and_the_last_are_logged_and_every_0_logs_nothing(tmp_path):
    rollouts, scores, exp = _step()
    for step in range(6):
        log_samples(tmp_path, 2, 2, step, 5, rollouts, scores, exp)
    assert _logged_steps(tmp_path) == [0, 0, 2, 2, 4, 4, 5, 5]
    off = tmp_path / "off"
    off.mkdir()
    for step in range(3):
        log_samples(off, 0, 2, step, 2, rollouts, scores, exp)
    assert not (off / "samples.jsonl").exists()


def test_a_resumed_run_drops_rows_after_its_checkpoint_and_a_cut_row(tmp_path):
    rollouts, scores, exp = _step()
    for step in range(7):
        log_samples(tmp_path, 2, 1, step, 9, rollouts, scores, exp)
    with (tmp_path / "samples.jsonl").open("a") as f:
        f.write('{"step": 7, "sample": "p0')  # killed mid-write
    # resumed from the checkpoint of step 2: steps 3.. run again
    for step in range(3, 10):
        log_samples(tmp_path, 2, 1, step, 9, rollouts, scores, exp)
    assert _logged_steps(tmp_path) == [0, 2, 4, 6, 8, 9]


def test_a_last_row_that_lost_its_newline_is_not_joined_to_the_next(tmp_path):
    rollouts, scores, exp = _step()
    log_samples(tmp_path, 1, 1, 0, 9, rollouts, scores, exp)
    path = tmp_path / "samples.jsonl"
    path.write_text(path.read_text().rstrip("\n"))  # killed between the row and its newline
    log_samples(tmp_path, 1, 1, 1, 9, rollouts, scores, exp)
    assert _logged_steps(tmp_path) == [0, 1]


def test_a_fresh_run_in_a_used_directory_starts_a_new_file(tmp_path):
    (tmp_path / "samples.jsonl").write_text(json.dumps({"step": 0, "reward": 9.0}) + "\n")
    rollouts, scores, exp = _step()
    log_samples(tmp_path, 0, 2, 0, 5, rollouts, scores, exp)
    assert not (tmp_path / "samples.jsonl").exists()


def test_truncate_after_keeps_rows_up_to_the_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in range(5)) + '{"step": 5, "x')
    truncate_after(path, 2)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2]
    truncate_after(tmp_path / "absent.jsonl", 2)
    assert not (tmp_path / "absent.jsonl").exists()


def test_report_shows_best_and_worst_of_first_middle_last_steps_escaped(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(30)))
    rows = []
    for step in (0, 10, 20, 29):
        for i in range(8):
            rows.append(
                {
                    "step": step,
                    "sample": f"p{i}#0",
                    "prompt": "<script>alert(1)</script>",
                    "completion": f"answer {step}-{i} & <i>",
                    "reward": float(i),
                    "components": {},
                    "advantage": i - 3.5,
                    "versions": [step],
                    "finish_reason": "stop",
                    "tokens": 3,
                }
            )
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = write_report(tmp_path).read_text()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "answer 0-7 &amp; &lt;i&gt;" in page and "answer 0-0 &amp;" in page  # best and worst of step 0
    assert "answer 0-4 " not in page  # the middle of the ranking is left out
    assert "step 0 (" in page and "step 20 (" in page and "step 29 (" in page and "step 10 (" not in page


def test_report_without_samples_jsonl_has_no_samples_table(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward/mean": 0.5}) + "\n")
    assert "Samples" not in write_report(tmp_path).read_text()


def test_a_prompt_with_pictures_keeps_their_thumbnails_in_its_row_and_the_report_shows_them(tmp_path):
    import base64
    import io

    from PIL import Image

    rollouts, scores, exp = _step()
    small, large = Image.new("RGB", (32, 32), (220, 30, 30)), Image.new("RGB", (640, 320), (30, 70, 220))
    rollouts[0].prompt.images = [small, large]
    rows = sample_rows(0, rollouts, scores, exp, 4)
    assert "images" not in rows[2]  # the other prompt has none
    pictures = [Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))) for uri in rows[0]["images"]]
    assert pictures[0].size == (32, 32) and pictures[0].getpixel((5, 5)) == (220, 30, 30)  # its own pixels
    assert pictures[1].size == (96, 48) and pictures[1].getpixel((5, 5)) == (30, 70, 220)  # a thumbnail

    rows[1]["images"] = ["https://example.invalid/x.png"]  # never loaded from elsewhere
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward/mean": 0.5}) + "\n")
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    page = write_report(tmp_path).read_text()
    assert page.count('class="sample-image"') == 2 and rows[0]["images"][0] in page
    assert "example.invalid" not in page
