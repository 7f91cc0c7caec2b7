"""The `code` reward through the reward service, and the shipped code-task example (its config and data)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from relayrl.config import RewardConfig, load_config
from relayrl.errors import RewardError
from relayrl.rewards import load_reward, score_rollouts
from relayrl.rewards.code import extract_program
from relayrl.rewards.sandbox import run_tests
from relayrl.rewards.service import build_reward_service
from relayrl.types import Prompt, Rollout

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "code_task"
ADD_TESTS = [{"call": "add(2, 3)", "expected": 5}, {"call": "add(-1, 1)", "expected": 0}]


def rollout(completion: str, index: int = 0, **columns) -> Rollout:
    return Rollout(
        prompt=Prompt(id="add", text="Write add(a, b).\n", token_ids=[1], columns=columns),
        group_index=index,
        response_ids=[1],
        response_text=completion,
        behaviour_logprobs=[0.0],
        finish_reason="stop",
        versions=[0],
    )


def test_extract_program_takes_the_last_fenced_block():
    assert extract_program("def f(): pass") == "def f(): pass"
    assert extract_program("try:\n```python\nx = 1\n```\nbetter:\n```\nx = 2\n```") == "x = 2\n"


def test_code_reward_is_the_pass_fraction():
    fn = load_reward("code", {"timeout_s": 2.0})
    batch = [
        rollout("```python\ndef add(a, b):\n    return a + b\n```", 0, tests=ADD_TESTS),
        rollout("def add(a, b):\n    return 5\n", 1, tests=ADD_TESTS),
        rollout("while True: pass", 2, tests=json.dumps(ADD_TESTS)),
    ]  # a JSON string column works too
    scores, errors = score_rollouts(fn, batch)
    assert [s.reward for s in scores] == [1.0, 0.5, 0.0] and errors == []


def test_code_reward_setup_mistakes_are_named():
    with pytest.raises(RewardError, match="needs a 'tests' column"):
        score_rollouts(load_reward("code"), [rollout("x = 1", answer="1")], "zero")
    with pytest.raises(RewardError, match=r"unknown kwargs \['timeout'\]"):
        score_rollouts(load_reward("code", {"timeout": 1}), [rollout("x = 1", tests=ADD_TESTS)], "zero")
    with pytest.raises(RewardError, match="test 0 is .*prompt 'Write add"):
        score_rollouts(load_reward("code"), [rollout("x = 1", tests=[{"input": 1}])], "zero")


def test_code_reward_in_workers_with_a_hanging_program_is_bounded():
    config = RewardConfig(fn="code", kwargs={"timeout_s": 1.0, "cpu_s": 1}, workers=2, timeout_s=5.0, batch_size=1)
    with build_reward_service(config) as service:
        service.score([rollout("x = 1", tests=ADD_TESTS)])  # start-up
        start = time.monotonic()
        scores, metrics = service.score(
            [rollout("import time\ntime.sleep(60)", i, tests=ADD_TESTS) for i in range(2)]
            + [rollout("def add(a, b):\n    return a + b", 2, tests=ADD_TESTS)]
        )
        assert time.monotonic() - start < 2 * 1.0 + 3.0  # two sandbox timeouts per sleeper, in parallel
    assert [s.reward for s in scores] == [0.0, 0.0, 1.0] and metrics["reward/code"] == pytest.approx(1 / 3)


def test_example_config_is_valid_and_its_tests_pass_with_reference_solutions():
    config = load_config(EXAMPLE / "config.yaml")
    assert [c.label for c in config.reward.resolved_components()] == ["tests", "format"]
    rows = [json.loads(line) for name in ("train.jsonl", "eval.jsonl") for line in (EXAMPLE / name).open()]
    assert len(rows) == 10 and all(row["tests"] for row in rows)
    solutions = {"add": "def add(a, b):\n    return a + b\n", "sum_line": "print(sum(map(int, input().split())))\n"}
    for row in rows:
        for name, solution in solutions.items():
            if f" {name}(" in row["prompt"] or (name == "sum_line" and "sum." in row["prompt"]):
                assert run_tests(solution, row["tests"]).pass_fraction == 1.0
