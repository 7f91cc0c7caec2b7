"""`stream=true` on the agents' endpoint: a finished reply as the server-sent events OpenAI's servers send.

The run's engines are offline engines: a call's turn is sampled whole, then answered. A streamed call gets the
same reply as an unstreamed one, cut into the pieces a live stream would have carried: the turn's text split at
its sampled tokens (`token_pieces`, each token's text as an incremental decode gives it), so a library that
reassembles the stream gets exactly the unstreamed reply, and training sees the same tokens either way.

`chat_stream` turns a `chat.completion` into `chat.completion.chunk`s (the role, the reasoning and content deltas
with their tokens' log-probs and ids, each tool call's id and name then its arguments, the finish reason, the usage
when `stream_options.include_usage`), closed by `data: [DONE]`. `response_stream` turns a Responses API `response`
into its event sequence (`response.created`, `response.in_progress`, per output item `output_item.added`, its
content part or arguments deltas, `output_item.done`, then `response.completed` or `response.incomplete`), each with
its `sequence_number`. `Stream` frames either for Starlette's `StreamingResponse`. Not here: `/v1/completions`
streaming (refused), and anything that needs the engine to stream (it never does).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

WINDOW = 8  # tokens decoded before each one, so that a token's text is read in its context (UTF-8, leading spaces)


@dataclass
class Stream:
    """A finished reply as server-sent events: `named` gives each event its `type` as the SSE event name (the
    Responses API); `done` closes with `data: [DONE]` (chat completions)."""

    events: list[dict[str, Any]]
    named: bool
    done: bool

    async def frames(self) -> AsyncIterator[bytes]:
        for event in self.events:
            head = f"event: {event['type']}\n" if self.named else ""
            yield f"{head}data: {json.dumps(event, separators=(',', ':'))}\n\n".encode()
        if self.done:
            yield b"data: [DONE]\n\n"


def token_pieces(tokenizer, token_ids: Sequence[int]) -> list[str]:
    """Each sampled token's text, as an incremental decode gives it ("" while a character's bytes are incomplete):
    joined they are the turn's decoded text (special tokens included)."""
    decode: Callable[[list[int]], str] = tokenizer.decode
    pieces: list[str] = []
    start = 0  # the first token whose text is not yet given
    for end in range(1, len(token_ids) + 1):
        lo = max(0, start - WINDOW)
        text = decode(list(token_ids[lo:end]))
        if text.endswith("\ufffd") and end < len(token_ids):
            pieces.append("")  # an incomplete character: its text comes with a later token
            continue
        before = decode(list(token_ids[lo:start]))
        pieces.append(text[len(before) :] if text.startswith(before) else text)
        start = end
    return pieces


def text_pieces(text: str, pieces: list[str], after: int = 0) -> tuple[list[str], int]:
    """`text` split at the token boundaries of `pieces` (the turn's tokens' texts): one string per token, "" for a
    token outside `text`; joined they are `text` exactly. `text` is found in the turn's text from `after`; a text
    not found there (a parser's rewriting) comes whole on the last token. Also returns where `text` ends in the
    turn's text (`after` when not found), for the next text to be looked for from there."""
    whole = "".join(pieces)
    start = whole.find(text, after) if text else -1
    if start < 0:
        return ([""] * (len(pieces) - 1) + [text] if pieces else [text]), after
    out, position = [], 0
    for piece in pieces:
        lo, hi = max(position, start), min(position + len(piece), start + len(text))
        out.append(whole[lo:hi] if hi > lo else "")
        position += len(piece)
    return out, start + len(text)


def _split(text: str, pieces: list[str]) -> list[str]:
    return [p for p in text_pieces(text, pieces)[0] if p] or [text]


