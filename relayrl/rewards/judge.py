"""An LLM judge: a prompt template sent to a vLLM engine, and a parser that turns each answer into a score.

The template is a `str.format` string over `{prompt}` and `{completion}` (and any dataset column passed
in `columns`). The parser takes the first match of `pattern` (a regex; its first group, else the whole
match) as a float. An answer it cannot parse raises a RewardError naming the sample and quoting the
answer; with a `default` it scores `default` instead (like `on_error=zero` for that sample).
As a reward spec: `reward: {fn: judge, kwargs: {model: path, template: ..., pattern: ..., default: ...}}`;
the engine is built once per process. Every vLLM call lives in relayrl/rollout/vllm_engine.py.
"""

from __future__ import annotations

import functools
import re
import string
from typing import Any, Protocol

from relayrl.errors import RewardError
from relayrl.rollout.memory import JUDGE, JUDGE_ROLE

DEFAULT_TEMPLATE = "Rate the answer to the question from 0 to 10.\nQuestion: {prompt}\nAnswer: {completion}\nRating: "
DEFAULT_PATTERN = r"-?\d+(?:\.\d+)?"


class TextEngine(Protocol):
    def complete(self, texts: list[str], max_tokens: int) -> list[str]: ...


def parse_judgement(answer: str, pattern: re.Pattern, sample: str, default: float | None = None) -> float:
    match = pattern.search(answer)
    text = (match.group(1) if match and match.re.groups else match.group(0)) if match else None
    try:
        if text is None:  # no match, or its group took no part in it
            raise ValueError(text)
        return float(text)
    except (TypeError, ValueError):
        if default is not None:
            return default
        found = f"matched {text!r}, not a number" if match else f"no match for /{pattern.pattern}/"
        raise RewardError(
            f"judge answer for sample {sample} does not parse ({found}): {answer[:200]!r} "
            "(set reward.kwargs.default to score such answers)"
        ) from None


class Judge:
    def __init__(
        self,
        engine: TextEngine,
        template: str = DEFAULT_TEMPLATE,
        pattern: str = DEFAULT_PATTERN,
        default: float | None = None,
        max_tokens: int = 16,
    ):
        try:
            self.fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
        except ValueError as err:
            raise RewardError(f"judge template {template[:80]!r} is not a format string: {err}") from None
        if any(not name.isidentifier() for name in self.fields):
            raise RewardError(
                f"judge template {template[:80]!r}: fields must be names ({{prompt}}, {{completion}} "
                f"or a dataset column), got {sorted(self.fields)}"
            )
        try:
            self.pattern = re.compile(pattern)
        except re.error as err:
            raise RewardError(f"judge pattern {pattern!r} is not a regex: {err}") from None
        self.engine, self.template, self.default, self.max_tokens = engine, template, default, max_tokens

    def score(self, prompts: list[str], completions: list[str], **columns: list) -> list[float]:
        if missing := self.fields - {"prompt", "completion"} - set(columns):
            raise RewardError(
                f"judge template uses {{{sorted(missing)[0]}}}, which is neither prompt, completion "
                f"nor a dataset column (columns: {sorted(columns)})"
            )
        rows = [{name: values[i] for name, values in columns.items()} for i in range(len(prompts))]
        texts = [self.template.format(prompt=p, completion=c, **row) for p, c, row in zip(prompts, completions, rows)]
        answers = self.engine.complete(texts, self.max_tokens)
        return [
            parse_judgement(answer, self.pattern, f"{i} of the batch (prompt {p[:40]!r})", self.default)
            for i, (answer, p) in enumerate(zip(answers, prompts))
        ]


def judge(
    prompts: list[str],
    completions: list[str],
    model: str | None = None,
    template: str = DEFAULT_TEMPLATE,
    pattern: str = DEFAULT_PATTERN,
    default: float | None = None,
    max_tokens: int = 16,
    max_model_len: int = 512,
    gpu_memory_utilization: float = JUDGE,
    **columns: Any,
) -> list[float]:
    """The `judge` built-in: a judge over a vLLM engine on `model`, built once per process, taking
    `gpu_memory_utilization` of the GPU (beside a rollout engine there, the two shares must add up to at most 1:
    relayrl/rollout/memory.py)."""
    if model is None:
        raise RewardError("reward 'judge' needs a model: set reward.kwargs.model to an HF model directory")
    built = _judge(model, template, pattern, default, max_tokens, max_model_len, gpu_memory_utilization)
    return built.score(prompts, completions, **columns)


@functools.cache
def _judge(model: str, template: str, pattern: str, default, max_tokens: int, max_model_len: int, share: float):
    from relayrl.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(model, max_model_len=max_model_len, seed=0, gpu_memory_utilization=share, role=JUDGE_ROLE)
    return Judge(engine, template, pattern, default, max_tokens)
