"""The OpenAI chat-completions and completions wire formats, as the agent endpoint reads and answers them.

`read_request` takes a `/v1/chat/completions` body apart: the messages (text content only; content parts are
joined), the tools, and the sampling fields the agent set. The run's `rollout.*` settings decide the sampling
(the learner's log-probs must be those of the distribution that sampled), so a field that would change it is
reported back to be warned about once and then overridden; a request that cannot be served as asked (several
choices, images) is refused with a 400 naming the field. `stream=true` is read here and served by
relayrl/agents/streaming.py from the finished reply. `answer` builds the `chat.completion`
object from the tokens the engine sampled: the text, the tool calls vLLM's parser found in it (`ToolCalls`),
the finish reason, usage, the log-probs when asked, and vLLM's `prompt_token_ids` / `token_ids` extensions.
The reasoning and the tool calls in a turn's text are found by vLLM's parsers (relayrl/rollout/tool_calls.py).
`read_completion_request` and `answer_text` are the same for `/v1/completions`: one prompt (a text, or token ids)
in, a `text_completion` out; no chat template, no tool parsing.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

# Sampling fields an agent may send that would change the distribution sampled from: overridden (warned once).
OVERRIDDEN = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "seed",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "max_tokens",  # each call's budget is env.max_tokens_per_turn (or rollout.max_tokens) within env.max_total_tokens
    "max_completion_tokens",
    "stop",  # rollout.stop
)


class RequestError(Exception):
    """A request the endpoint cannot serve as asked: answered 400 with this message (`param`: the field)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    logprobs: bool
    overridden: dict[str, Any] = field(default_factory=dict)  # field -> the agent's value (rollout.* wins)
    prompt: str | list[int] | None = None  # a /v1/completions call's prompt (then `messages` is empty)
    stream: bool = False  # answered as server-sent events (relayrl/agents/streaming.py)
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage


