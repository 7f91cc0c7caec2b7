"""`/v1/responses` on the agents' endpoint (relayrl/agents/responses.py), driven by the multi-turn driver with a
scripted engine and the real openai client: a responses call renders the same prompt as the chat call for the same
conversation and trains the same sampled tokens; a conversation that sends back the output items it was answered
with (a function_call) and a function_call_output continues the trajectory (no fork), as does one naming the last
response in previous_response_id; the reply is a `response` the client's own model reads (output items, status,
usage); and everything the endpoint cannot serve is refused with a 400 naming the field."""

from __future__ import annotations

import json
import warnings

import openai
import pytest

from relayrl.agents.server import AgentServer
from relayrl.errors import ConfigWarning
from tests.unit.agent_harness import ADD, drive, tool_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore::relayrl.errors.ConfigWarning")  # test_agents.py checks the warning
SEEN: list = []  # what the agents saw: the replies, or the refusals
CALL = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
ADD_FLAT = {"type": "function", **ADD["function"]}  # the Responses API's flat function tool
SYSTEM = "You add."


# ---------------------------------------------------------------------------------------------- agents
async def chat_agent(client, row):
    """The conversation through chat completions: a system message, the question, the tool's result."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": row["prompt"]}]
    for _ in range(2):
        reply = await client.chat.completions.create(model="m", messages=messages, tools=[ADD])
        SEEN.append(reply)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or ():
            arguments = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] + arguments["b"])})
    return 1.0


def _results(response) -> list[dict]:
    """The function_call_output items for a response's function calls."""
    calls = [item for item in response.output if item.type == "function_call"]
    return [
        {"type": "function_call_output", "call_id": c.call_id, "output": str(sum(json.loads(c.arguments).values()))}
        for c in calls
    ]


async def responses_agent(client, row):
    """The same conversation through /v1/responses, resending the whole history each call (the Agents SDK's way)."""
    items: list = [{"role": "user", "content": row["prompt"]}]
    for _ in range(2):
        response = await client.responses.create(model="m", instructions=SYSTEM, input=items, tools=[ADD_FLAT])
        SEEN.append(response)
        items += [item.model_dump(exclude_none=True) for item in response.output] + _results(response)
    return 1.0


async def previous_id_agent(client, row):
    """The same conversation, the second call naming the first response instead of resending it."""
    first = await client.responses.create(model="m", instructions=SYSTEM, input=row["prompt"], tools=[ADD_FLAT])
    second = await client.responses.create(
        model="m", instructions=SYSTEM, input=_results(first), tools=[ADD_FLAT], previous_response_id=first.id
    )
    SEEN.extend([first, second])
    return 1.0


REFUSED = [
    ({"background": True}, "background", "background=True is not served"),
    ({"conversation": "conv_1"}, "conversation", "conversation='conv_1' is not served"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt", "prompt={'id': 'pmpt_1'} is not served"),
    ({"previous_response_id": "resp_other"}, "previous_response_id", "previous_response_id='resp_other' is not"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "tools[0] of type 'web_search' is not served"),
    ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0].type", "of type 'file_search'"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
        "input[0].content[0].type",
        "input[0].content[0]: a part of type 'input_image' is not served",
    ),
    (
        {"input": [{"type": "item_reference", "id": "msg_1"}]},
        "input[0].type",
        "input[0] of type 'item_reference' is not served",
    ),
    ({"extra_body": {"n": 2}}, "n", "n=2: one choice per call"),
    ({"input": [{"role": "tool", "content": "3"}]}, "input[0].role", "input[0]: role 'tool' is not one of user"),
    ({"input": [{"type": "function_call", "name": "add"}]}, "input[0]", "a function_call has a name and arguments"),
    ({"tools": [{"type": "function"}]}, "tools[0].name", "tools[0] must be {type: function, name, parameters}"),
    ({"instructions": ["be brief"]}, "instructions", "'instructions' must be a string"),
]


async def asks_what_is_not_served(client, row):
    for fields, _, _ in REFUSED:
        asked = {"model": "m", "input": row["prompt"], **fields}
        try:
            await client.responses.create(**asked)
        except openai.BadRequestError as err:
            SEEN.append(err)
    SEEN.append(await client.responses.create(model="m", input=row["prompt"], store=False, truncation="auto"))
    return 1.0


JSON_FORMAT = {"type": "json_schema", "name": "sum", "schema": {"type": "object"}}


async def cut_at_the_budget(client, row):
    asked = {"max_output_tokens": 4, "text": {"format": JSON_FORMAT}}
    SEEN.append(await client.responses.create(model="m", input=row["prompt"], **asked))
    return 1.0


# ---------------------------------------------------------------------------------------------- harness
@pytest.fixture(scope="module")
def server():
    endpoint = AgentServer()
    yield endpoint
    endpoint.close()


