"""`relayrl reward FILE --reward SPEC`: the reward dry-run through the reward service (relayrl/commands/reward.py)."""

from __future__ import annotations

import json
import textwrap

import pytest

from relayrl.cli import main

REWARDS = textwrap.dedent("""
    import time

    def score(prompts, completions, answer, **columns):
        return [{"correct": float(c.strip() == a), "short": 0.5 * (len(c) < 3)} for c, a in zip(completions, answer)]

    def raising(prompts, completions, **columns):
        if "boom" in completions:
            raise ValueError("cannot grade boom")
        return [1.0] * len(completions)

    def hanging(prompts, completions, **columns):
        if "hang" in completions:
            time.sleep(600)
        return [1.0] * len(completions)

    def trl_raising(completions, **kwargs):  # TRL-style: a raise is an error, never "does not apply"
        if any("boom" in c for c in completions):
            raise KeyError("no grader for boom")
        return [1.0] * len(completions)

    def think(completions, **kwargs):  # TRL-style: message lists on messages rows
        return [float(c[0]["content"].startswith("<think>")) if isinstance(c, list) else None for c in completions]
""")


@pytest.fixture
def files(tmp_path):
    (tmp_path / "rewards.py").write_text(REWARDS)

    def write(rows):
        path = tmp_path / "rows.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return str(path)

    return str(tmp_path / "rewards.py"), write


def run(capsys, *argv):
    status = main(["reward", *argv])
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    return status, lines, captured.err


def test_good_rows_print_one_line_each_then_the_summary(files, capsys):
    rewards, write = files
    data = write(
        [
            {"prompt": "1+1=", "completion": "2", "answer": "2"},
            {"messages": [{"role": "user", "content": "2+2="}], "completion": "five", "answer": "4"},
        ]
    )
    status, lines, err = run(capsys, data, "--reward", f"{rewards}:score")
    assert status == 0
    assert lines[0] == {"row": f"{data}:1", "reward": 1.5, "components": {"correct": 1.0, "short": 0.5}}
    assert lines[1] == {"row": f"{data}:2", "reward": 0.0, "components": {"correct": 0.0, "short": 0.0}}
    assert lines[2] == {"reward_mean": 0.75, "n": 2, "skipped": 0, "errors": 0, "timeouts": 0}
    assert "relayrl's convention" in err


def test_trl_style_function_and_kwargs_of_a_builtin(files, capsys):
    rewards, write = files
    data = write(
        [
            {"messages": [{"role": "user", "content": "q"}], "completion": "<think>x</think>y"},
            {"prompt": "q", "completion": "plain"},
        ]
    )
    status, lines, _ = run(capsys, data, "--reward", f"{rewards}:think")
    assert status == 0 and [line["reward"] for line in lines[:2]] == [1.0, 0.0]  # None: does not apply
    assert lines[2]["errors"] == 0
    status, lines, _ = run(capsys, data, "--reward", "regex", "--reward-kwargs", '{"pattern": "<think>.*"}')
    assert [line["reward"] for line in lines[:2]] == [1.0, 0.0]


def test_a_raising_function_is_counted_or_named(files, capsys):
    rewards, write = files
    data = write([{"prompt": "a", "completion": "ok"}, {"prompt": "b", "completion": "boom"}])
    status, lines, _ = run(capsys, data, "--reward", f"{rewards}:raising", "--on-error", "skip")
    assert status == 0 and [line["reward"] for line in lines[:2]] == [1.0, None]
    assert lines[2] == {"reward_mean": 1.0, "n": 2, "skipped": 1, "errors": 1, "timeouts": 0}
    status, lines, err = run(capsys, data, "--reward", f"{rewards}:raising", "--on-error", "error")
    assert status == 2 and lines == []
    assert f"sample {data}:2#0" in err and "ValueError: cannot grade boom" in err


def test_a_raising_trl_style_function_is_an_error_with_its_text_and_max_error_frac_stops(files, capsys):
    rewards, write = files
    data = write([{"prompt": "a", "completion": "ok"}, {"prompt": "b", "completion": "boom"}])
    status, lines, _ = run(capsys, data, "--reward", f"{rewards}:trl_raising")
    assert status == 0 and [line["reward"] for line in lines[:2]] == [1.0, 0.0]
    assert lines[1]["error"] == f"sample {data}:2#0 raised KeyError: 'no grader for boom'"
    assert lines[2] == {"reward_mean": 0.5, "n": 2, "skipped": 0, "errors": 1, "timeouts": 0}
    status, lines, err = run(capsys, data, "--reward", f"{rewards}:trl_raising", "--max-error-frac", "0.5")
    assert status == 2 and lines == []
    assert "failed on 1 of 2 samples" in err and "raised KeyError: 'no grader for boom'" in err
    status, _, err = run(capsys, data, "--reward", f"{rewards}:trl_raising", "--max-error-frac", "2")
    assert status == 2 and "--max-error-frac must be in [0, 1], got 2" in err