# ---------------------------------------------------------------------------------------------- chat completions
def chat_stream(completion: dict[str, Any], pieces: list[str], include_usage: bool) -> Stream:
    """A `chat.completion` as its chunks: reassembled (content, reasoning, tool calls, log-probs, token ids, finish
    reason, usage) they are the completion."""
    (choice,) = completion["choices"]
    message, token_ids = choice["message"], choice["token_ids"]
    entries = (choice["logprobs"] or {}).get("content")
    head = {k: completion[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], tokens: range = range(0), finish: str | None = None) -> dict[str, Any]:
        part: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if tokens:
            part["token_ids"] = token_ids[tokens.start : tokens.stop]
        if entries is not None and tokens:
            part["logprobs"] = {"content": entries[tokens.start : tokens.stop]}
        return {**head, "choices": [part]}

    chunks = [{**chunk({"role": "assistant", "content": ""}), "prompt_token_ids": completion["prompt_token_ids"]}]
    reasoning, end = text_pieces(message.get("reasoning") or "", pieces)
    content, _ = text_pieces(message["content"] or "", pieces, after=end)
    given = 0  # the tokens whose ids (and log-probs) a chunk has carried
    for i, (said, wrote) in enumerate(zip(reasoning, content)):
        for key, text in (("reasoning", said), ("content", wrote)):
            if text:
                chunks.append(chunk({key: text}, range(given, i + 1)))
                given = i + 1
    for index, call in enumerate(message.get("tool_calls") or ()):
        function = call["function"]
        opening = {"index": index, "id": call["id"], "type": "function"}
        chunks.append(chunk({"tool_calls": [opening | {"function": {"name": function["name"], "arguments": ""}}]}))
        for part in _split(function["arguments"], pieces):
            chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]}))
    chunks.append(chunk({}, range(given, len(token_ids)), choice["finish_reason"]))
    if include_usage:
        chunks.append({**head, "choices": [], "usage": completion["usage"]})
    return Stream(chunks, named=False, done=True)


# ---------------------------------------------------------------------------------------------- responses
def response_stream(response: dict[str, Any], pieces: list[str]) -> Stream:
    """A Responses API `response` as its events: the output items' deltas add up to its output, and the last
    event (`response.completed`, or `response.incomplete` when the turn was cut) carries the response itself."""
    numbers = itertools.count()
    events: list[dict[str, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": next(numbers), **fields})

    opening = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    emit("response.created", response=opening)
    emit("response.in_progress", response=opening)
    after = 0  # where the next item's text is looked for in the turn's text
    for index, item in enumerate(response["output"]):
        if item["type"] == "function_call":
            _function_call_events(emit, index, item, pieces)
            continue
        (part,) = item["content"]
        emit("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []})
        after = _text_part_events(emit, index, item["id"], part, pieces, after)
        emit("response.output_item.done", output_index=index, item=item)
    emit(f"response.{response['status']}", response=response)
    return Stream(events, named=True, done=False)


def _text_part_events(emit, index: int, item_id: str, part: dict[str, Any], pieces: list[str], after: int) -> int:
    """A message's `output_text` or a reasoning item's `reasoning_text`, one delta per token; returns where the
    text ends in the turn's text."""
    where = {"item_id": item_id, "output_index": index, "content_index": 0}
    text, reasoning = part["text"], part["type"] == "reasoning_text"
    entries = part.get("logprobs") or []
    emit("response.content_part.added", **where, part={**part, "text": "", **({} if reasoning else {"logprobs": []})})
    given = 0
    split, end = text_pieces(text, pieces, after)
    for i, piece in enumerate(split):
        if not piece:
            continue
        if reasoning:
            emit("response.reasoning_text.delta", **where, delta=piece)
        else:
            emit("response.output_text.delta", **where, delta=piece, logprobs=_delta_logprobs(entries[given : i + 1]))
        given = i + 1
    if reasoning:
        emit("response.reasoning_text.done", **where, text=text)
    else:
        emit("response.output_text.done", **where, text=text, logprobs=_delta_logprobs(entries))
    emit("response.content_part.done", **where, part=part)
    return end


def _delta_logprobs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"token": e["token"], "logprob": e["logprob"], "top_logprobs": []} for e in entries]


def _function_call_events(emit, index: int, item: dict[str, Any], pieces: list[str]) -> None:
    emit("response.output_item.added", output_index=index, item={**item, "arguments": "", "status": "in_progress"})
    for part in _split(item["arguments"], pieces):
        emit("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=part)
    done = {"item_id": item["id"], "output_index": index, "name": item["name"], "arguments": item["arguments"]}
    emit("response.function_call_arguments.done", **done)
    emit("response.output_item.done", output_index=index, item=item)
