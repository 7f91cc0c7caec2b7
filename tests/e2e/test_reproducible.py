"""One seed, one run: the same config run twice gives the same metrics (all but wall-clock figures) and the same
samples: single- and multi-turn (an environment, or an OpenAI-client agent through env.agent), the HF and the vLLM
engine, local placement and Ray (sync and one_step_off, on the session's shared head), a tiny random model. Each
sample draws from a stream keyed by its prompt, its index in the group and (multi-turn) its trajectory and turn,
never by its batch position or arrival time (relayrl/rollout/seeds.py); `async` varies with timing by design
(docs/config.md `train.seed`)."""

from __future__ import annotations

import json

import pytest
import yaml

from benchmarks.learning_cases import AGENT, run_in_process
from relayrl.api import train

VOLATILE = ("time/", "time_frac/", "throughput/", "sync/GBps", "sync/send_s", "sync/receive_s")

CASES = {
    "single-hf": {"rollout": {"engine": "hf"}},
    "multi-hf": {"rollout": {"engine": "hf"}, "env": {"fn": "retry", "kwargs": {"feedback": " 1+1="}}},
    "multi-vllm": {"rollout": {"engine": "vllm"}, "env": {"fn": "retry", "kwargs": {"feedback": " 1+1="}}},
    "ray-sync-vllm": {"rollout": {"engine": "vllm"}, "placement": {"mode": "ray"}},
    "ray-one-step-off-vllm": {
        "rollout": {"engine": "vllm"},
        "train": {"schedule": "one_step_off"},
        "placement": {"mode": "ray"},
    },
    "agent-hf": {
        "rollout": {"engine": "hf"},
        "env": {"agent": f"{AGENT}:retry_agent", "kwargs": {"feedback": " 1+1="}},
    },
}


def run(tmp_path, model_dir, name: str, case: dict, ray_address: str) -> tuple[list[dict], list[dict]]:
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {"max_turns": 3, "max_total_tokens": 24, **case.get("env", {})}
    config = {
        "model": {"path": str(model_dir)},
        "data": {"train": str(tmp_path / "train.jsonl"), "eval": str(tmp_path / "train.jsonl"), "max_prompt_tokens": 8},
        "env": env if {"fn", "agent"} & env.keys() else {},
        "rollout": {"n": 4, "prompts_per_step": 4, "max_tokens": 4, **case["rollout"]},
        "eval": {"max_prompts": 4},
        "train": {"steps": 3, "lr": 1e-3, "seed": 7, **case.get("train", {})},
        "log": {"dir": str(tmp_path / name), "progress": False, "save_model": False, "samples": {"every": 1}},
    }
    if "placement" in case:
        config["placement"] = {**case["placement"], "address": ray_address}
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(config))
    if "placement" in case:  # through the CLI's main, which leaves Ray after the run (run_in_process)
        done = run_in_process("train", str(tmp_path / f"{name}.yaml"))
        assert done.returncode == 0, done.stderr[-3000:]
    else:
        train(str(tmp_path / f"{name}.yaml"))
    metrics = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(line) for line in (tmp_path / name / "samples.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith(VOLATILE)} for row in metrics], samples


def without_gaps(sample: dict) -> dict:
    return {**sample, "segments": [{k: v for k, v in s.items() if k != "gap"} for s in sample.get("segments", [])]}


def gaps(samples: list[dict]) -> list[float]:
    return [g or 0.0 for sample in samples for s in sample.get("segments", []) for g in s.get("gap", [])]


@pytest.mark.parametrize(
    "case", [pytest.param(name, marks=[pytest.mark.vllm] if "vllm" in name else []) for name in CASES]
)
def test_the_same_seed_gives_the_same_run(tmp_path, random_model_dir, case, request):
    ray_address = request.getfixturevalue("ray_address") if "placement" in CASES[case] else ""
    first = run(tmp_path, random_model_dir, "first", CASES[case], ray_address)
    second = run(tmp_path, random_model_dir, "second", CASES[case], ray_address)
    # every sample: text, reward, advantage, versions, turns; the per-token learner-vs-engine gaps are float noise of
    # the engine's batching (~1e-7, as mismatch/* below), compared within 1e-5
    assert [without_gaps(s) for s in first[1]] == [without_gaps(s) for s in second[1]]
    assert gaps(first[1]) == pytest.approx(gaps(second[1]), abs=1e-5)
    assert [row.keys() for row in first[0]] == [row.keys() for row in second[0]]
    for want, have in zip(*(metrics for metrics, _ in (first, second))):
        for key, value in want.items():  # mismatch/*: float noise of the engine's history, ~1e-6
            assert have[key] == pytest.approx(value, abs=1e-5 if key.startswith("mismatch/") else 1e-9), key
    assert len({s["completion"] for s in first[1]}) > 1  # sampled, not one completion everywhere
