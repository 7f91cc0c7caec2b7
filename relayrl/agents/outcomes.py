"""How an agent's trajectory ended, when it did not end with a reward: the model's doing, or the agent's.

An agent library raises when the model writes something it cannot use: the Agents SDK's `ModelBehaviorError`,
DSPy's `AdapterParseError`, pydantic-ai's `UnexpectedModelBehavior`, LangChain's `OutputParserException`, a
`json.JSONDecodeError` from a call's arguments, ... That is the trajectory's outcome (reward 0, counted in
`env/errors`), not the run's end. `model_behaviour` tells such an exception by the names of its classes (the
class or one it derives from, by its package and name), so none of these libraries is imported. Any other
exception is the agent's own (env.on_error decides, as for an environment).

A broken agent or setup can make every trajectory fail, even in a way that reads as the model's: the same
model-behaviour exception from every trajectory of a step (the driver's step check in
relayrl/sources/trajectories.py), or the same exception of any class from each of the run's first `FIRST_K`
trajectories (`AgentErrors`, whatever env.on_error says), stops the run naming it.

`Notices` says a per-trajectory warning once: the first of each kind in full, the later ones counted and summed up
in one line at the step's end; `RepeatedLogs` does the same to the lines the agents' libraries log, and
`agents_sdk_tracing_off` stops the OpenAI Agents SDK's trace export. The messages that stop a run are here too.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from relayrl.envs.tools import FAMILIES
from relayrl.errors import RelayWarning

# (top-level package, class name) of the exceptions agent libraries raise over what the model wrote
MODEL_BEHAVIOUR = frozenset(
    (
        ("agents", "ModelBehaviorError"),  # openai-agents: a call to an unknown tool, unreadable output
        ("agents", "MaxTurnsExceeded"),  # openai-agents: the model kept calling tools
        ("dspy", "AdapterParseError"),  # DSPy: the reply does not fit the signature's fields
        ("pydantic_ai", "UnexpectedModelBehavior"),  # pydantic-ai: retries on the model's output exhausted
        ("langchain_core", "OutputParserException"),  # LangChain: an output parser could not read the reply
        ("langgraph", "GraphRecursionError"),  # LangGraph: the model looped past the recursion limit
        ("openai", "LengthFinishReasonError"),  # openai's .parse(): the reply was cut at its token budget
        ("openai", "ContentFilterFinishReasonError"),
        ("json", "JSONDecodeError"),  # a call's arguments (or a reply) that are not JSON
    )
)
AGENT_THREADS = "relayrl-agent"  # the names the endpoint's loop and the plain agents' threads start with
FIRST_K = 8  # the run's first trajectories: all ending in one exception class stops the run


def model_behaviour(error: BaseException) -> str | None:
    """`package.Class` of the known model-behaviour exception `error` is (or derives from), else None."""
    for cls in type(error).__mro__:
        package = cls.__module__.partition(".")[0]
        if (package, cls.__name__) in MODEL_BEHAVIOUR:
            return f"{package}.{cls.__name__}"
    return None


def kind_of(error: BaseException) -> str:
    """The exception's class as `module.Class`: what two trajectories' failures are compared by."""
    return f"{type(error).__module__}.{type(error).__qualname__}"


class AgentErrors:
    """The run's agent exceptions (shared by its lanes): the first traceback of each model-behaviour kind is
    printed, and the run's first `FIRST_K` trajectories all ending in one exception class is a broken setup,
    whatever env.on_error says."""

    def __init__(self):
        self.ended = 0  # trajectories ended so far (while the run is young)
        self.first: dict[str, str] = {}  # exception class -> its first trajectory's description
        self.streak: tuple[str, int] | None = None  # (class, count) while every trajectory so far ended in it
        self.printed: set[str] = set()
        self._lock = threading.Lock()

    def trajectory_ended(self, error: BaseException | None, where: str) -> str | None:
        """Any trajectory's end (`error`: the exception it ended in, or None). The first trajectory's description of
        that exception when the run's first FIRST_K trajectories all ended in it: the run stops."""
        kind = kind_of(error) if error is not None else None
        with self._lock:
            if error is not None and kind is not None:
                self.first.setdefault(kind, f"{where}: {_described(error)}")
            if self.ended < FIRST_K:
                count = self.streak[1] if self.streak and self.streak[0] == kind else 0
                self.streak = (kind, count + 1) if kind is not None and count == self.ended else None
            self.ended += 1
            return self.first[self.streak[0]] if self.streak and self.streak[1] >= FIRST_K else None

    def first_of_its_kind(self, kind: str, error: BaseException, spec: str, where: str) -> None:
        """A model-behaviour exception's traceback, printed for the first of its kind in the run."""
        with self._lock:
            if kind in self.printed:
                return
            self.printed.add(kind)
        text = "".join(traceback.format_exception(error))
        warnings.warn(
            f"{spec}: {where}: the agent raised {kind_of(error)}, an error over what the model wrote: the trajectory "
            f"scores 0 (env/errors); later ones are counted, not printed. Its traceback:\n{text}",
            RelayWarning,
            stacklevel=2,
        )


