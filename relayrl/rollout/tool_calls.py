"""vLLM's tool parsers, as the agents' endpoint uses them (relayrl/agents/): a turn's text -> OpenAI tool calls.

Here, in rollout/, because every call into vLLM's API lives beside the engines that pin its version.
"""

from __future__ import annotations

import logging
from typing import Any


class ToolCalls:
    """vLLM's tool parser for one family (`env.tool_parser`), with what relayrl counts: a call the parser could
    not read (its start tag present, no call found), or one naming a tool the request did not offer, is a tool
    error; the text then goes back to the agent as plain content, as vLLM's server does."""

    def __init__(self, name: str, tokenizer):
        from vllm.tool_parsers import ToolParserManager

        try:
            self.parser_class = ToolParserManager.get_tool_parser(name)
        except KeyError:
            from relayrl.errors import ConfigError

            known = ", ".join(ToolParserManager.list_registered())
            raise ConfigError(f"env.tool_parser={name!r} is not one of vLLM's tool parsers: {known}") from None
        self.tokenizer = tokenizer
        self.name = name

    def parse(self, text: str, request) -> tuple[str | None, list[dict[str, Any]], int]:
        """(content, tool calls in the wire format, tool errors) of a turn's text; `request` is the agent's call
        (relayrl/agents/chat.py ChatRequest: its model and tools)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        offered = {t["function"]["name"] for t in request.tools or ()}
        vllm_request = ChatCompletionRequest.model_validate(
            {"model": request.model, "messages": [], "tools": request.tools}
        )
        parser = self.parser_class(self.tokenizer, vllm_request.tools)  # pyright: ignore[reportArgumentType]
        quiet = logging.getLogger(type(parser).__module__)
        level, quiet.level = (
            quiet.level,
            logging.CRITICAL,
        )  # a malformed call is logged with its traceback: counted here
        try:
            found = parser.extract_tool_calls(text, vllm_request)
        finally:
            quiet.level = level
        start = getattr(parser, "tool_call_start_token", None)
        if not found.tools_called:
            return text, [], int(bool(start) and start in text)
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in found.tool_calls
        ]
        unknown = sum(c["function"]["name"] not in offered for c in calls)
        return found.content, calls, unknown