def read_request(body: Any) -> ChatRequest:
    overridden = one_choice_as_the_run_samples(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {role, content}", "messages")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(_is_tool(t) for t in tools)):
        raise RequestError("'tools' must be a list of {type: function, function: {name, parameters}}", "tools")
    return ChatRequest(
        model=str(body.get("model") or "policy"),
        messages=[_message(m, i) for i, m in enumerate(messages)],
        tools=tools or None,
        logprobs=bool(body.get("logprobs")),
        overridden=overridden,
        stream=bool(body.get("stream")),
        include_usage=bool(
            isinstance(body.get("stream_options"), dict) and body["stream_options"].get("include_usage")
        ),
    )


def read_completion_request(body: Any) -> ChatRequest:
    """A `/v1/completions` body: one prompt, a string or a list of token ids (not streamed)."""
    overridden = one_choice_as_the_run_samples(body)
    if body.get("stream"):
        raise RequestError("stream=true is not served on /v1/completions: call without streaming", "stream")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    ids = (
        isinstance(prompt, list)
        and bool(prompt)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    )
    if not (isinstance(prompt, str) and prompt) and not ids:
        raise RequestError(
            "'prompt' must be one non-empty string or one list of token ids (one prompt per call)", "prompt"
        )
    unserved = {"echo": bool(body.get("echo")), "suffix": body.get("suffix") is not None}
    unserved["best_of"] = body.get("best_of") not in (None, 1) or isinstance(body.get("best_of"), bool)
    for name in (name for name, sent in unserved.items() if sent):
        raise RequestError(f"{name}={body[name]!r} is not served: the call samples one completion of the prompt", name)
    return ChatRequest(
        model=str(body.get("model") or "policy"),
        messages=[],
        tools=None,
        logprobs=body.get("logprobs") not in (None, False, 0),
        overridden=overridden,
        prompt=prompt,
    )


def one_choice_as_the_run_samples(body: Any) -> dict[str, Any]:
    """Checks either endpoint's body; returns the sampling fields that the run's settings override."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if body.get("n", 1) not in (1, None):
        raise RequestError(
            f"n={body['n']}: one choice per call (a group's samples are the run's rollout.n trajectories)", "n"
        )
    extra: dict[str, Any] = body["extra_body"] if isinstance(body.get("extra_body"), dict) else {}
    sent = {**extra, **{k: v for k, v in body.items() if k != "extra_body"}}
    overridden = {k: sent[k] for k in OVERRIDDEN if sent.get(k) is not None}
    if sent.get("tool_choice") not in (None, "auto"):  # "required" or a named tool would constrain the decoding
        overridden["tool_choice"] = sent["tool_choice"]
    return overridden


def _is_tool(tool: Any) -> bool:
    function = tool.get("function") if isinstance(tool, dict) else None
    return isinstance(function, dict) and isinstance(function.get("name"), str)


def _message(message: Any, index: int) -> dict[str, Any]:
    """One message as the chat template takes it: text content (parts joined), tool calls with dict arguments."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise RequestError(f"messages[{index}] must be an object with a 'role'", "messages")
    out: dict[str, Any] = {"role": message["role"], "content": _text(message.get("content"), index)}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [tool_call(c, index) for c in calls]
    for key in ("tool_call_id", "name"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    return out


def _text(content: Any, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(
                    f"messages[{index}]: content part of type {kind!r}: only text parts are served", "messages"
                )
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"messages[{index}]: content must be a string or a list of text parts", "messages")


def tool_call(call: Any, index: int) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RequestError(
            f"messages[{index}]: a tool call must be {{type: function, function: {{name, arguments}}}}", "messages"
        )
    arguments = function.get("arguments")
    if isinstance(arguments, str):  # the wire carries a JSON string; chat templates take the object
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    return {
        "id": call.get("id", ""),
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


def same_reply(sent_back: dict[str, Any], answered: dict[str, Any]) -> bool:
    """Whether the assistant message an agent sent back is the one it was answered with (content and calls)."""
    if sent_back.get("role") != "assistant" or (sent_back.get("content") or "") != (answered.get("content") or ""):
        return False
    mine = [(c["function"]["name"], c["function"]["arguments"]) for c in sent_back.get("tool_calls", ())]
    theirs = [(c["function"]["name"], c["function"]["arguments"]) for c in answered.get("tool_calls", ())]
    return mine == theirs


def answer(
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
    """A `chat.completion` object for one sampled turn (`reasoning`: vLLM's field for the thinking part)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": "tool_calls" if tool_calls and finish_reason == "stop" else finish_reason,
        "logprobs": None,
        "token_ids": token_ids,
    }
    if request.logprobs:
        choice["logprobs"] = {
            "content": [
                {"token": t, "logprob": lp, "bytes": None, "top_logprobs": []} for t, lp in zip(tokens, logprobs)
            ]
        }
    return {
        **_reply("chat.completion", call_id, request, choice, prompt_ids, token_ids),
        "prompt_token_ids": prompt_ids,
    }


def answer_text(
    request: ChatRequest,
    *,
    call_id: str,
    prompt_ids: list[int],
    token_ids: list[int],
    logprobs: list[float],
    text: str,
    finish_reason: str,
    tokens: list[str],
) -> dict[str, Any]:
    """A `text_completion` object for one sampled turn, with vLLM's `prompt_token_ids` / `token_ids`."""
    choice: dict[str, Any] = {
        "index": 0,
        "text": text,
        "finish_reason": finish_reason,
        "logprobs": None,
        "token_ids": token_ids,
        "prompt_token_ids": prompt_ids,
    }
    if request.logprobs:
        offsets = list(itertools.accumulate((len(t) for t in tokens[:-1]), initial=0)) if tokens else []
        choice["logprobs"] = {
            "tokens": tokens,
            "token_logprobs": logprobs,
            "top_logprobs": None,
            "text_offset": offsets,
        }
    return _reply("text_completion", call_id, request, choice, prompt_ids, token_ids)


def _reply(kind: str, call_id: str, request: ChatRequest, choice: dict, prompt_ids: list[int], token_ids: list[int]):
    """Either endpoint's reply around its one choice: id, object, model, usage."""
    usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(token_ids)}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return {
        "id": call_id,
        "object": kind,
        "created": int(time.time()),
        "model": request.model,
        "choices": [choice],
        "usage": usage,
    }


def error_body(
    message: str, kind: str = "invalid_request_error", code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
