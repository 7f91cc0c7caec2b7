"""Agents through the OpenAI-compatible endpoint (relayrl/agents/), driven by the multi-turn driver with a scripted
engine (fast; the real engines are tests/integration/test_agents_engines.py): every call's prompt is the
trajectory's tokens so far, every trained token is one the engine sampled, a client's retry is not a second sample,
the run's sampling wins, tool calls are parsed by vLLM's parser (inferred from the chat template) and malformed ones
counted. How an agent fails: test_agents_faults.py; agents that rewrite their history: test_agents_rewriting.py."""

from __future__ import annotations

import asyncio
import json
import time
import warnings

import openai
import pytest

from relayrl.agents.loading import load_agent
from relayrl.agents.server import AgentServer
from relayrl.config.env import EnvConfig
from relayrl.errors import ConfigWarning, EnvError
from tests.unit.agent_harness import ADD, drive, tool_tokenizer

HERE = "tests.unit.test_agents"
SEEN: dict[str, list] = {}  # what the agents saw, by row prompt: the calls' replies


# ---------------------------------------------------------------------------------------------- agents
async def three_calls(client, row):
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(3):
        response = await client.chat.completions.create(model="any-name", messages=messages)
        SEEN.setdefault(row["prompt"], []).append(response)
        messages += [{"role": "assistant", "content": response.choices[0].message.content}]
        messages += [{"role": "user", "content": "again"}]
    return 1.0


async def asks_otherwise(client, row):
    messages = [{"role": "user", "content": row["prompt"]}]
    try:
        await client.chat.completions.create(model="m", messages=messages, n=2)
    except openai.BadRequestError as err:
        SEEN.setdefault(row["prompt"], []).append(err)
    await client.chat.completions.create(model="m", messages=messages, temperature=0.3, top_p=1.0)
    return 0.5


def plain_function(client, row):
    response = client.chat.completions.create(model="m", messages=[{"role": "user", "content": row["prompt"]}])
    return {"reward": 0.25, "success": True} if response.choices[0].message.content else 0.0


async def calls_forever(client, row):
    messages = [{"role": "user", "content": row["prompt"]}]
    try:
        while True:
            reply = await client.chat.completions.create(model="m", messages=messages)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content}]
            messages += [{"role": "user", "content": "more"}]
    except openai.BadRequestError as err:
        SEEN.setdefault(row["prompt"], []).append(err.message)
        raise


async def uses_a_tool(client, row):
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(2):
        response = await client.chat.completions.create(model="m", messages=messages, tools=[ADD])
        message = response.choices[0].message
        SEEN.setdefault(row["prompt"], []).append(response)
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or ():
            arguments = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] + arguments["b"])})
        if not message.tool_calls:
            messages.append({"role": "user", "content": "no call"})
    return 1.0


async def retried(client, row):
    """Sends each call twice, as a client's automatic retry does: at once (the first still being answered), and
    again after the answer (its response lost); then a call that goes on."""
    messages = [{"role": "user", "content": row["prompt"]}]
    replies = await asyncio.gather(*(client.chat.completions.create(model="m", messages=messages) for _ in "ab"))
    replies.append(await client.chat.completions.create(model="m", messages=messages))
    SEEN.setdefault(row["prompt"], []).extend(replies)
    messages += [
        {"role": "assistant", "content": replies[0].choices[0].message.content},
        {"role": "user", "content": "again"},
    ]
    SEEN[row["prompt"]].append(await client.chat.completions.create(model="m", messages=messages))
    return 1.0


# ---------------------------------------------------------------------------------------------- harness
@pytest.fixture(scope="module")
def server():
    endpoint = AgentServer()
    yield endpoint
    endpoint.close()


def run(server, agent, script, **options):
    SEEN.clear()
    return drive(server, agent, script, **options)


