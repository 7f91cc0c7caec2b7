"""TRL's `environment_factory` environments, unchanged, as relayrl agents: `env.fn: trl:module:Factory` (or
`trl:path/file.py:Factory`; `env.agent` takes the same spec).

TRL 1.16's contract (trl/trainer/grpo_trainer.py, `environment_factory`), kept as it is:
- the factory (usually the class) is called with no argument (here: with `env.kwargs`) for one instance per
  trajectory; a dict of factories picks one per row by the row's `environment` column;
- `reset(**row)` gets the dataset row (all its columns but `environment` when a dict picks; here also `prompt` or
  `messages`, as relayrl hands rows to agents) and returns None or a text appended to the last user message;
- every public method other than `reset` and `get_reward` is a tool: its schema is built by transformers'
  `get_json_schema` from its type hints and Google-style docstring (a method without them is refused when the
  environment loads, naming it), called with the model's arguments; a call that raises comes back as
  `{'error': '...'}` (TRL's wording), an unknown tool likewise;
- the model is called until a reply has no tool call; then `get_reward()` (sync or async), when defined, is the
  trajectory's reward, else 0 (a `reward.fn` set as well is added to it, as for every multi-turn run; with neither,
  the run is refused before it starts: every reward would be 0).

What relayrl does around it: the calls go through the rollout endpoint (relayrl/agents/), so the chat template
renders the tools, `env.tool_parser` (vLLM's parsers) reads the calls, and every trained token is one the engine
sampled. Sync tools run in a thread (a slow tool never blocks the endpoint's loop). `env.max_turns` bounds the
model calls (TRL's `max_tool_calling_iterations` + 1): a trajectory cut there is kept, without `get_reward`.
Left out: multimodal tool results (a list of content parts is sent as its text).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from typing import Any

from relayrl.errors import EnvError

PREFIX = "trl:"
SKIPPED = ("reset", "get_reward")


def is_trl_spec(spec: str) -> bool:
    return spec.startswith(PREFIX)


def trl_agent(spec: str, factory: Any) -> Callable:
    """The agent function running the environments `factory` makes (a callable, or a dict of them by name); one
    instance of each is built now, so a missing `reset` or a tool without a schema fails before any trajectory."""
    factories = factory if isinstance(factory, dict) else {None: factory}
    scores = False  # whether some environment defines get_reward (else a reward.fn must score)
    for name, make in factories.items():
        if not callable(make):
            raise EnvError(f"env.agent={spec!r}: {make!r} (for {name!r}) is not callable: name a class or a factory")
        probe = _build(spec, make, {})
        tools_of(spec, probe)
        scores = scores or callable(getattr(probe, "get_reward", None))

    async def agent(client, row: dict[str, Any], **kwargs):
        row = dict(row)
        make = factories[_pick(spec, factories, row)]
        env = _build(spec, make, kwargs)
        observation = await _call(env.reset, **row)
        messages = _first_messages(spec, row, observation)
        tools = tools_of(spec, env)
        schemas = [schema for schema, _ in tools.values()]
        while True:
            reply = await client.chat.completions.create(model="policy", messages=messages, tools=schemas or None)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                result = await _run_tool(tools, call.function.name, call.function.arguments)
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "name": call.function.name, "content": result}
                )
        get_reward = getattr(env, "get_reward", None)
        if not callable(get_reward):
            return 0.0
        reward = await _call(get_reward)
        if isinstance(reward, bool) or not isinstance(reward, int | float):  # None too: never a silent 0
            raise EnvError(f"{type(env).__name__}.get_reward returned {reward!r}, not a number")
        return float(reward)

    agent.__qualname__ = agent.__name__ = f"trl_environment[{spec.removeprefix(PREFIX)}]"
    agent.scores = scores  # type: ignore[attr-defined]
    return agent


def tools_of(spec: str, env: Any) -> dict[str, tuple[dict, Callable]]:
    """{name: (its JSON schema, the bound method)} of the environment's tools, as TRL lists them (public
    functions of the class, but reset and get_reward)."""
    from transformers.utils.chat_template_utils import (
        DocstringParsingException,
        TypeHintParsingException,
        get_json_schema,
    )

    if not callable(getattr(env, "reset", None)):
        raise EnvError(f"env.agent={spec!r}: {type(env).__name__} has no reset method (TRL's environments define one)")
    tools = {}
    for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction):
        if name in SKIPPED or name.startswith("_"):
            continue
        method = getattr(env, name)
        try:
            tools[name] = get_json_schema(method), method
        except (DocstringParsingException, TypeHintParsingException) as err:
            raise EnvError(
                f"env.agent={spec!r}: tool {type(env).__name__}.{name}: {err} (a tool needs type hints and a "
                "Google-style docstring, as TRL requires)"
            ) from None
    return tools


def _build(spec: str, make: Callable, kwargs: dict[str, Any]) -> Any:
    try:
        return make(**kwargs)
    except TypeError as err:
        raise EnvError(f"env.agent={spec!r}: building the environment with env.kwargs={kwargs}: {err}") from None


def _pick(spec: str, factories: dict, row: dict[str, Any]):
    if None in factories:
        return None
    name = row.pop("environment", None)
    if name not in factories:
        raise EnvError(
            f"env.agent={spec!r} names several environments: each row's 'environment' column picks one of "
            f"{sorted(factories)}, this row's is {name!r}"
        )
    return name


def _first_messages(spec: str, row: dict[str, Any], observation: Any) -> list[dict[str, Any]]:
    """The row's conversation (its messages, a chat list in `prompt`, or its text as one user turn), with the
    text `reset` returned appended to the last user message, as TRL does."""
    prompt = row.get("messages") or row.get("prompt")
    messages = [dict(m) for m in prompt] if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
    if observation is None:
        return messages
    if not isinstance(observation, str):
        raise EnvError(f"env.agent={spec!r}: reset returned {type(observation).__name__}, not None or a text")
    users = [m for m in messages if m.get("role") == "user"]
    if not users:
        raise EnvError(f"env.agent={spec!r}: reset returned a text but the row's prompt has no user message")
    users[-1]["content"] = str(users[-1].get("content", "")) + observation
    return messages


async def _run_tool(tools: dict, name: str, arguments: str) -> str:
    """The tool's result as text; an unknown tool, arguments that are not a JSON object, or a raised error come
    back as TRL's `{'error': ...}`."""
    if name not in tools:
        return str({"error": f"Tool {name} not found."})
    try:
        values = json.loads(arguments or "{}")
        if not isinstance(values, dict):
            raise ValueError(f"arguments must be a JSON object, got {arguments!r}")
        return str(await _call(tools[name][1], **values))
    except Exception as err:  # noqa: BLE001 - whatever a tool raises is the model's to read (as TRL does)
        return str({"error": str(err)})


async def _call(function: Callable | None, *args, **kwargs):
    """`function(...)`: awaited when it is a coroutine function, else in a thread (off the endpoint's loop)."""
    if function is None:
        return None
    if inspect.iscoroutinefunction(function):
        return await function(*args, **kwargs)
    result = await asyncio.to_thread(function, *args, **kwargs)
    return await result if inspect.isawaitable(result) else result
