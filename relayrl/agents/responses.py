"""The OpenAI Responses API wire format (`POST /v1/responses`), as the agent endpoint reads and answers it.

`read_response_request` turns a Responses body into the same `ChatRequest` a chat call makes (messages and chat
tools, as vLLM's Responses server converts them: relayrl/agents/chat.py reads chat), so a responses call and a
chat call for one conversation render the same prompt and a later call continues the trajectory by the same check:
`instructions` is a system message first; `input` is a text (a user message) or items: `message` (user, system,
developer, assistant; text or input_text/output_text parts), `function_call` (joined to the assistant message
before it as its tool calls), `function_call_output` (a tool message), `reasoning` (left out, as chat leaves an
assistant message's reasoning out); flat function tools become chat tools. `previous_response_id` naming the
trajectory's last response prepends that conversation (`Previous`, without its instructions, as OpenAI's server
does). Sampling fields (`max_output_tokens`, `temperature`, a forced `tool_choice`, a `text.format` other than
text) are overridden by the run's, as chat's are. What only OpenAI's own servers hold is refused, naming the field:
another response id, `conversation`, `background`, a stored `prompt`, tools they run (web search, file search,
computer, ...), non-text input parts, item types other than the above.

`answer_response` builds the `response` object from the sampled turn: a `reasoning` item (when a reasoning parser
split one off), a `message` item with one `output_text` part (its log-probs when `include` asks), one
`function_call` item per tool call, `status` completed (or incomplete at the token budget), usage, and vLLM-style
`prompt_token_ids` / `token_ids`. Streaming it is relayrl/agents/streaming.py's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from relayrl.agents.chat import ChatRequest, RequestError, one_choice_as_the_run_samples, tool_call

REFUSED = {  # field -> why: state or work only OpenAI's own servers hold
    "background": "a background response is polled from OpenAI's store; call without it",
    "conversation": "conversations live in OpenAI's store; send the items as `input`",
    "prompt": "a stored prompt template lives in OpenAI's store; send `instructions` and `input`",
}
ECHOED = ("metadata", "parallel_tool_calls", "previous_response_id", "reasoning", "store", "text", "truncation", "user")
LOGPROBS = "message.output_text.logprobs"  # the `include` value that asks for the sampled tokens' log-probs


@dataclass
class ResponsesRequest(ChatRequest):
    """A `/v1/responses` call, read into chat's terms; what its reply echoes back."""

    instructions: str | None = None
    echo: dict[str, Any] = field(default_factory=dict)  # tools, tool_choice and ECHOED as the agent sent them


@dataclass
class Previous:
    """A trajectory's last response, for a call naming it in `previous_response_id`: its conversation (its input,
    without its instructions, then the assistant message it was answered with)."""

    response_id: str
    conversation: list[dict[str, Any]]


def remembered(request: ResponsesRequest, response_id: str, answered: dict[str, Any]) -> Previous:
    without = request.messages[1:] if request.instructions is not None else request.messages
    return Previous(response_id, [*without, answered])


def read_response_request(body: Any, previous: Previous | None) -> ResponsesRequest:
    overridden = one_choice_as_the_run_samples(body)
    if body.get("max_output_tokens") is not None:  # as chat's max_tokens: the run's budget
        overridden["max_output_tokens"] = body["max_output_tokens"]
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):  # as chat's response_format
        overridden["text.format"] = fmt
    for name, why in REFUSED.items():
        if body.get(name) not in (None, False):
            raise RequestError(f"{name}={body[name]!r} is not served: {why}", name)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RequestError("'instructions' must be a string", "instructions")
    messages = [{"role": "system", "content": instructions}] if instructions else []
    messages += _previous(body.get("previous_response_id"), previous)
    messages += input_messages(body.get("input"))
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise RequestError("'tools' must be a list of function tools", "tools")
    include = body.get("include") or []
    return ResponsesRequest(
        model=str(body.get("model") or "policy"),
        messages=messages,
        tools=[_chat_tool(tool, i) for i, tool in enumerate(tools)] or None,
        logprobs=isinstance(include, list) and LOGPROBS in include,
        overridden=overridden,
        stream=bool(body.get("stream")),
        instructions=instructions or None,
        echo={"tools": tools, "tool_choice": body.get("tool_choice") or "auto"}
        | {k: body[k] for k in ECHOED if body.get(k) is not None},
    )


def _previous(response_id: Any, previous: Previous | None) -> list[dict[str, Any]]:
    if response_id is None:
        return []
    if previous is None or response_id != previous.response_id:
        last = f"its last response is {previous.response_id!r}" if previous else "it has no earlier response"
        raise RequestError(
            f"previous_response_id={response_id!r} is not served: only this trajectory's last response can be "
            f"continued ({last}); or send the whole conversation as `input`",
            "previous_response_id",
        )
    return [dict(m) for m in previous.conversation]


