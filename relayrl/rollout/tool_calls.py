"""vLLM's tool and reasoning parsers, as the agents' endpoint (relayrl/agents/) and env.tools' trajectories
(relayrl/envs/tools.py) use them: a turn's text -> the reasoning, the content and the OpenAI tool calls.

Here, in rollout/, because every call into vLLM's API lives beside the engines that pin its version.

The reasoning (`env.reasoning_parser`: deepseek_r1, qwen3, ...: its tags) is split off first and the tool parser
(`env.tool_parser`: hermes, llama3_json, pythonic, ...) reads only what follows it, so a call the model wrote
while thinking is never executed. What
relayrl counts as a tool error: a call the parser could not read (its start tag present, no call found: a
truncated call, bad JSON), whose text then goes back as plain content, as vLLM's server answers it; and a call
naming a tool the request did not offer, which stays in the turn's tool calls, as vLLM's server returns it (an
agent's library meets it as it would in deployment; env.tools answers it with an error).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Offer:
    """What `parse` reads of a request: the model name and the tools offered."""

    model: str
    tools: list | None


@dataclass
class ParsedTurn:
    content: str | None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # the wire format: {id, type, function}
    tool_errors: int = 0


class TurnParser:
    def __init__(self, tokenizer, tool_parser: str = "", reasoning_parser: str = ""):
        self.tokenizer = tokenizer
        self.tool_class = _tool_parser(tool_parser) if tool_parser else None
        self.reasoning = _reasoning_parser(reasoning_parser, tokenizer) if reasoning_parser else None
        self._tags = _reasoning_tags(self.reasoning, tokenizer) if self.reasoning is not None else (None, None)

    def parse_sampled(self, token_ids: list[int], finish_reason: str, tools: list | None, model: str) -> ParsedTurn:
        """A sampled turn, read as the rollout endpoint answers an agent and as env.tools' trajectories are
        answered (relayrl/envs/tools.py): its text with special tokens kept (a family's tool-call tags may be
        special tokens), and a call in a turn cut at its token budget is not a whole call (vLLM's qwen3_xml
        parser reads an unclosed call as one with the arguments seen so far): it is an error, not run."""
        text = self.text_with_tags(token_ids)
        parsed = self.parse(text, _Offer(model, tools))
        if parsed.tool_calls and finish_reason == "length":
            return ParsedTurn(text, parsed.reasoning, [], parsed.tool_errors + len(parsed.tool_calls))
        return parsed

    def text_with_tags(self, token_ids: list[int]) -> str:
        """The turn's text with special tokens kept, less EOS and padding."""
        text = self.tokenizer.decode(token_ids, skip_special_tokens=False)
        for token in (self.tokenizer.eos_token, self.tokenizer.pad_token):
            if token:
                text = text.replace(token, "")
        return text

    def parse(self, text: str, request) -> ParsedTurn:
        """`request` is the agent's call (relayrl/agents/chat.py ChatRequest: its model and tools)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        vllm_request = ChatCompletionRequest.model_validate(
            {"model": request.model, "messages": [], "tools": request.tools}
        )
        reasoning, content = self._split_reasoning(text, vllm_request)
        if self.tool_class is None or not request.tools or not content:
            return ParsedTurn(content, reasoning)
        parser = self.tool_class(self.tokenizer, vllm_request.tools)  # pyright: ignore[reportArgumentType]
        with _quiet(type(parser).__module__):  # a malformed call is logged with its traceback: counted here
            found = parser.extract_tool_calls(content, vllm_request)
        start = getattr(parser, "tool_call_start_token", None) or getattr(parser, "bot_token", None)
        if not found.tools_called:
            return ParsedTurn(content, reasoning, [], int(bool(start) and start in content))
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in found.tool_calls
        ]
        offered = {t["function"]["name"] for t in request.tools}
        unknown = sum(c["function"]["name"] not in offered for c in calls)
        return ParsedTurn(found.content, reasoning, calls, unknown)

    def _split_reasoning(self, text: str, vllm_request) -> tuple[str | None, str | None]:
        """(reasoning, content). The thinking block is read by its tags: everything up to the end tag (or after an
        unclosed start tag) is reasoning. vLLM's qwen3 parser ends the reasoning at a `<tool_call>` inside the
        block, so a call written while thinking would be executed; here it never is."""
        if self.reasoning is None:
            return None, text
        start, end = self._tags
        if end and end in text:
            before, _, after = text.partition(end)
            return before.replace(start, "", 1) if start else before, after or None
        if start and start in text:  # thinking never closed (cut at the token budget): no content at all
            return text.partition(start)[2], None
        return self.reasoning.extract_reasoning(text, vllm_request)


def check_parsers(tool_parser: str, reasoning_parser: str) -> None:
    """The parsers' names, before anything is built (a reasoning parser's fit to the tokenizer is checked later)."""
    if tool_parser:
        _tool_parser(tool_parser)
    if reasoning_parser:
        from vllm.reasoning import ReasoningParserManager

        from relayrl.errors import ConfigError

        if reasoning_parser not in ReasoningParserManager.list_registered():
            known = ", ".join(ReasoningParserManager.list_registered())
            raise ConfigError(
                f"env.reasoning_parser={reasoning_parser!r} is not one of vLLM's reasoning parsers: {known}"
            )


def _tool_parser(name: str):
    from vllm.tool_parsers import ToolParserManager

    try:
        return ToolParserManager.get_tool_parser(name)
    except KeyError:
        from relayrl.errors import ConfigError

        known = ", ".join(ToolParserManager.list_registered())
        raise ConfigError(f"env.tool_parser={name!r} is not one of vLLM's tool parsers: {known}") from None


def _reasoning_parser(name: str, tokenizer):
    from vllm.reasoning import ReasoningParserManager

    from relayrl.errors import ConfigError

    try:
        cls = ReasoningParserManager.get_reasoning_parser(name)
    except KeyError:
        known = ", ".join(ReasoningParserManager.list_registered())
        raise ConfigError(f"env.reasoning_parser={name!r} is not one of vLLM's reasoning parsers: {known}") from None
    try:
        return cls(tokenizer)
    except (RuntimeError, ValueError) as err:  # e.g. the tokenizer has no <think> tokens
        raise ConfigError(f"env.reasoning_parser={name!r} does not fit the model's tokenizer: {err}") from None


def _reasoning_tags(parser, tokenizer) -> tuple[str | None, str | None]:
    """The thinking block's start and end tags: the parser's own, or read off its end token ids (`</think>` ->
    `<think>`)."""
    start, end = getattr(parser, "start_token", None), getattr(parser, "end_token", None)
    if end is None and getattr(parser, "reasoning_end_token_ids", None):
        end = tokenizer.decode(list(parser.reasoning_end_token_ids)[:1])
    if start is None and end and end.startswith("</"):
        start = "<" + end[2:]
    return start, end


class _quiet:
    """Silence one logger for a block."""

    def __init__(self, name: str):
        self.logger = logging.getLogger(name)

    def __enter__(self):
        self.level, self.logger.level = self.logger.level, logging.CRITICAL

    def __exit__(self, *exc):
        self.logger.level = self.level
