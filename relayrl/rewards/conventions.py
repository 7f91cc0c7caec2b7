"""Reward functions written for TRL or verl, called as those frameworks call them: no adapter to write.

Three conventions, read from the function's signature (`reward.style: auto`) or forced (`relayrl|trl|verl`):

- relayrl: `fn(prompts, completions, **columns)`, batched, positional (rewards/base.py). Auto picks it for a
  function whose first two parameters are `prompts, completions`, or, failing the other two, any function taking
  two positional arguments (so `f(p, c)` keeps working). `f(prompts, completions, **kwargs)` fits TRL too; auto
  takes relayrl's, which differs only on `messages` rows: set `style: trl` to get TRL's message lists.
- trl: batched, by keyword, as TRL's GRPOTrainer calls it: `prompts=`, `completions=`, `completion_ids=` (response
  token ids) and every dataset column. For a `messages` row the prompt is the messages list and the completion a
  one-message list `[{"role": "assistant", "content": text}]` (a final assistant turn, which the model continued,
  leaves the prompt and prefixes the completion, as in TRL); for a `prompt` row both are strings. Auto picks it
  for a function naming `completions` or `completion_ids` otherwise. A `None` for a sample means "does not
  apply" (TRL's skip): the function contributes 0 to that sample's reward and it is not an error — the same sum
  TRL's nansum gives (its reward/<name> mean counts that 0). Parameters the function does not take (and no
  `**kwargs`) are not passed; TRL's trainer-only `trainer_state`, `log_extra`, `log_metric` never are. An
  `async def` function is awaited, as TRL does.
- verl: `compute_score(data_source, solution_str, ground_truth, extra_info)`, one sample per call, by keyword
  (auto: a `solution_str` parameter). `data_source` is the row's `data_source` column (None if absent),
  `ground_truth` its `ground_truth` column or else `reward_model["ground_truth"]` (verl's parquet), `extra_info`
  its `extra_info` column ({} if absent). A float (or bool) is the reward; a dict's `score` is the reward and its
  other numeric entries are kept as components, not added to it (verl's `{"score": 1, "acc": True}` is 1.0).

A factory (TRL's `get_soft_overlong_punishment`), given as `module:factory` with `reward.kwargs`, is recognised by a
signature that takes the kwargs but no prompts/completions: it is called with them and what it returns is used.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from relayrl.errors import RewardError
from relayrl.types import Rollout

STYLES = ("relayrl", "trl", "verl")
SAMPLE_NAMES = {"prompts", "completions", "completion_ids", "solution_str", "data_source", "ground_truth"}
DESCRIBED = {
    "relayrl": "relayrl's convention fn(prompts, completions, **columns), batched",
    "trl": "TRL's convention fn(prompts=, completions=, completion_ids=, **columns) by keyword, batched "
    "(message lists on `messages` rows; None = does not apply)",
    "verl": "verl's convention compute_score(data_source, solution_str, ground_truth, extra_info), one sample "
    "per call (a dict's `score` is the reward)",
}
EXPECTED = (
    "relayrl's fn(prompts, completions, **columns) (batched, positional), TRL's fn(completions, **kwargs) "
    "(batched, by keyword: prompts, completions, completion_ids and every column), verl's "
    "compute_score(data_source, solution_str, ground_truth, extra_info) (one sample), or a factory called "
    "with reward.kwargs that returns one of these"
)


@dataclass
class Resolved:
    """A loaded reward function (kwargs bound, a factory already called) and the convention it is called by."""

    fn: Callable
    style: str


def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C callables have none: called as relayrl's
        return None


def _positional(signature: inspect.Signature) -> list[str]:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in signature.parameters.values() if p.kind in kinds]


def _takes_var(signature: inspect.Signature, kind) -> bool:
    return any(p.kind == kind for p in signature.parameters.values())


def _is_factory(signature: inspect.Signature | None, kwargs: dict[str, Any]) -> bool:
    """Takes the kwargs (all its required parameters among them) but nothing a reward function is called with."""
    if signature is None or set(signature.parameters) & SAMPLE_NAMES:
        return False
    if _takes_var(signature, inspect.Parameter.VAR_KEYWORD) or _takes_var(signature, inspect.Parameter.VAR_POSITIONAL):
        return False
    try:
        signature.bind(**kwargs)
    except TypeError:
        return False
    return True


def detect_style(fn: Callable, spec: str) -> str:
    """The convention `fn`'s signature fits (see the module docstring), or a RewardError saying what was expected."""
    signature = _signature(fn)
    if signature is None:
        return "relayrl"
    names, positional = set(signature.parameters), _positional(signature)
    if "solution_str" in names:
        return "verl"
    if positional[:2] == ["prompts", "completions"]:
        return "relayrl"
    if names & {"completions", "completion_ids"}:
        return "trl"
    if len(positional) >= 2 or _takes_var(signature, inspect.Parameter.VAR_POSITIONAL):
        return "relayrl"
    raise RewardError(
        f"reward.fn={spec!r}: the signature {getattr(fn, '__name__', 'fn')}{signature} fits none of "
        f"the reward conventions: expected {EXPECTED}. reward.style forces one"
    )


