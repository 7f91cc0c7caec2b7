"""`env.tools`: tools named in the config, offered to the model through the chat template's `tools=` and run for
the environment's trajectories (the rollout endpoint's agents and TRL classes run their own: relayrl/agents/).

A tool is named by
- a built-in name (`calculate`: the value of an arithmetic expression),
- `module:function` or `path/file.py:function`: a Python function, its JSON schema made by transformers'
  `get_json_schema` from its type hints and Google-style docstring (as TRL and transformers' chat templates do),
- an OpenAI function schema (`{"type": "function", "function": {"name": ..., "parameters": ...}}`): the
  environment class runs it, as its method of that name.

A model turn is read by vLLM's tool parser for the model's family (relayrl/rollout/tool_calls.py, the same
reading the rollout endpoint gives an agent's calls); the driver sends the environment worker a `ToolTurn`. A
turn that calls tools is answered here, one `tool` message per call, and the trajectory goes on; a turn without
a call is the final answer, the environment's `step` (the built-in `answer` checks it against the row's
`answer` when env.fn is empty). What the model got wrong is never a crash: a call the parser could not read (a
truncated call, bad JSON), an unknown tool, arguments that are not a JSON object or do not fit the function,
and a tool that raises each come back as `{"error": ...}` in the tool message, counted in `env/tool_errors`.
A tool that hangs is the environment's step running past env.timeout_s (its worker is killed, env.on_error).

Light on imports (no torch, no vLLM): the environment workers load the functions; the schemas are made once
in the driver's process (`tool_schemas`), which has transformers loaded.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from relayrl.envs.base import Step, as_step, call
from relayrl.envs.builtins import evaluate_arithmetic
from relayrl.errors import EnvError

ToolSpec = str | dict[str, Any]


def calculate(expression: str) -> str:
    """The value of an arithmetic expression.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "(17 + 4) * 3"
    """
    result = evaluate_arithmetic(expression)
    return str(int(result)) if float(result).is_integer() else f"{result:.6g}"


BUILTIN_TOOLS: dict[str, Callable[..., Any]] = {"calculate": calculate}


@dataclass
class ToolTurn:
    """A model turn as the tool parser read it: its content (the reasoning left out), its calls in the OpenAI
    wire format ({id, type, function: {name, arguments}}), and the calls it could not read."""

    content: str
    calls: list[dict[str, Any]] = field(default_factory=list)
    unread: int = 0


def schema_name(schema: dict[str, Any]) -> str | None:
    function = schema.get("function") if schema.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) and name else None


def load_function(spec: str) -> Callable[..., Any]:
    """A tool's Python function: a built-in name, `module:function` or `path/file.py:function`."""
    from relayrl.envs.base import _import

    if spec in BUILTIN_TOOLS:
        return BUILTIN_TOOLS[spec]
    target, colon, name = spec.rpartition(":")
    if not colon or not target:
        raise EnvError(
            f"env.tools: {spec!r} is not a built-in tool ({', '.join(BUILTIN_TOOLS)}), module:function, "
            "path/file.py:function nor an OpenAI function schema"
        )
    function = getattr(_import(target, spec, key="env.tools"), name, None)
    if not callable(function):
        raise EnvError(f"env.tools: {spec!r}: '{target}' has no function '{name}'")
    return function


def tool_schemas(specs: list[ToolSpec], env_class: type | None) -> list[dict[str, Any]]:
    """The OpenAI schemas the chat template renders, one per tool, checked: a function without type hints or
    docstring, a schema without a name or without the environment method that runs it, two tools of one name."""
    from transformers.utils.chat_template_utils import (
        DocstringParsingException,
        TypeHintParsingException,
        get_json_schema,
    )

    schemas, names = [], set()
    for spec in specs:
        if isinstance(spec, dict):
            name = schema_name(spec)
            if name is None:
                raise EnvError(
                    f"env.tools: {spec!r} is not an OpenAI function schema ({{type: function, function: {{name, ...}}}})"
                )
            if env_class is None or not callable(getattr(env_class, name, None)):
                owner = env_class.__name__ if env_class is not None else "no environment class"
                raise EnvError(
                    f"env.tools: the schema of {name!r} names no function, and {owner} has no method {name!r} to "
                    "run it (name a function as module:function, or give the environment that method)"
                )
            schema = spec
        else:
            try:
                schema = get_json_schema(load_function(spec))
            except (DocstringParsingException, TypeHintParsingException) as err:
                raise EnvError(
                    f"env.tools: {spec!r}: {err} (a tool needs type hints and a Google-style docstring)"
                ) from None
            name = schema["function"]["name"]
        if name in names:
            raise EnvError(f"env.tools: two tools are named {name!r}")
        names.add(name)
        schemas.append(schema)
    return schemas


