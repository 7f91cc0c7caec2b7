"""The environment protocol, `Step`, and loading an environment class by spec (as `reward.fn` is loaded).

An environment is a class, one instance per trajectory:

    class MyEnv:
        def __init__(self, **kwargs): ...
        def reset(self, row: dict) -> str | list[dict]      # the first observation: text, or chat messages
        def step(self, action: str) -> Step                 # or a tuple (observation, reward, done)

`async def` versions of either method are accepted. `row` is the dataset row, every column (`prompt` or
`messages` included). A step's observation is a string (a user turn), a message dict (`{"role": "tool",
"content": ...}`), a list of them (several tool results) or None (nothing to say: only sensible with done=True).
A message's content may be a list of parts, `{"type": "text", "text": ...}` and, for a vision-language policy,
`{"type": "image", "image": IMAGE}` (relayrl/sources/trajectory_images.py). An optional class attribute
`stop` (a tuple of strings) ends a turn's generation early, e.g. at `</calc>` for a tool call.

Checking what `step` returned lives here (`as_step`), so a malformed result is named once, with the class.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from relayrl.errors import EnvError


@dataclass
class RawText:
    """Tokens no chat template renders: a `/v1/completions` call's prompt (its text, or its token ids), or what a
    later call appends after the sampled tokens (relayrl/agents/)."""

    text: str = ""
    ids: list[int] | None = None


Observation = str | dict[str, Any] | list[dict[str, Any]] | RawText | None


@dataclass
class Step:
    """What an environment says after an action: the next observation, this turn's reward, whether it is over."""

    observation: Observation
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Environment(Protocol):
    def reset(self, row: dict[str, Any]) -> str | list[dict[str, Any]]: ...

    def step(self, action: str) -> Step | tuple[Observation, float, bool]: ...


def load_env_class(spec: str) -> Callable[..., Any]:
    """A built-in name, `skyrl_gym:ENV_ID` or `gymnasium:ENV_ID` (relayrl/envs/ecosystem.py), `package.module:Class`
    or `path/to/file.py:Class`. Imports stay light (no torch): the environment workers load it by spec."""
    from relayrl.envs.builtins import BUILTINS
    from relayrl.envs.ecosystem import ecosystem_class, is_ecosystem_spec

    if spec in BUILTINS:
        return BUILTINS[spec]
    if is_ecosystem_spec(spec):
        return ecosystem_class(spec)
    if ":" not in spec:
        raise EnvError(
            f"env.fn={spec!r} is not a built-in ({', '.join(BUILTINS)}) "
            "nor of the form skyrl_gym:ENV_ID, gymnasium:ENV_ID, module:Class or path/file.py:Class"
        )
    target, _, name = spec.rpartition(":")
    cls = getattr(_import(target, spec), name, None)
    if not callable(cls):
        raise EnvError(f"env.fn={spec!r}: '{target}' has no class '{name}'")
    for method in ("reset", "step"):
        if not callable(getattr(cls, method, None)):
            raise EnvError(f"env.fn={spec!r}: {name} has no method '{method}' (an environment needs reset and step)")
    return cls


def _import(target: str, spec: str, key: str = "env.fn"):
    """A module by name, or a .py file by path (registered in sys.modules, as importlib's recipe does); a file that
    an imported module already is (a spec resolved to the file of a package module) is that module."""
    try:
        if not target.endswith(".py"):
            return importlib.import_module(target)
        file = Path(target)
        if not file.is_file():
            raise EnvError(f"{key}={spec!r}: file not found: {file}")
        resolved = str(file.resolve())
        for module in list(sys.modules.values()):
            if getattr(module, "__file__", None) == resolved:
                return module
        name = f"relayrl_user_env_{file.stem}"
        if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(file):
            return sys.modules[name]
        module_spec = importlib.util.spec_from_file_location(name, file)
        assert module_spec is not None and module_spec.loader is not None  # a .py file always has both
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
        return module
    except EnvError:
        raise
    except Exception as err:  # noqa: BLE001 - ImportError, and whatever the module raises while it runs
        raise EnvError(f"{key}={spec!r}: cannot import '{target}': {type(err).__name__}: {err}") from None


def make_env(spec: str, kwargs: dict[str, Any] | None = None):
    """One environment instance (one per trajectory)."""
    cls = load_env_class(spec)
    try:
        return cls(**(kwargs or {}))
    except TypeError as err:
        raise EnvError(f"env.fn={spec!r}: cannot build it with env.kwargs={kwargs or {}}: {err}") from None


def call(method, *args, **kwargs) -> Any:
    """Call a sync or async environment method (or tool) and return its result."""
    result = method(*args, **kwargs)
    if inspect.isawaitable(result):
        return asyncio.run(_await(result))
    return result


async def _await(awaitable):
    return await awaitable


def as_messages(observation: Any, where: str) -> list[dict[str, Any]]:
    """`reset`'s result as chat messages: a string is one user turn."""
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    if isinstance(observation, list) and observation and all(_is_message(m) for m in observation):
        return [dict(m) for m in observation]
    raise EnvError(f"{where}: reset must return a string or a non-empty list of {{role, content}}, got {observation!r}")


def as_step(result: Any, where: str) -> Step:
    """A `Step` from what `step` returned (a Step or an (observation, reward, done) tuple), checked."""
    if isinstance(result, tuple) and len(result) in (3, 4):
        result = Step(*result)
    if not isinstance(result, Step):
        raise EnvError(f"{where}: step must return relayrl.envs.Step or (observation, reward, done), got {result!r}")
    observation = result.observation
    several = isinstance(observation, list) and bool(observation) and all(_is_message(m) for m in observation)
    if not (observation is None or isinstance(observation, str) or _is_message(observation) or several):
        raise EnvError(
            f"{where}: the observation must be a string, a {{role, content}} dict, a non-empty list of them or "
            f"None, got {observation!r}"
        )
    if observation is None and not result.done:
        raise EnvError(f"{where}: an observation of None needs done=True (the model has nothing to answer)")
    try:
        reward = float(result.reward)
    except (TypeError, ValueError):
        reward = math.nan
    if not math.isfinite(reward):
        raise EnvError(f"{where}: the step reward {result.reward!r} is not a finite number")
    return Step(observation, reward, bool(result.done), dict(result.info or {}))


def observation_messages(observation: str | dict[str, Any] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A step's observation as the chat messages appended to the history (a string is a user turn)."""
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    if isinstance(observation, dict):
        return [dict(observation)]
    return [dict(m) for m in observation]


def _is_message(value: Any) -> bool:
    """A {role, content} dict; content a string, or a list of content parts (text, and images for a
    vision-language policy: relayrl/sources/trajectory_images.py checks the parts)."""
    if not (isinstance(value, dict) and isinstance(value.get("role"), str)):
        return False
    content = value.get("content")
    return isinstance(content, str) or (isinstance(content, list) and all(isinstance(p, dict) for p in content))
