"""An OpenAI-client agent against the real engines: vLLM in process (its request loop: a call joins the running
batch) and HF generate (one batch per wave of calls), through chat completions and (HF) completions and streamed
responses. Every trained token is one the engine sampled for that call, and the learner's log-probs of those tokens (the HF model, teacher-forced over the whole trajectory)
equal the engine's behaviour log-probs within 1e-3: what the agent saw is what is trained."""

from __future__ import annotations

import pytest

from relayrl.types import Prompt, Sampling

CASES = [
    pytest.param("vllm", "chat", marks=pytest.mark.vllm),
    ("hf", "chat"),
    ("hf", "completions"),
    ("hf", "responses_stream"),
]
AGENTS = {"chat": "recording_agent", "completions": "text_agent", "responses_stream": "streaming_responses_agent"}
RECORDS: dict[str, list] = {}  # each trajectory's replies, by its base URL


async def recording_agent(client, row):
    """Three calls, each appending the reply and a user turn; records what each call was answered."""
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(3):
        reply = await client.chat.completions.create(model="m", messages=messages)
        RECORDS.setdefault(str(client.base_url), []).append(reply)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": "="},
        ]
    return 0.0


async def text_agent(client, row):
    """The same through /v1/completions: the prompt text grows by each reply and "="."""
    prompt = row["prompt"]
    for _ in range(3):
        reply = await client.completions.create(model="m", prompt=prompt)
        RECORDS.setdefault(str(client.base_url), []).append(reply)
        prompt += reply.choices[0].text + "="
    return 0.0


async def streaming_responses_agent(client, row):
    """The same through /v1/responses, streamed: each call resends the history, its output items and "="."""
    items: list = [{"role": "user", "content": row["prompt"]}]
    for _ in range(3):
        events = await client.responses.create(model="m", input=items, stream=True)
        terminal = ("response.completed", "response.incomplete")  # a turn cut at its budget is incomplete
        (response,) = [event.response async for event in events if event.type in terminal]
        RECORDS.setdefault(str(client.base_url), []).append(response)
        items += [item.model_dump(exclude_none=True) for item in response.output] + [{"role": "user", "content": "="}]
    return 0.0


def sent_and_sampled(reply) -> tuple[list[int], list[int]]:
    """A reply's prompt ids and sampled ids (vLLM's extensions: the prompt's at the top for chat, in the choice for
    completions; both at the top of a response)."""
    if reply.object == "response":
        return reply.model_extra["prompt_token_ids"], reply.model_extra["token_ids"]
    choice = reply.choices[0].model_extra
    return (reply.model_extra or {}).get("prompt_token_ids") or choice["prompt_token_ids"], choice["token_ids"]


def learner_logprobs(model_dir, ids: list[int]) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    picked = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    return picked.tolist()


@pytest.mark.parametrize(("engine_name", "api"), CASES)
def test_an_agents_calls_are_trained_token_for_token_as_the_engine_sampled_them(random_model_dir, engine_name, api):
    from relayrl.agents.pool import AgentPool
    from relayrl.agents.server import AgentServer
    from relayrl.config.env import EnvConfig
    from relayrl.data.chat import ChatCodec
    from relayrl.models.loading import load_tokenizer
    from relayrl.rollout import build_engine
    from relayrl.rollout.local_group import LocalEngineGroup
    from relayrl.sources.trajectories import MultiTurnDriver
    from relayrl.sources.turn_requests import turn_requests

    tokenizer = load_tokenizer(str(random_model_dir))
    codec = ChatCodec(tokenizer)
    group = LocalEngineGroup(build_engine(engine_name, str(random_model_dir), 96, 0))
    server = AgentServer()
    spec = f"tests.integration.test_agents_engines:{AGENTS[api]}"
    pool = AgentPool(server, spec, {}, 8, 30.0, tokenizer)
    prompts = [Prompt(str(i), f"{i}+{i}=", tokenizer(f"{i}+{i}=")["input_ids"]) for i in range(4)]
    RECORDS.clear()
    try:
        settings = EnvConfig(agent=spec, max_turns=3, max_total_tokens=60)
        driver = MultiTurnDriver(turn_requests(group), pool, codec, settings, Sampling(n=2, max_tokens=6, seed=3))
        batch = driver.run(prompts, 2)
    finally:
        pool.close()
        server.close()
    assert len(batch.rollouts) == 8 and batch.metrics["env/turns_mean"] == 3 and batch.metrics["tito/forks"] == 0
    records = [[sent_and_sampled(r) for r in replies] for replies in RECORDS.values()]
    for rollout in batch.rollouts:
        ids = rollout.prompt.token_ids + rollout.response_ids
        trained = [i for i, m in enumerate(rollout.loss_mask or ()) if m]
        # its agent's calls: each call's prompt is the trajectory's tokens up to it, and what it sampled follows
        (calls,) = [
            c
            for c in records
            if c[0][0] == rollout.prompt.token_ids
            and [t for _, s in c for t in s] == [rollout.response_ids[i] for i in trained]
        ]
        for prompt, sampled in calls:
            assert ids[: len(prompt) + len(sampled)] == prompt + sampled
        learner = learner_logprobs(random_model_dir, ids)
        offset = len(rollout.prompt.token_ids) - 1
        gaps = [abs(learner[offset + i] - rollout.behaviour_logprobs[i]) for i in trained]
        assert max(gaps) <= 1e-3, (engine_name, max(gaps))
