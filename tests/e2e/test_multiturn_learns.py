"""Multi-turn RL learns, end to end through the CLI: the demo's warm start on its toy task, answering through the
built-in `retry` environment (a wrong answer hears "+" and may answer once more; the reward is discounted
per turn), raises held-out greedy success within 15 steps. The warm start never saw the feedback, so its second
attempts rarely help: RL raises first-attempt success and trajectories get shorter. Gains over seeds 0-2 and
the threshold: learning_cases.py (`multiturn_retry`). The examples' own figures (multiturn_retry, calculator,
from their multi-turn warm starts) are measured by `benchmarks/multiturn.py --learn`."""

import json

import pytest

from benchmarks.learning_cases import CASES, gain, run_in_process, write_config

pytestmark = pytest.mark.slow


def test_a_retry_environment_run_raises_held_out_success(tmp_path, warm_model_dir, toy_task):
    run_dir = tmp_path / "run"
    case = CASES["multiturn_retry"]
    config = write_config(tmp_path / "cfg.yaml", warm_model_dir, toy_task, run_dir, case.engine)
    result = run_in_process("train", str(config), *case.overrides)
    assert result.returncode == 0, result.stderr[-3000:]

    scores = json.loads((run_dir / "eval.json").read_text())
    assert gain(scores) >= case.min_gain, (scores, case.spread)
    # greedy held-out is scored by trajectories: a first-attempt success earns 1, a second-attempt one gamma = 0.5
    after = scores["after"]
    second = after["success"] - after["first_turn_success"]
    assert after["greedy"] == pytest.approx(after["first_turn_success"] + 0.5 * second)
    assert scores["after"]["turns_mean"] < scores["before"]["turns_mean"]  # fewer second attempts needed
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 15 and all(1 <= r["env/turns_mean"] <= 2 for r in rows)
    assert all(0 < r["response/obs_token_frac"] < 1 for r in rows if r["env/turns_max"] == 2)