class Notices:
    """Per-trajectory warnings of one kind said once; the later ones counted, summed up by `step_ended`."""

    def __init__(self):
        self.said: dict[str, str] = {}  # kind -> its line
        self.repeats: Counter[str] = Counter()
        self._lock = threading.Lock()

    def first(self, kind: str, line: str) -> bool:
        """Whether `kind` is new this run (its `line` kept for the summary); a repeat is counted."""
        with self._lock:
            if kind in self.said:
                self.repeats[kind] += 1
                return False
            self.said[kind] = line
            return True

    def say(self, kind: str, line: str, where: str) -> None:
        """`line` with the first trajectory's name (`where`), once per run; later ones are counted."""
        if self.first(kind, line):
            warnings.warn(f"{line} ({where}; later trajectories like it are counted)", RelayWarning, stacklevel=2)

    def step_ended(self) -> None:
        """One line per kind said again since the last step's end: its line and how many more times."""
        with self._lock:
            repeats, self.repeats = self.repeats, Counter()
        for kind, count in repeats.items():
            warnings.warn(f"{self.said[kind]} (repeated {count} more times this step)", RelayWarning, stacklevel=2)


class RepeatedLogs(logging.Filter):
    """A line the agents' libraries log from every trajectory (one logger, level and message template) passes once;
    the later ones are counted in `notices`, summed up at the step's end. Records from other threads all pass."""

    def __init__(self, notices: Notices):
        super().__init__()
        self.notices = notices

    def filter(self, record: logging.LogRecord) -> bool:
        if not (record.threadName or "").startswith(AGENT_THREADS):
            return True
        decided = record.__dict__  # once per record, whichever handlers it reaches
        if "relayrl_first" not in decided:
            kind = f"log {record.name}:{record.levelno}:{record.msg}"
            decided["relayrl_first"] = self.notices.first(kind, f"{record.name} logged {record.getMessage()!r}")
        return decided["relayrl_first"]


@dataclass
class Faults:
    """What the run's agents got wrong, shared by its lanes: their exceptions, the notices said once, and the
    filter on their libraries' repeated log lines (while `logs` is set)."""

    errors: AgentErrors = field(default_factory=AgentErrors)
    notices: Notices = field(default_factory=Notices)
    logs: RepeatedLogs | None = None

    def quiet_logs(self) -> None:
        """Filter the agents' repeated log lines at the handlers a record reaches now: the root logger's, or
        Python's last resort (no logging configured: a library's warning goes to stderr)."""
        if self.logs is None:
            self.logs = RepeatedLogs(self.notices)
            for handler in _handlers():
                handler.addFilter(self.logs)

    def loud_logs(self) -> None:
        if self.logs is not None:
            for handler in _handlers():
                handler.removeFilter(self.logs)
            self.logs = None


def _handlers() -> list[logging.Handler]:
    return [*logging.getLogger().handlers, *([logging.lastResort] if logging.lastResort else [])]


def broken_setup(cause: str) -> str:
    """Why the run stops when its first FIRST_K trajectories all ended in one exception (`cause`)."""
    return (
        f"the run's first {FIRST_K} trajectories all ended in the same exception ({cause}): the agent or its setup is "
        "broken (its own bug, a prompt or format the model is never asked for, a library misconfigured), not the model"
    )


def no_tool_parser(tools: list[dict[str, Any]]) -> str:
    """Why the run stops at a call with tools= that no tool parser reads (env.tool_parser unset, unknown format)."""
    known = ", ".join(f"{name} ({marker})" for marker, name in FAMILIES)
    return (
        f"the agent's call passes tools= ({', '.join(t['function']['name'] for t in tools)}), but env.tool_parser is "
        f"not set and the chat template writes none of the tool-call formats relayrl can tell ({known}): the "
        "model's calls would stay in the text, every trajectory scoring what the agent makes of that; set "
        "env.tool_parser to vLLM's parser for the model's family (hermes, llama3_json, mistral, qwen3_xml, ...)"
    )


def agents_sdk_tracing_off() -> None:
    """The OpenAI Agents SDK exports a trace of every run to OpenAI (without a key it prints "OPENAI_API_KEY is not
    set, skipping trace export" per trajectory): off in the run's agents, unless OPENAI_AGENTS_DISABLE_TRACING is
    set (the SDK reads it at its first trace; `set_tracing_disabled` if it is loaded already)."""
    if "OPENAI_AGENTS_DISABLE_TRACING" in os.environ:
        return
    os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    disable = getattr(sys.modules.get("agents"), "set_tracing_disabled", None)
    if callable(disable):
        disable(True)


def _described(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