def test_a_hanging_function_times_out_in_a_worker(files, capsys):
    rewards, write = files
    data = write(
        [
            {"prompt": "a", "completion": "ok"},
            {"prompt": "b", "completion": "hang"},
            {"prompt": "c", "completion": "fine"},
        ]
    )
    status, lines, _ = run(
        capsys, data, "--reward", f"{rewards}:hanging", "--reward-workers", "1", "--reward-timeout-s", "1"
    )
    assert status == 0 and [line["reward"] for line in lines[:3]] == [1.0, 0.0, 1.0]
    assert lines[3] == {"reward_mean": pytest.approx(2 / 3), "n": 3, "skipped": 0, "errors": 0, "timeouts": 1}


@pytest.mark.parametrize(
    "row, expected",
    [
        ({"prompt": "a", "answer": "1"}, "rows.jsonl:2: 'completion' must be a string"),
        (
            {"prompt": "a", "completion": 7},
            "rows.jsonl:2: 'completion' must be a string (the response to score), got 7",
        ),
        ({"completion": "x"}, "rows.jsonl:2: a row needs exactly one of 'prompt' (string) or 'messages'"),
        ({"prompt": "a", "completion": "x", "completion_ids": "12"}, "rows.jsonl:2: 'completion_ids' must be a list"),
    ],
)
def test_a_bad_row_is_named(files, capsys, row, expected):
    rewards, write = files
    data = write([{"prompt": "fine", "completion": "1", "answer": "1"}, row])
    status, lines, err = run(capsys, data, "--reward", f"{rewards}:score")
    assert status == 2 and lines == [] and expected in err and err.count("\n") == 1


def test_bad_kwargs_and_timeout_without_workers_are_one_line(files, capsys):
    rewards, write = files
    data = write([{"prompt": "a", "completion": "x", "answer": "x"}])
    status, _, err = run(capsys, data, "--reward", f"{rewards}:score", "--reward-kwargs", "{nope")
    assert status == 2 and "--reward-kwargs '{nope' is not valid JSON" in err and err.count("\n") == 1
    status, _, err = run(capsys, data, "--reward", f"{rewards}:score", "--reward-timeout-s", "1")
    assert status == 2 and "--reward-timeout-s > 0 only with --reward-workers" in err and err.count("\n") == 1


def test_the_former_flag_names_still_work_with_one_deprecation_line_each(files, capsys):
    rewards, write = files
    data = write([{"prompt": "a", "completion": "ok"}, {"prompt": "b", "completion": "hang"}])
    status, lines, err = run(
        capsys, data, "--reward", f"{rewards}:hanging", "--workers", "1", "--timeout-s", "1", "--style", "relayrl"
    )
    assert status == 0 and lines[2]["timeouts"] == 1
    for old, new in (
        ("--workers", "--reward-workers"),
        ("--timeout-s", "--reward-timeout-s"),
        ("--style", "--reward-style"),
    ):
        assert f"relayrl: warning: {old} is deprecated; use {new}\n" in err


def test_verl_parquet_layout_scores_with_compute_score_unchanged(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "verl_reward.py").write_text(
        textwrap.dedent("""
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            correct = solution_str.split("####")[-1].strip() == ground_truth
            return {"score": float(correct), "acc": correct, "split": extra_info["split"]}
    """)
    )
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": "2+2?"}],
            "reward_model": {"style": "rule", "ground_truth": "4"},
            "extra_info": {"split": "test", "index": i},
            "completion": text,
        }
        for i, text in enumerate(["so #### 4", "#### 5"])
    ]
    rows = [{**{k: v for k, v in row.items() if k != "prompt"}, "messages": row["prompt"]} for row in rows]
    path = tmp_path / "gsm8k.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    status, lines, err = run(capsys, str(path), "--reward", f"{tmp_path / 'verl_reward.py'}:compute_score")
    assert status == 0 and "verl's convention" in err
    assert lines[0] == {"row": f"{path}:row 0", "reward": 1.0, "components": {"acc": 1.0}}  # 'split' is no number
    assert lines[1]["reward"] == 0.0 and lines[2]["reward_mean"] == 0.5