def run(server, agent, script, tokenizer=None, parser="", reasoning="", **env):
    """(the batch, the scripted turns, what the agent saw)."""
    SEEN.clear()
    batch, turns, _ = drive(server, agent, script, tokenizer=tokenizer, parser=parser, reasoning=reasoning, **env)
    return batch, turns, list(SEEN)


def trained(batch) -> list[int]:
    (rollout,) = batch.rollouts
    return [t for t, m in zip(rollout.response_ids, rollout.loss_mask or []) if m]


# ---------------------------------------------------------------------------------------------- tests
def test_a_responses_conversation_is_the_chat_conversations_prompt_and_tokens(server):
    script = [CALL, "3"]
    chat, chat_turns, _ = run(server, chat_agent, script, tool_tokenizer(), "hermes", max_turns=2)
    batch, turns, (first, second) = run(server, responses_agent, script, tool_tokenizer(), "hermes", max_turns=2)
    # every call's prompt ids, token for token: the function_call and its output continue the trajectory
    assert [ids for _, ids in turns.prompts] == [ids for _, ids in chat_turns.prompts]
    assert len(turns.prompts) == 2 and batch.metrics["tito/forks"] == 0 and batch.metrics["tito/prefix_mismatch"] == 0
    assert trained(batch) == trained(chat) == first.model_extra["token_ids"] + second.model_extra["token_ids"]
    assert first.model_extra["prompt_token_ids"] == turns.prompts[0][1]
    (call,) = first.output  # no text before the call: one function_call item, as OpenAI's server answers
    assert call.type == "function_call" and call.name == "add" and json.loads(call.arguments) == {"a": 1, "b": 2}
    assert call.call_id and first.status == "completed" and first.object == "response"
    (message,) = second.output
    assert message.type == "message" and second.output_text == "3" and message.content[0].type == "output_text"
    assert second.usage.input_tokens == len(turns.prompts[1][1]) and second.usage.output_tokens == 2
    assert second.usage.total_tokens == second.usage.input_tokens + 2
    assert batch.rewards == [1.0] and batch.metrics["env/tool_calls"] == 1


def test_previous_response_id_naming_the_last_response_continues_the_trajectory(server):
    script = [CALL, "3"]
    full, full_turns, _ = run(server, responses_agent, script, tool_tokenizer(), "hermes", max_turns=2)
    batch, turns, (first, second) = run(server, previous_id_agent, script, tool_tokenizer(), "hermes", max_turns=2)
    assert [ids for _, ids in turns.prompts] == [ids for _, ids in full_turns.prompts]
    assert batch.metrics["tito/forks"] == 0 and trained(batch) == trained(full)
    assert second.previous_response_id == first.id and second.output_text == "3"


def test_what_cannot_be_served_is_refused_naming_the_field(server):
    batch, _, seen = run(server, asks_what_is_not_served, ["4"], max_turns=1)
    *refusals, served = seen
    assert len(refusals) == len(REFUSED)
    for err, (fields, param, says) in zip(refusals, REFUSED):
        assert err.status_code == 400 and says in err.message, fields
        assert err.body["param"] == param and err.body["type"] == "invalid_request_error", fields
    assert served.output_text == "4" and served.store is False and served.truncation == "auto"
    assert batch.rewards == [1.0]


def test_a_turn_cut_at_its_budget_is_an_incomplete_response_and_the_runs_sampling_wins(server):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch, _, (response,) = run(server, cut_at_the_budget, ["45678"], max_tokens_per_turn=3, max_turns=1)
    said = " ".join(str(w.message) for w in caught if issubclass(w.category, ConfigWarning))
    assert "the agent's max_output_tokens=4 is overridden" in said and "the agent's text.format=" in said
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete" and response.output_text == "456"
    assert response.usage.output_tokens == 3 and batch.rollouts[0].finish_reason == "length"


def test_a_reasoning_item_comes_first_and_sent_back_it_continues_the_trajectory(server):
    """With env.reasoning_parser the thinking block is a `reasoning` item (vLLM's Responses server's shape); sent
    back with the rest of the output it is left out of the prompt (as chat leaves `reasoning` out): no fork."""
    script = ["<think>ok</think>" + CALL, "<think>so</think>3"]
    tokenizer = tool_tokenizer(thinking=True)
    batch, turns, (first, second) = run(server, responses_agent, script, tokenizer, "hermes", "qwen3", max_turns=2)
    thought, call = first.output
    assert thought.type == "reasoning" and [c.text for c in thought.content or ()] == ["ok"]
    assert call.type == "function_call" and call.name == "add" and second.output_text == "3"
    assert batch.metrics["tito/forks"] == 0 and len(turns.prompts) == 2
    sampled = first.model_extra["prompt_token_ids"] + first.model_extra["token_ids"]
    assert turns.prompts[1][1][: len(sampled)] == sampled  # the next prompt: the sampled thinking and call, as sampled
