"""Multi-turn warm starts: `relayrl sft` on `messages` rows trains on the assistant turns' tokens only.

A conversation is tokenised exactly as a multi-turn rollout sees it (relayrl/data/chat.py): the first
prompt rendered with the chat template, each assistant turn as the model would emit it (its content, then
the template's end-of-turn suffix up to and including the end-of-sequence token, where the model stops),
each other turn as the template's delta with the missing separator restored. Assistant tokens are trained
(label = the token), everything else is not (-100). So what the warm start learns is what RL continues. A row's
`tools` (OpenAI tool schemas, as TRL's conversational rows carry them) are rendered by the chat template, as an
agent's `tools=` are (relayrl/agents/).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relayrl.data.chat import ChatCodec
from relayrl.data.source import read_rows
from relayrl.errors import DataError

Conversation = tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None]  # (location, messages, tools)


def conversation_rows(path: str | Path) -> list[Conversation] | None:
    """The file's (location, messages, tools) rows when it holds `messages` rows, else None (prompt/completion
    pairs)."""
    rows = read_rows(path)
    if not rows or rows[0][1].get("messages") is None:
        return None
    out = []
    for where, row in rows:
        messages = row.get("messages")
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        ):
            raise DataError(f"{where}: a multi-turn SFT row needs 'messages', a list of {{role, content}} objects")
        if messages[0]["role"] == "assistant" or not any(m["role"] == "assistant" for m in messages):
            raise DataError(f"{where}: 'messages' must open with a non-assistant turn and hold an assistant turn")
        tools = row.get("tools")
        if tools is not None and not (
            isinstance(tools, list)
            and all(isinstance(t, dict) and isinstance(t.get("function", {}).get("name"), str) for t in tools)
        ):
            raise DataError(f"{where}: 'tools' must be a list of {{type: function, function: {{name, parameters}}}}")
        out.append((where, messages, tools or None))
    return out


def conversation_texts(conversations: list[Conversation]) -> list[str]:
    """Every message's text, and the tools' schemas (a tiny model's character vocabulary is trained on them)."""
    import json

    return [m["content"] for _, messages, _ in conversations for m in messages] + [
        json.dumps(tools) for _, _, tools in conversations if tools
    ]


def encode_conversation(
    messages: list[dict[str, Any]], codec: ChatCodec, tools: list | None = None
) -> tuple[list[int], list[bool]]:
    """(token ids, trained flag per token) of one conversation, turn by turn as a rollout builds it."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    _, ids = codec.first_prompt(messages[:first], tools)
    trained = [False] * len(ids)
    history = list(messages[:first])
    tokenizer = codec.tokenizer
    for message in messages[first:]:
        if message["role"] == "assistant":
            suffix = codec.assistant_suffix
            eos = tokenizer.eos_token or ""
            stop = suffix.find(eos) + len(eos) if eos and eos in suffix else len(suffix)
            generated = codec.encode(message["content"] + suffix[:stop])
            if not codec.templated and tokenizer.eos_token_id is not None:
                generated.append(tokenizer.eos_token_id)
            ids, trained = ids + generated, trained + [True] * len(generated)
            history.append(message)
        else:
            delta = codec.observation(history, generated, message, tools)
            if not delta.prefix_ok:
                raise DataError("the chat template rewrites earlier turns once this turn is added")
            ids, trained = ids + delta.token_ids, trained + [False] * len(delta.token_ids)
            history.append(message)
    return ids, trained


def encode_conversations(conversations, tokenizer) -> list[tuple[list[int], list[bool]]]:
    codec = ChatCodec(tokenizer)
    out = []
    for where, messages, tools in conversations:
        try:
            out.append(encode_conversation(messages, codec, tools))
        except DataError as err:
            raise DataError(f"{where}: {err}") from None
    return out
