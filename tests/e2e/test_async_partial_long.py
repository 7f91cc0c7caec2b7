"""Async partial rollouts run long enough to catch a stall: with max_staleness=1 and on_stale=drop, groups that
became too stale are dropped from a full buffer, and the producers waiting for room must be woken.

(Before the fix the run logged a few steps, then the learner waited for `placement.call_timeout_s`: "no full
batch of rollouts within 120 s (4 of 8 groups ready)", every producer asleep. The random tiny model shows it as
well as the warm one: the stall is in the schedule, not in what is learned.)"""

import json

import pytest

from benchmarks.learning_cases import run_in_process, write_config

pytestmark = pytest.mark.slow

STEPS = 12


def test_partial_rollouts_with_drop_do_not_stall(tmp_path, random_model_dir, toy_task, ray_address):
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "cfg.yaml", random_model_dir, toy_task, run_dir, "vllm")
    result = run_in_process(
        "train",
        str(config),
        "placement.mode=ray",
        f"placement.address={ray_address}",
        "log.progress=false",
        "algorithm.correction.mode=tis_token",
        "train.schedule=async",
        "train.max_staleness=1",
        "train.on_stale=drop",
        "train.partial_rollouts=1.5",
        f"train.steps={STEPS}",
        "rollout.prompts_per_step=8",
        "placement.call_timeout_s=120",
        "eval.max_prompts=16",
        "log.save_model=false",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert max(r["stale/version_max"] for r in rows) <= 1
    assert all(r["partial/discarded_groups"] >= 0 for r in rows)
