"""`/v1/completions` on the agents' endpoint (relayrl/agents/): an agent that prompts with raw text or token ids, no
chat template, driven by the multi-turn driver with a scripted engine. Each call's prompt is the trajectory's
tokens so far (a text call's new text tokenised after the sampled tokens, an ids call's new ids as they are), every
trained token is one the engine sampled, a prompt that does not extend the last one starts a new sample per
env.tito, and what the endpoint cannot serve as asked is refused naming the field."""

from __future__ import annotations

import openai
import pytest

from relayrl.agents.server import AgentServer
from tests.unit.agent_harness import drive

HERE = "tests.unit.test_agents_completions"
# the agents' max_tokens, overridden by the run's, is warned about (tests/unit/test_agents.py checks that)
pytestmark = pytest.mark.filterwarnings("ignore::relayrl.errors.ConfigWarning")
SEEN: list = []


async def text_calls(client, row):
    prompt = row["prompt"]
    for _ in range(3):
        reply = await client.completions.create(model="any", prompt=prompt, max_tokens=8, logprobs=1)
        SEEN.append(reply)
        prompt += reply.choices[0].text + " again:"
    return 1.0


async def id_calls(client, row):
    ids = None
    for _ in range(2):
        reply = await client.completions.create(model="any", prompt=ids or row["prompt"])
        SEEN.append(reply)
        choice = reply.choices[0].model_extra
        ids = choice["prompt_token_ids"] + choice["token_ids"] + [5, 6]
    return 0.5


async def rewrites(client, row):
    await client.completions.create(model="m", prompt=row["prompt"])
    await client.completions.create(model="m", prompt="another question")
    return 0.0


async def chat_then_text(client, row):
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": row["prompt"]}])
    await client.completions.create(model="m", prompt=row["prompt"])
    return 0.0


async def refused(client, row):
    bad_calls = ({"prompt": ["a", "b"]}, {"prompt": row["prompt"], "echo": True}, {"prompt": ""})
    for bad in (*bad_calls, {"prompt": row["prompt"], "stream": True}):
        try:
            await client.completions.create(model="m", **bad)
        except openai.BadRequestError as err:
            SEEN.append(str(err))
    await client.completions.create(model="m", prompt=row["prompt"])
    return 1.0


@pytest.fixture(scope="module")
def server():
    endpoint = AgentServer()
    yield endpoint
    endpoint.close()


def run(server, agent, script, **env):
    SEEN.clear()
    return drive(server, agent, script, **env)


def test_text_prompts_continue_the_trajectorys_tokens_and_every_trained_token_was_sampled(server):
    batch, turns, codec = run(server, text_calls, ["4", "5", "6"], max_turns=3)
    (rollout,) = batch.rollouts
    tokenizer = codec.tokenizer
    assert turns.prompts[0][1] == tokenizer("2+3=")["input_ids"]  # no chat template: the text as it is
    sampled = [reply.choices[0].model_extra["token_ids"] for reply in SEEN]
    for before, tokens, after in zip(turns.prompts, sampled, turns.prompts[1:]):
        assert after[1] == before[1] + tokens + codec.encode(" again:")  # the sampled ids, then the new text's
    trained = [t for t, m in zip(rollout.response_ids, rollout.loss_mask or []) if m]
    assert trained == [t for ids in sampled for t in ids]
    first = SEEN[0]
    assert first.object == "text_completion" and first.choices[0].text == "4"
    assert first.choices[0].model_extra["prompt_token_ids"] == turns.prompts[0][1]
    assert first.choices[0].logprobs.token_logprobs == [-0.5] * len(sampled[0])
    assert first.usage.completion_tokens == len(sampled[0])
    assert batch.rewards == [1.0] and batch.metrics["tito/forks"] == 0 and batch.metrics["env/turns_mean"] == 3


def test_token_id_prompts_are_taken_as_they_are(server):
    batch, turns, _ = run(server, id_calls, ["4", "5"], max_turns=2)
    first_ids = SEEN[0].choices[0].model_extra
    assert turns.prompts[1][1] == first_ids["prompt_token_ids"] + first_ids["token_ids"] + [5, 6]
    (rollout,) = batch.rollouts
    assert (
        rollout.response_ids[-len(SEEN[1].choices[0].model_extra["token_ids"]) :]
        == (SEEN[1].choices[0].model_extra["token_ids"])
    )
    assert batch.rewards == [0.5]


@pytest.mark.parametrize("agent", [rewrites, chat_then_text])
def test_a_prompt_that_does_not_extend_the_last_call_starts_a_new_sample(server, agent):
    batch, turns, _ = run(server, agent, ["4", "5"], max_turns=3, tito="fork")
    assert batch.metrics["tito/prefix_mismatch"] == 1 and batch.metrics["tito/forks"] == 1
    assert len(batch.rollouts) == 2  # the sample so far, and the one from the new prompt


def test_what_cannot_be_served_as_asked_is_refused_naming_the_field(server):
    batch, _, _ = run(server, refused, ["4"], max_turns=1)
    first, echo, empty, stream = SEEN
    assert "one prompt per call" in first and "echo=True is not served" in echo and "non-empty string" in empty
    assert "stream=true is not served on /v1/completions" in stream
    assert batch.rewards == [1.0]
