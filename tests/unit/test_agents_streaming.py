"""`stream=true` on the agents' endpoint (relayrl/agents/streaming.py), with the real openai client's own stream
readers and a scripted engine: a streamed chat completion or response, reassembled by the library, is the
unstreamed reply (text, tool calls, finish reason or status, usage, log-probs), it arrives in per-token pieces, and
training sees the same tokens either way; the event sequence is the one OpenAI's servers send."""

from __future__ import annotations

import pytest

from relayrl.agents.server import AgentServer
from relayrl.agents.streaming import text_pieces, token_pieces
from tests.unit.agent_harness import ADD, tool_tokenizer
from tests.unit.test_agents_responses import ADD_FLAT, CALL, SEEN, run, trained
from tests.unit.test_tito import chat_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore::relayrl.errors.ConfigWarning")
ANSWER = "the sum is 5"
STRICT_ADD = {**ADD, "function": {**ADD["function"], "strict": True}}  # the client's stream reader parses only these


# ---------------------------------------------------------------------------------------------- agents
async def chat_plain(client, row):
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(2):
        reply = await client.chat.completions.create(model="m", messages=messages, tools=[STRICT_ADD], logprobs=True)
        SEEN.append(reply)
        messages += _chat_history(reply.choices[0].message)
    return 1.0


async def chat_streamed(client, row):
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(2):
        asked = {"model": "m", "messages": messages, "tools": [STRICT_ADD], "logprobs": True}
        async with client.chat.completions.stream(**asked, stream_options={"include_usage": True}) as stream:
            chunks = [event.chunk async for event in stream if event.type == "chunk"]
            reply = await stream.get_final_completion()
        SEEN.append((reply, chunks))
        messages += _chat_history(reply.choices[0].message)
    return 1.0


async def chat_raw_stream(client, row):
    """`create(stream=True)`, the chunks as they come: what a library that reads the stream itself sees."""
    stream = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": row["prompt"]}], stream=True
    )
    SEEN.append([chunk async for chunk in stream])
    return 1.0


def _chat_history(message) -> list[dict]:
    sent_back = message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})
    results = [{"role": "tool", "tool_call_id": c.id, "content": "3"} for c in message.tool_calls or ()]
    return [sent_back, *results]


async def responses_plain(client, row):
    items: list = [{"role": "user", "content": row["prompt"]}]
    for _ in range(2):
        response = await client.responses.create(
            model="m", input=items, tools=[ADD_FLAT], include=["message.output_text.logprobs"]
        )
        SEEN.append(response)
        items += _response_history(response)
    return 1.0


async def responses_streamed(client, row):
    items: list = [{"role": "user", "content": row["prompt"]}]
    for _ in range(2):
        asked = {"model": "m", "input": items, "tools": [ADD_FLAT], "include": ["message.output_text.logprobs"]}
        async with client.responses.stream(**asked) as stream:
            events = [event async for event in stream]
            response = await stream.get_final_response()
        SEEN.append((response, events))
        items += _response_history(response)
    return 1.0


async def responses_cut(client, row):
    stream = await client.responses.create(model="m", input=row["prompt"], stream=True)
    SEEN.append([event async for event in stream])
    SEEN.append(await client.responses.create(model="m", input=row["prompt"] + "!"))
    return 1.0


def _response_history(response) -> list[dict]:
    calls = [item for item in response.output if item.type == "function_call"]
    results = [{"type": "function_call_output", "call_id": c.call_id, "output": "3"} for c in calls]
    return [item.model_dump(exclude_none=True) for item in response.output] + results


# ---------------------------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def server():
    endpoint = AgentServer()
    yield endpoint
    endpoint.close()


SCRIPT = ["sure " + CALL, ANSWER]


def _said(message) -> tuple:
    """A chat message as an agent reads it: role, text, calls (vLLM's parser draws a fresh id per call)."""
    calls = [(c.type, c.function.name, c.function.arguments) for c in message.tool_calls or ()]
    return message.role, message.content, calls, (message.model_extra or {}).get("reasoning")