def _chat_tool(tool: Any, index: int) -> dict[str, Any]:
    """A flat Responses function tool as the chat tool the template renders (vLLM's conversion)."""
    kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
    if kind != "function":
        raise RequestError(
            f"tools[{index}] of type {kind!r} is not served: only function tools (the agent runs them); a tool "
            "that OpenAI's servers run (web search, file search, computer, code interpreter, MCP, ...) has no "
            "server here",
            f"tools[{index}].type",
        )
    if not isinstance(tool.get("name"), str):
        raise RequestError(f"tools[{index}] must be {{type: function, name, parameters}}", f"tools[{index}].name")
    function = {k: v for k, v in tool.items() if k != "type" and v is not None}
    return {"type": "function", "function": function}


def input_messages(items: Any) -> list[dict[str, Any]]:
    """`input` as chat messages: a text is one user message; items are read in order."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise RequestError("'input' must be a non-empty string or a non-empty list of items", "input")
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise RequestError(f"input[{index}] must be an object", f"input[{index}]")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            messages.append(_input_message(item, index))
        elif kind == "function_call":
            _join_call(messages, item, index)
        elif kind == "function_call_output":
            output = _text(item.get("output"), f"input[{index}].output")
            messages.append({"role": "tool", "content": output, "tool_call_id": str(item.get("call_id", ""))})
        elif kind != "reasoning":  # a reasoning item: left out of the prompt, as chat leaves `reasoning` out
            raise RequestError(
                f"input[{index}] of type {kind!r} is not served: only message, function_call, "
                "function_call_output and reasoning items",
                f"input[{index}].type",
            )
    return messages


def _input_message(item: dict[str, Any], index: int) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise RequestError(
            f"input[{index}]: role {role!r} is not one of user, system, developer, assistant", f"input[{index}].role"
        )
    return {"role": role, "content": _text(item.get("content"), f"input[{index}].content")}


def _join_call(messages: list[dict[str, Any]], item: dict[str, Any], index: int) -> None:
    """A `function_call` item is a tool call of the assistant message just before it (or of a new one)."""
    name, arguments = item.get("name"), item.get("arguments")
    if not isinstance(name, str) or not isinstance(arguments, str):
        raise RequestError(
            f"input[{index}]: a function_call has a name and arguments (a JSON string)", f"input[{index}]"
        )
    call = tool_call({"id": item.get("call_id", ""), "function": {"name": name, "arguments": arguments}}, index)
    if not messages or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": ""})
    messages[-1].setdefault("tool_calls", []).append(call)


def _text(content: Any, where: str) -> str:
    """A content or output: a text, or text parts (input_text, output_text) joined."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
                raise RequestError(
                    f"{where}[{j}]: a part of type {kind!r} is not served: only text parts (input_text, output_text)",
                    f"{where}[{j}].type",
                )
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"{where} must be a string or a list of text parts", where)


def answer_response(
    request: ChatRequest,
    *,
    call_id: str,
    prompt_ids: list[int],
    token_ids: list[int],
    logprobs: list[float],
    content: str | None,
    tool_calls: list[dict[str, Any]],
    finish_reason: str,
    tokens: list[str],
    reasoning: str | None = None,
) -> dict[str, Any]:
    """A `response` object for one sampled turn (`tokens`: each sampled token's text, for the log-probs)."""
    assert isinstance(request, ResponsesRequest)  # typed as chat's `answer` is, for the pool to pick either
    cut = finish_reason == "length"
    status = "incomplete" if cut else "completed"
    output: list[dict[str, Any]] = []
    if reasoning:
        part = {"type": "reasoning_text", "text": reasoning}
        output.append({"id": f"rs_{call_id}", "type": "reasoning", "summary": [], "content": [part], "status": status})
    if content or not tool_calls:
        part = {"type": "output_text", "text": content or "", "annotations": []}
        if request.logprobs:
            part["logprobs"] = [
                {"token": t, "bytes": list(t.encode()), "logprob": lp, "top_logprobs": []}
                for t, lp in zip(tokens, logprobs)
            ]
        message = {"id": f"msg_{call_id}", "type": "message", "role": "assistant", "status": status}
        output.append(message | {"content": [part]})
    for j, call in enumerate(tool_calls):
        function = call["function"]
        item = {"id": f"fc_{call_id}_{j}", "type": "function_call", "call_id": call["id"], "name": function["name"]}
        output.append(item | {"arguments": function["arguments"], "status": "completed"})
    usage = {
        "input_tokens": len(prompt_ids),
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": len(token_ids),
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": len(prompt_ids) + len(token_ids),
    }
    return {
        "id": call_id,
        "object": "response",
        "created_at": time.time(),
        "model": request.model,
        "status": status,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "instructions": request.instructions,
        "output": output,
        "parallel_tool_calls": True,
        **request.echo,
        "usage": usage,
        "prompt_token_ids": prompt_ids,
        "token_ids": token_ids,
    }
