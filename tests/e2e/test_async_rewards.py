"""Async training with two engine replicas scoring concurrently through one reward service (Ray actors as
workers): every sample the learner receives carries the reward of its own completion.

The reward is a deterministic function of the completion text that spreads completions over many values,
so a score landing on another producer's sample shows. The run goes through a small driver that records
each (completion, reward) pair as it enters the rollout buffer (what the learner trains on); the reward
function itself appends each pair it computes to a side file. Nothing here needs learning: the model is the
session's random tiny Llama (no warm start to train).
"""

import json
import subprocess
import sys

import pytest

from benchmarks.learning_cases import write_config

pytestmark = pytest.mark.slow

REWARD = """
import json, os

def fingerprint(completion):
    return float(sum(ord(ch) * (i + 1) for i, ch in enumerate(completion)) % 997) / 997

def reward(prompts, completions, log="", **columns):
    scores = [fingerprint(c) for c in completions]
    with open(log, "a") as out:  # one write per batch: appends from two workers do not interleave
        out.write("".join(json.dumps([c, s]) + "\\n" for c, s in zip(completions, scores)))
    return scores
"""

DRIVER = """
import json, sys
from relayrl.schedules import buffer

put = buffer.RolloutBuffer.put

def recording_put(self, group):
    with open(sys.argv[1], "a") as out:
        out.write("".join(json.dumps([r.response_text, s.reward]) + "\\n" for r, s in zip(group.rollouts, group.scores)))
    put(self, group)

buffer.RolloutBuffer.put = recording_put

if __name__ == "__main__":
    from relayrl.cli import main
    sys.exit(main(sys.argv[2:]))
"""


def fingerprint(completion: str) -> float:
    return float(sum(ord(ch) * (i + 1) for i, ch in enumerate(completion)) % 997) / 997


def pairs(path) -> list[tuple[str, float]]:
    return [tuple(json.loads(line)) for line in path.read_text().splitlines()]


def test_two_engines_score_concurrently_and_each_sample_keeps_its_reward(
    tmp_path, random_model_dir, toy_task, ray_address
):
    (tmp_path / "reward.py").write_text(REWARD)
    (tmp_path / "driver.py").write_text(DRIVER)
    scored_log, buffered_log, run_dir = tmp_path / "scored.jsonl", tmp_path / "buffered.jsonl", tmp_path / "run"
    config = write_config(tmp_path / "cfg.yaml", random_model_dir, toy_task, run_dir, "vllm")
    result = subprocess.run(
        [
            sys.executable,
            str(tmp_path / "driver.py"),
            str(buffered_log),
            "train",
            str(config),
            f"reward.fn={tmp_path / 'reward.py'}:reward",
            f"reward.kwargs={{log: {scored_log}}}",
            "reward.workers=2",
            "reward.batch_size=2",
            "placement.mode=ray",
            f"placement.address={ray_address}",
            "placement.engines=2",
            "placement.learner_cpus=1",
            "placement.engine_cpus=0.5",
            "train.schedule=async",
            "train.max_staleness=1",
            "train.on_stale=wait",
            "algorithm.correction.mode=tis_token",
            "train.steps=3",
            "rollout.prompts_per_step=8",
            "eval.max_prompts=16",
            "log.save_model=false",
            "log.progress=false",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )  # batch_size=2: many tasks, so the two producers' calls overlap
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # (a step's reward/* counts cover the chunks scored since the previous step: possibly none)
    assert len(rows) == 3 and not any(r.get("reward/errors") or r.get("reward/timeouts") for r in rows)

    buffered = pairs(buffered_log)
    assert len(buffered) >= 3 * 8 * 8  # at least the three steps' samples went through the buffer
    wrong = [(text, got, fingerprint(text)) for text, got in buffered if got != fingerprint(text)]
    assert not wrong, wrong[:5]
    # every buffered sample was scored by the function (the evaluations are scored too, and a producer may
    # have scored a last chunk that the run ended before buffering)
    scored = pairs(scored_log)
    assert all(score == fingerprint(text) for text, score in scored)
    assert len(scored) >= len(buffered) and len({text for text, _ in buffered}) > 10
