"""A short real local run (tiny random model, HF engine) with `log.samples`: every logged row's reward is the
run's reward function applied to the logged completion, the metrics split mismatch from drift, each sample's
segments carry learner-vs-engine gaps the mismatch metric bounds, and `relayrl report` renders the samples table
and (for a multi-turn run) the trajectory view."""

import html
import json
import re

import pytest
from transformers import AutoTokenizer

from relayrl.build import train
from relayrl.config import load_config
from relayrl.metrics.report import write_report
from relayrl.rewards import load_reward

REWARD = """
def score(prompts, completions, answer, **columns):
    return [{"correct": float(c.strip() == a), "length": 0.01 * len(c)} for c, a in zip(completions, answer)]
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory, random_model_dir, toy_task):
    root = tmp_path_factory.mktemp("samples_run")
    (root / "reward.py").write_text(REWARD)
    config = load_config(
        None,
        [
            f"model.path={random_model_dir}",
            f"data.train={toy_task['train']}",
            "data.max_prompt_tokens=16",
            f"reward.fn={root / 'reward.py'}:score",
            "rollout.engine=hf",
            "rollout.n=4",
            "rollout.prompts_per_step=4",
            "rollout.max_tokens=5",
            "train.steps=3",
            f"log.dir={root / 'run'}",
            "log.progress=false",
            "log.save_model=false",
            "log.samples.every=2",
            "log.samples.max_per_step=6",
        ],
    )
    train(config)
    return root / "run", config


def test_samples_rows_of_logged_steps_carry_the_runs_own_rewards(run, toy_task):
    run_dir, config = run
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0] * 6 + [2] * 6  # every 2nd step and the last, 6 samples each
    answers = {}
    for line in toy_task["train"].read_text().splitlines():
        task = json.loads(line)
        answers[task["prompt"]] = task["answer"]
    reward_fn = load_reward(config.reward.fn)
    recomputed = reward_fn(
        [r["prompt"] for r in rows], [r["completion"] for r in rows], answer=[answers[r["prompt"]] for r in rows]
    )
    for row, expected in zip(rows, recomputed):
        assert row["components"] == pytest.approx(expected)
        assert row["reward"] == pytest.approx(sum(expected.values()))
        assert row["versions"] == [row["step"]] and row["finish_reason"] in ("stop", "length")
        assert isinstance(row["advantage"], float)
    # GRPO: a group's advantages are its rewards standardised, so the better sample has the larger advantage
    group = rows[:4]
    best, worst = max(group, key=lambda r: r["reward"]), min(group, key=lambda r: r["reward"])
    assert best["reward"] == worst["reward"] or best["advantage"] > worst["advantage"]


def test_a_synchronous_run_has_mismatch_and_no_drift(run):
    run_dir, _ = run
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all("mismatch/by_version" not in row for row in metrics)
    assert all(row["drift/token_frac"] == 0.0 and "drift/logprob_abs_max" not in row for row in metrics)
    assert max(row["mismatch/logprob_abs_max"] for row in metrics) < 1e-3  # HF engine and learner agree


def test_report_renders_the_samples_table(run):
    run_dir, _ = run
    page = write_report(run_dir).read_text()
    last = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()][-1]
    assert "<h2>Samples</h2>" in page and "step 0 (6 samples logged)" in page and "step 2 (6 samples logged)" in page
    assert html.escape(last["prompt"]) in page


def test_each_logged_sample_is_one_policy_segment_whose_gaps_the_mismatch_metric_bounds(run):
    run_dir, _ = run
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    metrics = {row["step"]: row for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
    for row in rows:
        (segment,) = row["segments"]
        assert segment["by"] == "policy" and segment["versions"] == [row["step"]]
        assert len(segment["tokens"]) == len(segment["gap"]) == row["tokens"]
        gaps = [abs(gap) for gap in segment["gap"] if gap is not None]
        assert gaps and max(gaps) <= metrics[row["step"]]["mismatch/logprob_abs_max"] * 1.01 + 1e-12


def test_a_multi_turn_run_logs_its_turns_and_the_report_draws_them(tmp_path, random_model_dir, toy_task):
    config = load_config(
        None,
        [
            f"model.path={random_model_dir}",
            f"data.train={toy_task['train']}",
            "data.max_prompt_tokens=16",
            "env.fn=retry",
            "env.max_turns=3",
            "env.max_total_tokens=24",
            "env.kwargs.feedback= 1+1=",
            "rollout.engine=hf",
            "rollout.n=4",
            "rollout.prompts_per_step=2",
            "rollout.max_tokens=4",
            "train.steps=1",
            f"log.dir={tmp_path / 'run'}",
            "log.progress=false",
            "log.save_model=false",
        ],
    )
    train(config)
    rows = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    turns = [[s for s in row["segments"] if s["by"] == "policy"] for row in rows]
    assert max(map(len, turns)) > 1  # some trajectory was retried
    special = AutoTokenizer.from_pretrained(random_model_dir).all_special_tokens  # segments keep them, as sampled
    for row, policy in zip(rows, turns):
        text = "".join(s["text"] for s in row["segments"])
        assert re.sub("|".join(map(re.escape, special)), "", text) == row["completion"]
        env = [s for s in row["segments"] if s["by"] == "env"]
        assert all(s["text"].endswith("1+1=") for s in env) and len(env) >= len(policy) - 1
        assert all("reward" in s for s in policy) and all(s["versions"] == [0] for s in policy)
    page = write_report(tmp_path / "run").read_text()
    assert page.count('<div class="trajectory">') == 4 and page.count('<div class="seg env">') >= 1
