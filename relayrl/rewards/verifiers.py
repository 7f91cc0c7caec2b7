"""Built-in verifiers. Each is batched: fn(prompts, completions, **columns) -> list[float | dict]."""

from __future__ import annotations

import re
from typing import Any

from relayrl.data.reasoning_gym import score as reasoning_gym
from relayrl.errors import RewardError
from relayrl.rewards.code import code
from relayrl.rewards.judge import judge


def _column(name: str, columns: dict[str, Any], fn: str) -> list:
    if name not in columns:
        raise RewardError(f"reward '{fn}' needs a '{name}' column in the dataset; found {sorted(columns)}")
    return columns[name]


def _normalise(text: str) -> str:
    return " ".join(str(text).strip().split())


def exact_match(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
    """1.0 when the completion, whitespace-normalised, equals the row's `answer`."""
    answer = _column("answer", columns, "exact_match")
    return [float(_normalise(c) == _normalise(a)) for c, a in zip(completions, answer)]


def math(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
    """1.0 when math-verify finds the completion's final answer equal to the row's `answer`."""
    answer = _column("answer", columns, "math")
    from math_verify import parse, verify

    scores = []
    for completion, gold in zip(completions, answer):
        gold_parsed = parse(str(gold) if "$" in str(gold) or "\\" in str(gold) else f"${gold}$")
        scores.append(float(verify(gold_parsed, parse(completion))))
    return scores


def regex(prompts: list[str], completions: list[str], pattern: str | None = None, **_: Any) -> list[float]:
    """A format reward: 1.0 when the whole completion matches `pattern` (bind it with reward.kwargs)."""
    if pattern is None:
        raise RewardError(
            "reward 'regex' needs a pattern: set reward.kwargs.pattern (on a command line: "
            """reward.kwargs.pattern='...'; relayrl reward: --reward-kwargs '{"pattern": "..."}')"""
        )
    compiled = re.compile(pattern, re.DOTALL)
    return [float(compiled.fullmatch(c.strip()) is not None) for c in completions]


def reward_model(prompts: list[str], completions: list[str], path: str | None = None, **options: Any) -> list[float]:
    """The score of a sequence-classification model at `path` (bind it with reward.kwargs.path); loaded once."""
    from relayrl.rewards.reward_model import shared_reward_model

    return shared_reward_model(path, **options).score(prompts, completions)


BUILTINS = {
    "exact_match": exact_match,
    "math": math,
    "regex": regex,
    "code": code,
    "reward_model": reward_model,
    "judge": judge,
    "reasoning_gym": reasoning_gym,  # the row's task's own score_answer (relayrl/data/reasoning_gym.py)
}