def tool_functions(
    specs: list[ToolSpec], env: Any, loaded: dict[str, Callable[..., Any]] | None = None
) -> dict[str, Callable[..., Any]]:
    """{name: what runs it}: the named functions (from `loaded`, a worker's imports at start, when given), and the
    environment's methods for the schemas."""
    functions = {}
    for spec in specs:
        if isinstance(spec, dict):
            name = schema_name(spec)
            assert name is not None  # tool_schemas checked it before any worker started
            functions[name] = getattr(env, name)
        else:
            function = loaded[spec] if loaded and spec in loaded else load_function(spec)
            functions[getattr(function, "__name__", spec)] = function
    return functions


def tool_step(env: Any, functions: dict[str, Callable[..., Any]], turn: ToolTurn, where: str) -> Step:
    """The environment's answer to a turn: the tools' results (the trajectory goes on), an error for a call that
    could not be read, or (no call) the environment's own step on the final answer."""
    if turn.calls:
        messages, errors = [], turn.unread
        for tool_call in turn.calls:
            name = tool_call["function"]["name"]
            content, failed = run_tool(functions, name, tool_call["function"].get("arguments"))
            errors += failed
            messages.append({"role": "tool", "tool_call_id": tool_call.get("id", ""), "name": name, "content": content})
        return Step(messages, 0.0, False, {"tool_calls": len(turn.calls), "tool_errors": errors})
    if turn.unread:
        error = "the tool call could not be read: write it whole, in the format the tools were given"
        return Step({"role": "tool", "content": _error(error)}, 0.0, False, {"tool_errors": turn.unread})
    return as_step(call(env.step, turn.content), f"{where}: {type(env).__name__}.step")


def run_tool(functions: dict[str, Callable[..., Any]], name: str, arguments: Any) -> tuple[str, bool]:
    """(the tool message's content, whether it is an error)."""
    if name not in functions:
        return _error(f"unknown tool {name!r}; the tools are {', '.join(sorted(functions))}"), True
    try:
        values = json.loads(arguments) if isinstance(arguments, str) else (arguments or {})
    except json.JSONDecodeError as err:
        return _error(f"the arguments of {name} are not JSON: {err}"), True
    if not isinstance(values, dict):
        return _error(f"the arguments of {name} must be a JSON object, got {arguments!r}"), True
    try:
        result = call(functions[name], **values)
    except TypeError as err:  # arguments that do not fit the function's signature (or the tool's own TypeError)
        return _error(f"{name}: {err}"), True
    except Exception as err:  # noqa: BLE001 - whatever a tool raises is the model's to read
        return _error(f"{name} raised {type(err).__name__}: {err}"), True
    return (result if isinstance(result, str) else json.dumps(result, default=str)), False


def _error(message: str) -> str:
    return json.dumps({"error": message})


# The tool-call format a chat template writes, and vLLM's parser for it (env.tool_parser left empty).
FAMILIES = (("<tool_call>", "hermes"), ("<|python_tag|>", "llama3_json"))


def template_parser(template: Any) -> str | None:
    """vLLM's parser for the tool-call format a chat template writes (env.tool_parser left empty, for env.tools and
    for an agent's calls alike), or None when it writes none known."""
    if not isinstance(template, str):
        return None
    return next((name for marker, name in FAMILIES if marker in template), None)


def parser_for(tool_parser: str, tokenizer, templated: bool, schemas: list[dict[str, Any]]) -> str:
    """env.tool_parser, or the one the chat template's format names; refused, saying why, when the template
    cannot offer tools (no template, or one that renders `tools=` as nothing) or its format is not one known."""
    template = tokenizer.chat_template if templated else None
    if not isinstance(template, str):
        raise EnvError(
            "env.tools needs a chat template that renders tools= (model.path's tokenizer has none, or "
            "data.chat_template is false)"
        )
    probe = [{"role": "user", "content": "hi"}]
    with_tools = tokenizer.apply_chat_template(probe, tools=schemas, tokenize=False, add_generation_prompt=True)
    if with_tools == tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True):
        raise EnvError(
            "env.tools: model.path's chat template renders tools= as nothing: the model would never see them"
        )
    name = tool_parser or template_parser(template)
    if name:
        return name
    known = ", ".join(f"{name} ({marker})" for marker, name in FAMILIES)
    raise EnvError(
        f"env.tools: cannot tell the tool-call format from model.path's chat template (it writes none of {known}): "
        "set env.tool_parser to vLLM's parser for the model's family"
    )