# ---------------------------------------------------------------------------------------------- tests
def test_each_call_is_served_from_the_trajectorys_own_tokens_and_every_trained_token_was_sampled(server):
    batch, turns, codec = run(server, three_calls, ["4", "5", "6"], max_turns=3)
    (rollout,) = batch.rollouts
    replies = SEEN["2+3="]
    # what the engine was asked: each call's prompt ids, as the agent's replies report them (vLLM's extension)
    assert [r.model_extra["prompt_token_ids"] for r in replies] == [ids for _, ids in turns.prompts]
    sampled = [r.choices[0].model_extra["token_ids"] for r in replies]
    trained = [t for t, m in zip(rollout.response_ids, rollout.loss_mask) if m]
    assert trained == [t for ids in sampled for t in ids]  # every trained token, in order, as sampled
    # the next call's prompt is the last prompt + its sampled tokens + the new messages' tokens
    for before, tokens, after in zip(turns.prompts, sampled, turns.prompts[1:]):
        assert after[1][: len(before[1]) + len(tokens)] == before[1] + tokens
    assert rollout.prompt.token_ids == turns.prompts[0][1]
    assert rollout.prompt.token_ids + rollout.response_ids == turns.prompts[-1][1] + sampled[-1]
    assert codec.render([{"role": "user", "content": "2+3="}], True) == rollout.prompt.text
    assert [r.choices[0].message.content for r in replies] == ["4", "5", "6"]
    assert batch.rewards == [1.0] and batch.metrics["env/turns_mean"] == 3 and batch.metrics["tito/forks"] == 0
    # the agent's reward on its last turn's last token, its earlier calls' turns 0 (for the token-level estimators)
    assert rollout.turn_rewards is not None and [r for _, r in rollout.turn_rewards] == [0.0, 0.0, 1.0]
    assert rollout.turn_rewards[-1][0] == len(rollout.response_ids) - 1


def test_a_clients_retry_of_a_call_gets_the_same_reply_not_a_second_sample(server):
    batch, turns, _ = run(server, retried, ["4", "5"], max_turns=3)
    first, at_once, after, second = SEEN["2+3="]
    assert len(turns.prompts) == 2  # two samples: the call (sent three times) and the next call
    assert first.id == at_once.id == after.id and first.choices[0].message.content == "4"
    assert second.choices[0].message.content == "5" and batch.metrics["tito/forks"] == 0
    (rollout,) = batch.rollouts
    trained = [t for t, m in zip(rollout.response_ids, rollout.loss_mask) if m]
    assert trained == first.choices[0].model_extra["token_ids"] + second.choices[0].model_extra["token_ids"]


def test_the_runs_sampling_wins_and_what_cannot_be_served_is_refused_by_name(server):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch, _, _ = run(server, asks_otherwise, ["4"], prompts=("1+1=", "2+2="))
    said = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    # temperature differs from the run's: warned once for the run, not once per call; top_p=1.0 is the run's own
    assert len(said) == 1 and "the agent's temperature=0.3 is overridden" in said[0]
    (refusal,) = SEEN["1+1="]
    assert "n=2: one choice per call" in refusal.message and refusal.body["param"] == "n"
    assert batch.rewards == [0.5, 0.5]


def test_a_plain_function_gets_a_sync_client(server):
    batch, _, _ = run(server, plain_function, ["4"], n=2)
    assert batch.rewards == [0.25, 0.25] and batch.metrics["env/success"] == 1.0


def test_a_call_past_max_turns_is_refused_and_the_trajectory_kept(server):
    batch, turns, _ = run(server, calls_forever, ["4"], max_turns=2)
    assert len(turns.prompts) == 2 and batch.metrics["env/turns_max"] == 2 and batch.rewards == [0.0]
    deadline = time.monotonic() + 5  # the refusal reaches the agent after its trajectory has been handed on
    while "2+3=" not in SEEN and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "the trajectory has ended (env.max_turns or env.max_total_tokens reached)" in SEEN["2+3="][0]


def test_no_call_goes_past_the_engines_context(server):
    """An agent renders its own prompts (tools, system turns): each call's budget is cut to the context left, and
    a first prompt with no room left is the agent's error, named."""
    batch, turns, _ = run(server, three_calls, ["45678"], max_turns=3, context=40, on_error="zero")
    assert all(len(ids) <= 40 for _, ids in turns.prompts) and batch.metrics["env/errors"] == 0
    (rollout,) = batch.rollouts
    assert len(rollout.prompt.token_ids) + len(rollout.response_ids) <= 40 and rollout.finish_reason == "length"
    with pytest.raises(EnvError, match=r"sample 0#0 reset: the call's prompt is 2\d tokens, leaving no room in the "):
        run(server, three_calls, ["4"], context=20)


def test_an_agent_spec_that_cannot_load_is_named():
    with pytest.raises(EnvError, match=r"env.agent='tests.unit.test_agents:nope': '.*' has no function 'nope'"):
        load_agent(f"{HERE}:nope")
    with pytest.raises(EnvError, match="not of the form module:function"):
        load_agent("just_a_name")
    with pytest.raises(ValueError, match="env.fn='retry' and env.agent=.* are both set"):
        EnvConfig(fn="retry", agent=f"{HERE}:three_calls")


