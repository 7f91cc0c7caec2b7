"""An agent written only against the `openai` client learns through `env.agent`, end to end through the CLI: the
retry task of test_multiturn_learns.py (a wrong answer hears "+" and may answer once more, the second attempt
worth half), here as examples/openai_agent/agent.py, on the demo's warm start. Held-out greedy success rises
within 15 steps; every step's engine-vs-learner log-prob gap stays under 1e-3 on the agent's tokens. Gains over
seeds and the threshold: benchmarks/learning_cases.py (`agent_retry`)."""

import json

import pytest

from benchmarks.learning_cases import CASES, gain, run_in_process, write_config

pytestmark = pytest.mark.slow


def test_an_openai_client_agent_raises_held_out_success(tmp_path, warm_model_dir, toy_task):
    run_dir = tmp_path / "run"
    case = CASES["agent_retry"]
    config = write_config(tmp_path / "cfg.yaml", warm_model_dir, toy_task, run_dir, case.engine)
    result = run_in_process("train", str(config), *case.overrides)
    assert result.returncode == 0, result.stderr[-3000:]

    scores = json.loads((run_dir / "eval.json").read_text())
    assert gain(scores) >= case.min_gain, (scores, case.spread)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 15 and all(1 <= r["env/turns_mean"] <= 2 for r in rows)
    assert max(r["mismatch/logprob_abs_max"] for r in rows) <= 1e-3
    assert all(r["env/errors"] == 0 and r["env/timeouts"] == 0 for r in rows)
    assert all(0 < r["response/obs_token_frac"] < 1 for r in rows if r["env/turns_max"] == 2)
