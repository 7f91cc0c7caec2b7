"""The reward protocol and the one place where reward outputs are checked.

A reward function is batched: `fn(prompts, completions, **columns) -> list[float | dict[str, float]]`,
where `columns` holds every non-prompt dataset column as a list aligned with the batch. A dict result is
a set of named components; the reward is their sum. A 1-D numpy array or torch tensor of one value per
sample stands for the list, numpy scalars and 0-d arrays or tensors for numbers (all become floats). A
function that raises, or returns NaN, None or a non-number, fails naming the sample (`on_error=error`), or
is counted and scored 0 (`on_error=zero`) or dropped, as None (`on_error=skip`). A failure is always an
error, whatever the convention: a call that raised is never read as TRL's "None = does not apply", and what it
raised travels with the count (the stop line) and with a zeroed sample's Score (`samples.jsonl`).

Functions written for TRL or verl are called as those frameworks call them (conventions.py): the convention is
read from the signature (or forced by `reward.style`) when the function is loaded, and printed once.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import numbers
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from relayrl.errors import RewardError
from relayrl.rewards import conventions
from relayrl.types import Rollout, Score


class RewardFn(Protocol):
    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[Any]: ...


class ConventionReward:
    """A TRL- or verl-style function with how to call it and read its results (relayrl's own stay plain)."""

    def __init__(self, resolved: conventions.Resolved):
        self.fn, self.style = resolved.fn, resolved.style

    def call(self, rollouts: list[Rollout]) -> Any:
        call = conventions.call_trl if self.style == "trl" else conventions.call_verl
        return call(self.fn, rollouts)

    def to_score(self, value: Any) -> Score | None:
        if self.style == "trl" and value is None:
            return Score(0.0)  # TRL's "does not apply": contributes nothing to this sample, not an error
        if self.style == "verl" and isinstance(value, dict):
            if "score" not in value:
                return None
            reward = _finite(value["score"])
            parts = {str(k): _finite(v) for k, v in value.items() if k != "score"}
            return None if reward is None else Score(reward, {k: v for k, v in parts.items() if v is not None})
        return _to_score(value)


def load_reward(spec: str, kwargs: dict[str, Any] | None = None, style: str = "auto") -> RewardFn | ConventionReward:
    """A built-in name, `package.module:function`, or `path/to/file.py:function` (or a factory of one, given
    kwargs); `style` forces a convention (conventions.py), `auto` reads it from the signature."""
    from relayrl.rewards.verifiers import BUILTINS

    if spec in BUILTINS:
        fn = BUILTINS[spec]
    elif ":" in spec:
        target, _, name = spec.rpartition(":")
        module = _import_file(target, spec) if target.endswith(".py") else _import_module(target, spec)
        fn = getattr(module, name, None)
        if not callable(fn):
            raise RewardError(f"reward.fn={spec!r}: '{target}' has no function '{name}'")
    else:
        raise RewardError(
            f"reward.fn={spec!r} is not a built-in ({', '.join(BUILTINS)}) "
            "nor of the form module:function or path/file.py:function"
        )
    resolved = conventions.resolve(fn, kwargs, style, spec)
    _announce(spec, resolved.style)
    return resolved.fn if resolved.style == "relayrl" else ConventionReward(resolved)


_ANNOUNCED: set[tuple[str, str]] = set()


def _announce(spec: str, style: str) -> None:
    """One line per user function and process, not from reward workers (the driver has said it already)."""
    import multiprocessing

    if ":" not in spec or (spec, style) in _ANNOUNCED or multiprocessing.parent_process() is not None:
        return
    _ANNOUNCED.add((spec, style))
    print(f"relayrl: reward {spec!r} is called by {conventions.DESCRIBED[style]}", file=sys.stderr, flush=True)


def _import_module(name: str, spec: str):
    try:
        return importlib.import_module(name)
    except Exception as err:  # noqa: BLE001 - ImportError, and whatever the module raises while it runs
        raise RewardError(f"reward.fn={spec!r}: cannot import module '{name}': {type(err).__name__}: {err}") from None


def _import_file(path: str, spec: str):
    file = Path(path)
    if not file.is_file():
        raise RewardError(f"reward.fn={spec!r}: file not found: {file}")
    name = f"relayrl_user_reward_{file.stem}"
    module_spec = importlib.util.spec_from_file_location(name, file)
    assert module_spec is not None and module_spec.loader is not None  # a .py file always has both
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # as importlib's recipe does: dataclasses and pickling look the module up
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - whatever the user's file raises while it runs
        del sys.modules[name]
        raise RewardError(f"reward.fn={spec!r}: cannot import {file}: {type(err).__name__}: {err}") from None
    return module


@dataclass(frozen=True)
class Raised:
    """A sample whose call raised, standing in for its value: never a reward, whatever the convention."""

    error: str  # "ValueError: bad answer"


def score_rollouts(
    fn: RewardFn | ConventionReward, rollouts: list[Rollout], on_error: str = "error"
) -> tuple[list[Score | None], list[str]]:
    """Score a batch; return the scores and one line per sample that failed (`sample <id> raised ...` or `is <value>`; it is
    scored 0 under `on_error=zero`, with the line as its Score's `error`, and None under `on_error=skip`).

    If the batched call raises, each sample is scored alone to find (and name) the one that fails.
    """
    try:
        raw = _call(fn, rollouts)
    except Exception:  # noqa: BLE001 - the user's function failed somewhere: score alone to find the sample
        raw = [_call_one(fn, rollout, on_error) for rollout in rollouts]
    raw = _as_list(raw)
    if not isinstance(raw, (list, tuple)) or len(raw) != len(rollouts):
        got = (
            f"{len(raw)} values"
            if isinstance(raw, (list, tuple))
            else f"an array of shape {tuple(raw.shape)}"
            if _is_array(raw)
            else type(raw).__name__
        )
        raise RewardError(
            f"reward function must return a list of {len(rollouts)} values, got {got} "
            "(reward functions are batched: fn(prompts, completions, **columns) -> one value each)"
        )
    scores, failures = [], []
    to_score = fn.to_score if isinstance(fn, ConventionReward) else _to_score
    for rollout, value in zip(rollouts, raw):
        score = None if isinstance(value, Raised) else to_score(value)
        if score is None:
            failure = f"sample {rollout.sample_id} " + (
                f"raised {value.error}" if isinstance(value, Raised) else f"is {_shown(value)}"
            )
            if on_error == "error":
                raise RewardError(
                    f"reward for {failure}, not {_expected(fn)} "
                    "(set reward.on_error=zero or skip to score such samples 0 or drop them)"
                )
            failures.append(failure)
            score = Score(0.0, error=failure) if on_error == "zero" else None
        scores.append(score)
    return scores, failures


def _expected(fn: RewardFn | ConventionReward) -> str:
    if isinstance(fn, ConventionReward) and fn.style == "verl":
        return "a finite number or a dict with a finite 'score' (verl's compute_score)"
    return "a finite number"


def _shown(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _call(fn: RewardFn | ConventionReward, rollouts: list[Rollout]) -> Any:
    if isinstance(fn, ConventionReward):
        return fn.call(rollouts)
    names = {name for r in rollouts for name in r.prompt.columns}
    columns = {name: [r.prompt.columns.get(name) for r in rollouts] for name in names}
    return fn([r.prompt.text for r in rollouts], [r.response_text for r in rollouts], **columns)


def _call_one(fn: RewardFn | ConventionReward, rollout: Rollout, on_error: str) -> Any:
    try:
        return _call(fn, [rollout])[0]
    except RewardError:
        raise  # a setup mistake (e.g. a missing dataset column), not a failure of this sample
    except Exception as err:
        if on_error != "error":
            return Raised(f"{type(err).__name__}: {err}")  # counted as an error by the caller, with this text
        raise RewardError(f"reward function raised on sample {rollout.sample_id}: {type(err).__name__}: {err}") from err


def _is_array(value: Any) -> bool:
    """A numpy array or a torch tensor (not imported here: a reward returning a tensor has loaded torch)."""
    torch = sys.modules.get("torch")
    return isinstance(value, np.ndarray) or (torch is not None and isinstance(value, torch.Tensor))


def _as_list(raw: Any) -> Any:
    """A 1-D array or tensor as a list of Python numbers; anything else unchanged (checked by the caller)."""
    if _is_array(raw) and raw.ndim == 1:
        return raw.tolist() if isinstance(raw, np.ndarray) else raw.detach().float().cpu().tolist()
    return raw


def _finite(value: Any) -> float | None:
    if _is_array(value) and value.ndim == 0:
        value = value.item()
    if not isinstance(value, (numbers.Real, np.bool_)):  # numpy numbers are registered as Real, np.bool_ is not
        return None  # (bools, Python's and numpy's alike, score 1.0 / 0.0)
    value = float(value)
    return value if math.isfinite(value) else None


def _to_score(value: Any) -> Score | None:
    if isinstance(value, dict):
        parts = {str(k): _finite(v) for k, v in value.items()}
        finite = {k: v for k, v in parts.items() if v is not None}
        if not parts or len(finite) < len(parts):
            return None
        return Score(sum(finite.values()), finite)
    reward = _finite(value)
    return None if reward is None else Score(reward)
