"""Multi-turn training end to end: `env.fn=retry` through `relayrl train` (sync schedule, HF engine, a tiny random
model): trajectories of several turns reach the learner with observation tokens masked, the env/tito metrics
are logged every step, and held-out evaluation runs trajectories. It checks the wiring, not learning (the
learning figures of examples/multiturn_retry are measured by benchmarks/multiturn.py --learn)."""

from __future__ import annotations

import json

import yaml

from relayrl.api import train


def test_a_retry_run_trains_on_trajectories(tmp_path, random_model_dir):
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {
        "model": {"path": str(random_model_dir)},
        "data": {"train": str(tmp_path / "train.jsonl"), "eval": str(tmp_path / "train.jsonl"), "max_prompt_tokens": 8},
        "env": {"fn": "retry", "kwargs": {"feedback": " 1+1="}, "max_turns": 3, "max_total_tokens": 24},
        "rollout": {"engine": "hf", "n": 2, "prompts_per_step": 4, "max_tokens": 4},
        "eval": {"max_prompts": 4},
        "train": {"steps": 2, "lr": 1e-4},
        "log": {"dir": str(tmp_path / "run"), "progress": False, "save_model": False},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    result = train(str(tmp_path / "config.yaml"))
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    last = metrics[-1]
    assert last["env/turns_mean"] > 1 and 0 < last["response/obs_token_frac"] < 1
    assert last["tito/prefix_mismatch"] == 0 and "time/env" in last
    assert set(result.after) >= {"greedy", "success", "turns_mean"}