def test_tool_calls_come_back_parsed_by_vllms_parser_and_malformed_ones_are_counted(server):
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    batch, turns, codec = run(server, uses_a_tool, [call, "3"], tokenizer=tool_tokenizer(), parser="hermes")
    first, second = SEEN["2+3="]
    (tool_call,) = first.choices[0].message.tool_calls
    assert tool_call.function.name == "add" and json.loads(tool_call.function.arguments) == {"a": 1, "b": 2}
    assert first.choices[0].finish_reason == "tool_calls" and second.choices[0].message.content == "3"
    # the tool result follows the sampled call's tokens (the template's own rendering of the call is not used)
    assert "add;" in codec.tokenizer.decode(turns.prompts[0][1])
    assert "<tool_response>3</tool_response>" in codec.tokenizer.decode(turns.prompts[1][1])
    assert batch.metrics["tito/forks"] == 0 and batch.metrics["env/tool_calls"] == 1
    assert batch.metrics["env/tool_errors"] == 0
    broken = '<tool_call>{"name": "add", "arguments": {"a": 1</tool_call>'
    unknown = '<tool_call>{"name": "mul", "arguments": {"a": 1, "b": 2}}</tool_call>'
    batch, _, _ = run(server, uses_a_tool, [broken, "3"], tokenizer=tool_tokenizer(), parser="hermes")
    assert batch.metrics["env/tool_errors"] == 1 and batch.metrics["env/tool_calls"] == 0
    message = SEEN["2+3="][0].choices[0].message  # an unreadable call comes back as the text it is
    assert not message.tool_calls and message.content == broken
    # a call naming a tool the request did not offer comes back in tool_calls, as vLLM's server returns it (the
    # agent's library decides what it means), and is counted as a tool error
    batch, _, _ = run(server, uses_a_tool, [unknown, "3"], tokenizer=tool_tokenizer(), parser="hermes")
    (call,) = SEEN["2+3="][0].choices[0].message.tool_calls
    assert call.function.name == "mul" and SEEN["2+3="][0].choices[0].finish_reason == "tool_calls"
    assert batch.metrics["env/tool_errors"] == 1 and batch.metrics["env/tool_calls"] == 1


def test_the_tool_parser_is_read_off_the_chat_template_or_the_first_call_with_tools_stops_the_run(server):
    """env.tool_parser left '': the template writes <tool_call>, so hermes reads the calls; a template that writes
    no known format stops the run at the first call with tools=, naming the key, whatever env.on_error says."""
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    batch, _, _ = run(server, uses_a_tool, [call, "3"], tokenizer=tool_tokenizer())
    assert batch.metrics["env/tool_calls"] == 1 and SEEN["2+3="][0].choices[0].message.tool_calls
    for on_error in ("error", "zero"):
        with pytest.raises(EnvError, match=r"sample 0#0 reset: .*tools= \(add\), but env.tool_parser is not set"):
            run(server, uses_a_tool, [call, "3"], on_error=on_error)  # chat_tokenizer("qwen"): no tool-call format
    batch, _, _ = run(server, three_calls, ["4"])  # without tools= the same template is served
    assert batch.rewards == [1.0]


@pytest.mark.parametrize("reasoning", ["qwen3", "deepseek_r1"])
def test_a_tool_call_written_while_thinking_is_not_executed(server, reasoning):
    """verl's hermes parser ran calls found inside <think>; vLLM's qwen3 reasoning parser ends the reasoning at a
    <tool_call> inside the block. Here the block is read by its tags: the call stays reasoning."""
    thinking = '<think>maybe <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call></think>'
    after = '<think>ok</think><tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    tokenizer = tool_tokenizer(thinking=True)
    batch, _, _ = run(
        server, uses_a_tool, [thinking + "3", "3"], tokenizer=tokenizer, parser="hermes", reasoning=reasoning
    )
    message = SEEN["2+3="][0].choices[0].message
    assert not message.tool_calls and message.content == "3" and "<tool_call>" in message.model_extra["reasoning"]
    assert batch.metrics["env/tool_calls"] == 0
    batch, _, _ = run(server, uses_a_tool, [after, "3"], tokenizer=tokenizer, parser="hermes", reasoning=reasoning)
    assert batch.metrics["env/tool_calls"] == 1 and SEEN["2+3="][0].choices[0].message.model_extra["reasoning"] == "ok"


def test_a_parser_name_vllm_lacks_is_refused_before_anything_is_built():
    from relayrl.errors import ConfigError
    from relayrl.rollout.tool_calls import check_parsers

    with pytest.raises(ConfigError, match="env.tool_parser='hermez' is not one of vLLM's tool parsers: .*hermes"):
        check_parsers("hermez", "")
    with pytest.raises(ConfigError, match="env.reasoning_parser='qwen4' is not one of vLLM's reasoning parsers"):
        check_parsers("hermes", "qwen4")
    check_parsers("hermes", "qwen3")