def test_a_streamed_chat_completion_reassembles_to_the_unstreamed_one(server):
    plain, plain_turns, replies = run(server, chat_plain, SCRIPT, tool_tokenizer(), "hermes", max_turns=2)
    batch, turns, streamed = run(server, chat_streamed, SCRIPT, tool_tokenizer(), "hermes", max_turns=2)
    assert [ids for _, ids in turns.prompts] == [ids for _, ids in plain_turns.prompts]
    assert trained(batch) == trained(plain) and batch.metrics["tito/forks"] == 0
    for reply, (reassembled, chunks) in zip(replies, streamed):
        want, got = reply.choices[0], reassembled.choices[0]
        assert _said(got.message) == _said(want.message)
        assert got.finish_reason == want.finish_reason and reassembled.usage == reply.usage
        assert got.logprobs.content == want.logprobs.content  # the behaviour log-probs, every sampled token
        ids = [i for c in chunks for choice in c.choices for i in choice.model_extra.get("token_ids") or ()]
        assert ids == want.model_extra["token_ids"]  # the sampled ids, in order, over the chunks
        assert chunks[0].model_extra["prompt_token_ids"] == reply.model_extra["prompt_token_ids"]
        assert chunks[-1].choices == [] and chunks[-1].usage == reply.usage  # stream_options.include_usage
    first = replies[0].choices[0]
    assert first.message.content == "sure " and first.message.tool_calls[0].function.name == "add"
    content = [c.choices[0].delta.content for c in streamed[1][1] if c.choices and c.choices[0].delta.content]
    assert content == [*ANSWER]  # one delta per sampled token (this tokenizer's tokens are characters)


def test_a_raw_chat_stream_is_the_openai_chunk_sequence(server):
    _, _, (chunks,) = run(server, chat_raw_stream, [ANSWER], max_turns=1)
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ANSWER
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["stop"]
    assert all(c.usage is None for c in chunks)  # no usage chunk unless include_usage


def test_a_streamed_response_reassembles_to_the_unstreamed_one(server):
    plain, plain_turns, responses = run(server, responses_plain, SCRIPT, tool_tokenizer(), "hermes", max_turns=2)
    batch, turns, streamed = run(server, responses_streamed, SCRIPT, tool_tokenizer(), "hermes", max_turns=2)
    assert [ids for _, ids in turns.prompts] == [ids for _, ids in plain_turns.prompts]
    assert trained(batch) == trained(plain) and batch.metrics["tito/forks"] == 0
    for want, (got, events) in zip(responses, streamed):
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[0].type == "response.created" and events[1].type == "response.in_progress"
        assert events[-1].type == "response.completed"
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        assert deltas == want.output_text and got.output_text == want.output_text
        calls = [(i.name, i.arguments) for i in want.output if i.type == "function_call"]
        assert [(i.name, i.arguments) for i in got.output if i.type == "function_call"] == calls
        assert arguments == "".join(a for _, a in calls) and got.usage == want.usage and got.status == want.status
        logprobs = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
        message = next(i for i in want.output if i.type == "message")
        assert [lp.logprob for lp in logprobs] == [lp.logprob for lp in message.content[0].logprobs][: len(logprobs)]
    kinds = [e.type for e in streamed[0][1]]
    assert kinds[2:] == [
        "response.output_item.added",  # the message "sure "
        "response.content_part.added",
        *["response.output_text.delta"] * len("sure "),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",  # the call, its arguments as sampled, a token (a character here) a delta
        *["response.function_call_arguments.delta"] * len('{"a": 1, "b": 2}'),
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]


def test_a_streamed_turn_cut_at_its_budget_ends_incomplete(server):
    _, _, (events, plain) = run(server, responses_cut, ["45678"], max_tokens_per_turn=3, max_turns=2, tito="fork")
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "456"
    assert plain.output_text == "456" and plain.status == "incomplete"


def test_token_pieces_give_each_tokens_text_and_a_text_split_at_them_is_whole():
    tokenizer = chat_tokenizer("qwen")
    ids = tokenizer("héllo wörld", add_special_tokens=False)["input_ids"]
    pieces = token_pieces(tokenizer, ids)
    assert len(pieces) == len(ids) and "".join(pieces) == tokenizer.decode(ids)
    split, end = text_pieces("llo w", pieces)
    assert "".join(split) == "llo w" and len(split) == len(ids) and end == "".join(pieces).find("llo w") + 5
    unfound, _ = text_pieces("rewritten", pieces)  # a parser's rewriting comes whole, on the last token
    assert unfound == [""] * (len(ids) - 1) + ["rewritten"]


def test_a_reasoning_parsers_thinking_streams_as_reasoning_deltas(server):
    script = ["<think>ok</think>" + CALL, "<think>so</think>" + ANSWER]
    tokenizer = tool_tokenizer(thinking=True)
    _, _, streamed = run(server, responses_streamed, script, tokenizer, "hermes", "qwen3", max_turns=2)
    response, events = streamed[1]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "so"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == ANSWER
    assert [i.type for i in response.output] == ["reasoning", "message"] and response.output_text == ANSWER
    _, _, chats = run(server, chat_streamed, script, tool_tokenizer(thinking=True), "hermes", "qwen3", max_turns=2)
    reply, chunks = chats[1]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning") or "" for d in deltas) == "so"
    assert "".join(d.content or "" for d in deltas) == ANSWER == reply.choices[0].message.content