def resolve(fn: Callable, kwargs: dict[str, Any] | None, style: str, spec: str) -> Resolved:
    """Unwrap a factory, pick the convention, bind the kwargs (not to a factory's result: they were its own)."""
    kwargs = kwargs or {}
    if style not in ("auto", *STYLES):
        raise RewardError(f"reward.style={style!r}: expected auto, {', '.join(STYLES)}")
    if kwargs and _is_factory(_signature(fn), kwargs):
        try:
            fn = fn(**kwargs)
        except Exception as err:  # noqa: BLE001 - whatever the user's factory raises, named with its kwargs
            raise RewardError(
                f"reward.fn={spec!r}: the factory raised when called with reward.kwargs {kwargs}: "
                f"{type(err).__name__}: {err}"
            ) from None
        if not callable(fn):
            raise RewardError(
                f"reward.fn={spec!r} was called as a factory with reward.kwargs {kwargs} and returned "
                f"{type(fn).__name__}, not a reward function"
            )
        kwargs = {}
    style = detect_style(fn, spec) if style == "auto" else style
    return Resolved(functools.partial(fn, **kwargs) if kwargs else fn, style)


def _accepted(fn: Callable, arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments `fn` takes: all of them with `**kwargs`, else only those it names (TRL passes everything)."""
    signature = _signature(fn)
    if signature is None or _takes_var(signature, inspect.Parameter.VAR_KEYWORD):
        return arguments
    return {k: v for k, v in arguments.items() if k in signature.parameters}


def _columns(rollouts: list[Rollout]) -> dict[str, list]:
    names = {name for r in rollouts for name in r.prompt.columns}
    return {name: [r.prompt.columns.get(name) for r in rollouts] for name in sorted(names)}


def _trl_pair(rollout: Rollout) -> tuple[Any, Any]:
    """TRL's prompt and completion for one sample: messages and a one-message list, or two strings."""
    messages = rollout.prompt.messages
    if messages is None:
        return rollout.prompt.text, rollout.response_text
    prompt, bootstrap = list(messages), ""
    if prompt[-1]["role"] == "assistant":  # a continued assistant turn belongs to the completion (TRL does this)
        bootstrap = prompt.pop()["content"]
    return prompt, [{"role": "assistant", "content": bootstrap + rollout.response_text}]


def call_trl(fn: Callable, rollouts: list[Rollout]) -> Any:
    pairs = [_trl_pair(r) for r in rollouts]
    arguments = {
        **_columns(rollouts),
        "prompts": [p for p, _ in pairs],
        "completions": [c for _, c in pairs],
        "completion_ids": [list(r.response_ids) for r in rollouts],
    }
    result = fn(**_accepted(fn, arguments))
    return asyncio.run(result) if inspect.iscoroutine(result) else result


def _ground_truth(rollout: Rollout) -> Any:
    columns = rollout.prompt.columns
    if "ground_truth" in columns:
        return columns["ground_truth"]
    reward_model = columns.get("reward_model")
    if isinstance(reward_model, dict) and "ground_truth" in reward_model:
        return reward_model["ground_truth"]
    raise RewardError(
        f"a verl-style compute_score needs the ground truth of sample {rollout.sample_id}: a "
        f"'ground_truth' column or 'reward_model': {{'ground_truth': ...}}; found columns "
        f"{sorted(columns)}"
    )


def call_verl(fn: Callable, rollouts: list[Rollout]) -> list[Any]:
    results = []
    for rollout in rollouts:
        columns = rollout.prompt.columns
        arguments = {
            "data_source": columns.get("data_source"),
            "solution_str": rollout.response_text,
            "ground_truth": _ground_truth(rollout),
            "extra_info": dict(columns.get("extra_info") or {}),
        }
        results.append(fn(**_accepted(fn, arguments)))
    return results
