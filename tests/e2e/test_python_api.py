"""End to end through the Python API, as a notebook would run it: the toy task's rows built in memory, a reward
function defined in this file, `relayrl.train(...)`, and held-out greedy accuracy that rises.

The numbers are grpo_vllm's (benchmarks/learning_cases.py: 20 steps, gain >= 0.05; 0.15-0.26 over 5 seeds): the
same run, reached through `relayrl.train` with in-memory data and a user function instead of a YAML config.
"""

from __future__ import annotations

import json

import pytest
import yaml

import relayrl
from benchmarks.learning_cases import CASES

pytestmark = pytest.mark.slow


def exact_answer(prompts, completions, answer, **columns):
    """The user's reward: 1 for the right sum (module level, so it is importable by name)."""
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


def read_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_train_from_a_notebook_raises_held_out_accuracy(tmp_path, warm_model_dir, toy_task):
    train_rows, eval_rows = read_rows(toy_task["train"]), read_rows(toy_task["eval"])[:200]
    config = {
        "model": {"path": str(warm_model_dir)},
        "data": {"max_prompt_tokens": 16},
        "rollout": {"engine": "vllm", "n": 8, "prompts_per_step": 32, "max_tokens": 6},  # its threshold: vLLM
        "train": {"steps": 20, "lr": 5e-5, "warmup_steps": 2, "micro_batch": 128},
        "log": {"dir": str(tmp_path / "run"), "progress": False, "save_model": False},
    }
    result = relayrl.train(config, reward=exact_answer, train_data=train_rows, eval_data=eval_rows)

    gain = round(result.after["greedy"] - result.before["greedy"], 6)
    print(result)
    assert gain >= CASES["grpo_vllm"].min_gain, (result.before, result.after, CASES["grpo_vllm"].spread)
    assert result.run_dir == tmp_path / "run" and result.metrics["step"] == 19
    saved = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    assert saved["reward"]["fn"] == f"{__name__}:exact_answer"
    assert read_rows(tmp_path / "run" / "data" / "train.jsonl") == train_rows
    assert saved["data"]["train"] == str(tmp_path / "run" / "data" / "train.jsonl")
