"""Agents through the OpenAI-compatible endpoint (relayrl/agents/), driven by the multi-turn driver with a scripted
engine (fast; the real engines are tests/integration/test_agents_engines.py): every call's prompt is the
trajectory's tokens so far, every trained token is one the engine sampled, an agent that edits its history
starts a new sample per env.tito (smolagents' ToolCallingAgent and DSPy's ReAct, as they are, fork and train under
the defaults), tool calls are parsed by vLLM's parser and malformed ones counted, and each way an agent can fail
ends its trajectory with a message naming the sample."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import os
import time
import warnings

import openai
import pytest
import torch

from relayrl.agents.loading import load_agent
from relayrl.agents.pool import AgentPool
from relayrl.agents.sampling import RunSampling
from relayrl.agents.server import AgentServer
from relayrl.config.env import EnvConfig
from relayrl.data.chat import ChatCodec
from relayrl.errors import ConfigWarning, EnvError
from relayrl.sources.trajectories import MultiTurnDriver
from relayrl.sources.trajectory import trajectory_rows
from relayrl.types import Prompt, Sampling
from tests.unit.test_multiturn import ScriptedTurns
from tests.unit.test_tito import chat_tokenizer

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


async def edits_history(client, row):
    first = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": row["prompt"]}])
    rewritten = [{"role": "user", "content": "new question"}, {"role": "assistant", "content": "x"}]
    await client.chat.completions.create(model="m", messages=rewritten + [{"role": "user", "content": "go"}])
    return float(bool(first))


LUCK = itertools.cycle([1.0, 0.0])  # the trajectories' rewards, in the order they end


def smolagents_tool_calling(client, row):
    """smolagents' ToolCallingAgent, unchanged but for a short system prompt: its second call sends the tool call the
    model made back as the assistant's text ("Calling tools: [...]") and the result as a user "Observation:", so
    it does not extend the first call. Rewarded 1, 0, 1, ... in the order the trajectories end (when right)."""
    import importlib.resources

    import yaml
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    @tool
    def add(a: int, b: int) -> int:
        """Adds two numbers.

        Args:
            a: the first number
            b: the second number
        """
        return a + b

    templates = yaml.safe_load(
        importlib.resources.files("smolagents.prompts").joinpath("toolcalling_agent.yaml").read_text()
    )
    templates["system_prompt"] = "Answer with the tools."
    model = OpenAIServerModel("m", api_base=str(client.base_url), api_key="-", client_kwargs={"max_retries": 0})
    agent = ToolCallingAgent(tools=[add], model=model, prompt_templates=templates, max_steps=3, verbosity_level=0)
    right = str(agent.run(row["prompt"])) == "3"  # an agent whose calls were refused raises here, taking no luck
    return next(LUCK) * float(right)


def dspy_react(client, row):
    """DSPy's ReAct, as it is: every call renders the trajectory so far into a new user message (the earlier
    replies are not sent back as assistant messages), and the last call extracts the answer with another
    signature, so its second and third calls each rebuild the prompt."""
    import dspy

    def add(a: int, b: int) -> int:
        """Adds two numbers."""
        return a + b

    lm = dspy.LM("openai/m", api_base=str(client.base_url), api_key="-", cache=False, num_retries=0)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter(use_json_adapter_fallback=False)):
        prediction = dspy.ReAct("question -> answer", tools=[add], max_iters=3)(question=row["prompt"])
    return next(LUCK) * float(prediction.answer == "3")  # as smolagents_tool_calling


async def raises(client, row):
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": row["prompt"]}])
    raise ValueError("the agent's own bug")


async def returns_text(client, row):
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": row["prompt"]}])
    return "right"


async def never_calls(client, row):
    return 1.0


async def sleeps(client, row):
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": row["prompt"]}])
    await asyncio.sleep(30)
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


ADD = {
    "type": "function",
    "function": {"name": "add", "description": "a + b", "parameters": {"type": "object", "properties": {}}},
}


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


# agents whose library raises over what the model wrote: classes of the names and modules the libraries use
class ModelBehaviorError(Exception):  # the OpenAI Agents SDK's (agents.exceptions), not installed here
    pass


ModelBehaviorError.__module__ = "agents.exceptions"


class UnexpectedModelBehavior(RuntimeError):
    pass


UnexpectedModelBehavior.__module__ = "pydantic_ai.exceptions"


class StrictOutput(UnexpectedModelBehavior):  # a user's subclass: known by the class it derives from
    pass


async def sdk_agent(client, row):
    """Raises as the Agents SDK does when the model's reply is not what it asked for (the sum)."""
    response = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": row["prompt"]}])
    if response.choices[0].message.content != str(sum(map(int, row["prompt"].strip("=").split("+")))):
        raise ModelBehaviorError(f"the model answered {response.choices[0].message.content!r}")
    return 1.0


async def json_agent(client, row):
    response = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": row["prompt"]}])
    return float(json.loads(response.choices[0].message.content) == 5)


async def subclass_agent(client, row):
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": row["prompt"]}])
    raise StrictOutput("no final answer")


async def bug_before_the_model(client, row):
    json.loads(row["prompt"])  # the agent's own reading of its row: not the model's doing
    return 1.0


CACHE: dict[str, asyncio.Future] = {}  # a client-side cache (as DSPy's cache=True): one call per prompt


async def cached(client, row):
    if row["prompt"] in CACHE:
        return await CACHE[row["prompt"]]
    CACHE[row["prompt"]] = answer = asyncio.get_running_loop().create_future()
    response = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": row["prompt"]}])
    answer.set_result(float(response.choices[0].message.content == "5"))
    return await answer


async def chatty(client, row):
    """Logs a line from every trajectory, as the Agents SDK did without an OpenAI key."""
    logging.getLogger("chatty_library").warning("no key set, skipping export of %s", row["prompt"])
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": row["prompt"]}])
    return 1.0


def plain_chatty(client, row):  # the same from a plain function, on a thread of the pool's
    logging.getLogger("chatty_library").warning("no key set, skipping export of %s", row["prompt"])
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": row["prompt"]}])
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
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function.name }};{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}"
    "</tool_response><|im_end|>\n{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments}"
    " | tojson }}</tool_call>{% endfor %}<|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tool_tokenizer(thinking: bool = False, extra: str = ""):
    from tokenizers import Regex, pre_tokenizers

    from relayrl.models.tiny import train_char_tokenizer
    from tests.unit.test_tito import TEXT

    tokenizer = train_char_tokenizer([TEXT + '{}"[];' + extra])
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    specials = ["<|im_start|>", "<|im_end|>"] + (["<think>", "</think>"] if thinking else [])
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = TOOLS_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def server():
    endpoint = AgentServer()
    yield endpoint
    endpoint.close()


def run(
    server,
    agent,
    script,
    prompts=("2+3=",),
    n=1,
    tokenizer=None,
    parser="",
    timeout_s=10.0,
    context=None,
    reasoning="",
    **env,
):
    SEEN.clear()
    codec = ChatCodec(tokenizer or chat_tokenizer("qwen"))
    turns = ScriptedTurns(codec, script)
    spec = f"{HERE}:{agent.__name__}"
    settings = EnvConfig(agent=spec, **env)
    sampling = RunSampling({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 128, "stop": []})
    pool = AgentPool(server, spec, {}, 8, timeout_s, codec.tokenizer, parser, sampling, reasoning)
    rows = [Prompt(id=str(i), text=p, token_ids=[], columns={"answer": "5"}) for i, p in enumerate(prompts)]
    try:
        driver = MultiTurnDriver(turns, pool, codec, settings, Sampling(max_tokens=128), context=context)
        batch = driver.run(rows, n)
        pool.faults.notices.step_ended()  # as the source does after each step
    finally:
        pool.close()
    return batch, turns, codec


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


def test_an_agent_that_edits_its_history_starts_a_new_sample_per_env_tito(server):
    with pytest.raises(EnvError, match=r"sample 0#0 turn 1: the agent's call does not extend its earlier calls"):
        run(server, edits_history, ["4", "5"], max_turns=3, tito="strict")
    batch, turns, codec = run(server, edits_history, ["4", "5"], max_turns=3)  # env.tito=fork, the default
    assert batch.metrics["tito/forks"] == 1 and len(batch.rollouts) == 2
    second, first = batch.rollouts  # the trajectory, then its fork (the sample before the rewrite)
    assert second.fork_of is None and first.fork_of == 0 and trajectory_rows(batch.rollouts) == [0, 0]
    # each sample's turns' rewards at their turns' ends: the first call's 0, the agent's return on the second
    assert first.turn_rewards == [(len(first.response_ids) - 1, 0.0)]
    assert second.turn_rewards == [(len(second.response_ids) - 1, 1.0)]
    assert codec.action_text(first.response_ids) == "4" and codec.action_text(second.response_ids) == "5"
    assert second.prompt.token_ids == turns.prompts[1][1]  # the new sample starts from the rewritten call
    assert "new question" in second.prompt.text and batch.rewards == [1.0, 1.0]
    dropped, _, _ = run(server, edits_history, ["4", "5"], max_turns=3, tito="retokenize")
    assert len(dropped.rollouts) == 1 and dropped.metrics["tito/forks"] == 0


@pytest.mark.parametrize(
    ("agent", "status", "says"),
    [
        (
            raises,
            "error",
            r"^sample 0#0 turn 1: the agent raised ValueError: the agent's own bug \(.*test_agents.py:\d+\)",
        ),
        (returns_text, "env_error", r"^sample 0#0 turn 1: the agent returned 'right', not a finite reward"),
    ],
)
def test_a_failing_agent_is_named_and_handled_per_on_error(server, agent, status, says):
    with pytest.raises(EnvError, match=says):
        run(server, agent, ["4"])
    batch, _, _ = run(server, agent, ["4"], on_error="zero", prompts=("1+1=", "2+2="))
    assert batch.metrics["env/errors"] == 2 and all(r == 0.0 for r in batch.rewards)


def test_an_agent_past_its_deadline_is_cancelled_and_counted(server):
    batch, _, _ = run(server, sleeps, ["4"], on_error="zero", timeout_s=0.5)
    assert batch.metrics["env/timeouts"] == 1 and batch.rewards == [0.0]
    with pytest.raises(EnvError, match=r"ran over env.timeout_s=0.5 s before its next call"):
        run(server, sleeps, ["4"], timeout_s=0.5)


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


def test_an_agent_spec_that_cannot_load_is_named():
    with pytest.raises(EnvError, match=r"env.agent='tests.unit.test_agents:nope': '.*' has no function 'nope'"):
        load_agent(f"{HERE}:nope")
    with pytest.raises(EnvError, match="not of the form module:function"):
        load_agent("just_a_name")
    with pytest.raises(ValueError, match="env.fn='retry' and env.agent=.* are both set"):
        EnvConfig(fn="retry", agent=f"{HERE}:three_calls")


def test_no_call_goes_past_the_engines_context(server):
    """An agent renders its own prompts (tools, system turns): each call's budget is cut to the context left, and
    a first prompt with no room left is the agent's error, named."""
    batch, turns, _ = run(server, three_calls, ["45678"], max_turns=3, context=40, on_error="zero")
    assert all(len(ids) <= 40 for _, ids in turns.prompts) and batch.metrics["env/errors"] == 0
    (rollout,) = batch.rollouts
    assert len(rollout.prompt.token_ids) + len(rollout.response_ids) <= 40 and rollout.finish_reason == "length"
    with pytest.raises(EnvError, match=r"sample 0#0 reset: the call's prompt is 2\d tokens, leaving no room in the "):
        run(server, three_calls, ["4"], context=20)


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


def test_a_smolagents_agent_that_sends_its_tool_calls_back_as_text_trains_under_the_default_settings(server, tmp_path):
    """smolagents' (and DSPy's) agents rewrite earlier turns in their later calls. Under the defaults (env.tito=fork,
    train.packing=auto) each trajectory's first call is kept as a forked sample: counted in tito/forks, trained
    with its trajectory's advantage, the group's baseline over its two trajectories, and the learner packs the
    rows (the fork's prompt is not its trajectory's) without a crash. env.tito=strict refuses, naming the sample."""
    from relayrl.algorithms.stage import advantage_stage
    from relayrl.learner.batching import make_experience
    from relayrl.learner.policy import PolicyLearner
    from relayrl.models.tiny import build_tiny_model
    from relayrl.placement.sections import learner_settings
    from relayrl.types import Score
    from tests.unit.test_learner import _config

    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    answer = '<tool_call>{"name": "final_answer", "arguments": {"answer": "3"}}</tool_call>'
    script, agent = [call, answer], smolagents_tool_calling
    refused = r"sample 0#\d turn 1: the agent's call does not extend its earlier calls"
    overridden = "the agent's stop=.* is overridden"  # its stop strings and tool_choice: the run's sampling wins
    with pytest.warns(ConfigWarning, match=overridden), pytest.raises(EnvError, match=refused):
        run(server, agent, script, tokenizer=tool_tokenizer(), parser="hermes", tito="strict", timeout_s=30)
    with warnings.catch_warnings():  # the same overrides; the quotes of its "Calling tools" text: not in the vocab
        warnings.simplefilter("ignore")
        batch, turns, codec = run(server, agent, script, n=2, tokenizer=tool_tokenizer(), parser="hermes", timeout_s=30)
    assert "Calling tools:" in codec.tokenizer.decode(turns.prompts[-1][1])  # the call sent back as text
    assert batch.metrics["tito/forks"] == 2 and [r.fork_of for r in batch.rollouts] == [None, None, 0, 1]
    assert sorted(batch.rewards[:2]) == [0.0, 1.0] and batch.rewards[2:] == batch.rewards[:2]
    build_tiny_model(len(codec.tokenizer), hidden=64, layers=2, heads=2, intermediate=128).save_pretrained(tmp_path)
    codec.tokenizer.save_pretrained(tmp_path)
    config = _config(tmp_path, micro_batch=8)
    assert config.env.tito == "fork" and config.train.packing == "auto"
    exp = make_experience(batch.rollouts, [Score(r) for r in batch.rewards], codec.tokenizer.pad_token_id)
    exp = advantage_stage(config.algorithm)(exp, batch.rollouts)
    assert exp.advantages is not None
    for fork in (2, 3):  # each fork's tokens get its trajectory's advantage: +-1/sqrt(2) over two trajectories
        trajectory = fork - 2
        trained = exp.advantages[fork][exp.loss_mask[fork].bool()]
        expected = exp.advantages[trajectory][exp.loss_mask[trajectory].bool()][0]
        assert torch.all(trained == expected) and abs(float(expected)) == pytest.approx(2**-0.5, abs=1e-4)
    result = PolicyLearner(learner_settings(config)).update(exp)
    assert result.metrics["learner/packed_frac"] > 0 and math.isfinite(result.metrics["loss/policy"])


def test_dspy_react_forks_at_each_rebuilt_call_under_the_default_settings(server):
    """DSPy's ReAct makes three calls per trajectory and the second and third rebuild the prompt: under the default
    env.tito=fork each trajectory is three samples, the two forks after its group's members, with its reward and
    (not a group member) its advantage. The learner side is the smolagents test's."""
    from relayrl.algorithms.advantages import grpo
    from relayrl.algorithms.stage import estimate_advantages
    from relayrl.learner.batching import make_experience
    from relayrl.types import Score, filled

    fields = "[[ ## next_thought ## ]]\n{}\n\n[[ ## next_tool_name ## ]]\n{}\n\n[[ ## next_tool_args ## ]]\n{}\n\n"
    script = [
        fields.format("add them", "add", '{"a": 1, "b": 2}') + "[[ ## completed ## ]]",
        fields.format("done", "finish", "{}") + "[[ ## completed ## ]]",
        "[[ ## reasoning ## ]]\nok\n\n[[ ## answer ## ]]\n3\n\n[[ ## completed ## ]]",
    ]
    with warnings.catch_warnings():  # DSPy's prompts hold characters the tiny vocabulary lacks: counted, warned
        warnings.simplefilter("ignore")
        batch, turns, codec = run(server, dspy_react, script, n=2, tokenizer=tool_tokenizer(extra="#"), max_turns=4)
    assert len(turns.prompts) == 6 and batch.metrics["tito/prefix_mismatch"] == 4 and batch.metrics["tito/forks"] == 4
    assert [r.fork_of for r in batch.rollouts] == [None, None, 0, 0, 1, 1] and sorted(batch.rewards[:2]) == [0, 1]
    assert batch.rewards[2:] == [batch.rewards[0]] * 2 + [batch.rewards[1]] * 2  # each fork: its trajectory's
    assert codec.action_text(batch.rollouts[0].response_ids).startswith("[[ ## reasoning ## ]]")  # the last call
    exp = make_experience(batch.rollouts, [Score(r) for r in batch.rewards], codec.tokenizer.pad_token_id)
    advantages = filled(estimate_advantages(grpo, False, exp, batch.rollouts).advantages, "advantages")
    first = [float(advantages[row][exp.loss_mask[row].bool()][0]) for row in range(6)]
    assert first == pytest.approx([first[0], -first[0], first[0], first[0], -first[0], -first[0]])
    assert abs(first[0]) == pytest.approx(2**-0.5, abs=1e-4)  # two trajectories in the baseline, not six samples


def said(caught, text: str) -> list[str]:
    return [str(w.message) for w in caught if text in str(w.message)]


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


def test_an_error_over_the_models_output_scores_the_trajectory_0_and_a_broken_agent_stops_the_run(server):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch, _, _ = run(server, sdk_agent, ["4"], prompts=("2+2=", "3+3="), n=1)
        batch2, _, _ = run(server, sdk_agent, ["7"], prompts=("2+2=",), n=1)
    # the one whose answer is not its sum scores 0 (counted), the run goes on under env.on_error=error; the
    # traceback is printed once
    assert sorted(batch.rewards) == [0.0, 1.0] and batch.metrics["env/errors"] == 1
    assert batch2.rewards == [0.0] and batch2.metrics["env/errors"] == 1
    tracebacks = said(caught, "the agent raised agents.exceptions.ModelBehaviorError")
    assert len(tracebacks) == 2 and "Traceback" in tracebacks[0]  # one per run (each `run` is a pool of its own)
    batch, _, _ = run(server, json_agent, ["5"])
    assert batch.rewards == [1.0]
    batch, _, _ = run(server, json_agent, ["five"])  # json.JSONDecodeError, from the model's reply
    assert batch.rewards == [0.0] and batch.metrics["env/errors"] == 1
    # the same error from every trajectory of a step: the agent (or its setup) is broken
    with pytest.raises(EnvError, match=r"every one of the step's 2 trajectories ended in .*StrictOutput, an error the"):
        run(server, subclass_agent, ["4"], n=2)
    # ... or from each of the run's first 8 trajectories, before the step ends
    with pytest.raises(EnvError, match=r"first 8 trajectories all ended in the same exception .*StrictOutput"):
        run(server, subclass_agent, ["4"], n=9)
    with pytest.raises(EnvError, match=r"first 8 trajectories all ended in the same exception .*ValueError: the agent"):
        run(server, raises, ["4"], n=9, on_error="zero")  # the agent's own bug, whatever env.on_error says
    # an agent's own exception (or one before the model said anything) stops the run at once, as before
    with pytest.raises(EnvError, match=r"sample 0#0 reset: the agent raised JSONDecodeError"):
        run(server, bug_before_the_model, ["4"], n=2)


def test_a_trajectory_without_a_model_call_is_counted_and_a_step_without_any_stops_the_run(server):
    CACHE.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch, turns, _ = run(server, cached, ["5"], n=4)
    assert len(turns.prompts) == 1 and batch.metrics["env/no_call"] == 3 and len(batch.rollouts) == 1
    assert batch.rewards == [1.0] and batch.metrics["env/errors"] == 0
    # one line for the first, with its likely cause; one line summing up the rest at the step's end
    (first,) = said(caught, "later trajectories like it are counted")
    assert "the agent returned before its first model call" in first and "DSPy's cache=True" in first
    assert len(said(caught, "(repeated 2 more times this step)")) == 1
    with pytest.raises(EnvError, match=r"none of the step's 2 trajectories made a model call: .*DSPy's cache=True"):
        run(server, never_calls, ["4"], n=2, on_error="zero")


@pytest.mark.parametrize("agent", [chatty, plain_chatty])
def test_a_line_the_agents_library_logs_from_every_trajectory_is_logged_once_and_counted(server, agent, caplog):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch, _, _ = run(server, agent, ["5"], n=4)
    assert batch.rewards == [1.0] * 4
    logged = [r for r in caplog.records if r.name == "chatty_library"]
    assert len(logged) == 1 and logged[0].getMessage() == "no key set, skipping export of 2+3="
    (summary,) = said(caught, "chatty_library logged")
    assert summary.endswith("'no key set, skipping export of 2+3=' (repeated 3 more times this step)")
    logging.getLogger("chatty_library").warning("outside the agents")  # the pool closed: the filter is gone
    assert len([r for r in caplog.records if r.name == "chatty_library"]) == 2


def test_a_clients_retry_of_a_call_gets_the_same_reply_not_a_second_sample(server):
    batch, turns, _ = run(server, retried, ["4", "5"], max_turns=3)
    first, at_once, after, second = SEEN["2+3="]
    assert len(turns.prompts) == 2  # two samples: the call (sent three times) and the next call
    assert first.id == at_once.id == after.id and first.choices[0].message.content == "4"
    assert second.choices[0].message.content == "5" and batch.metrics["tito/forks"] == 0
    (rollout,) = batch.rollouts
    trained = [t for t, m in zip(rollout.response_ids, rollout.loss_mask) if m]
    assert trained == first.choices[0].model_extra["token_ids"] + second.choices[0].model_extra["token_ids"]


def test_the_agents_sdk_trace_export_is_off_unless_the_user_set_it(server, monkeypatch):
    import sys
    import types

    calls = []
    sdk = types.ModuleType("agents")
    sdk.set_tracing_disabled = calls.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "agents", sdk)
    monkeypatch.delenv("OPENAI_AGENTS_DISABLE_TRACING", raising=False)
    AgentPool(server, f"{HERE}:three_calls", {}, 1, 1.0, chat_tokenizer("qwen")).close()
    assert calls == [True] and os.environ["OPENAI_AGENTS_DISABLE_TRACING"] == "1"
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "0")  # the user's choice: tracing on
    AgentPool(server, f"{HERE}:three_calls", {}, 1, 1.0, chat_tokenizer("qwen")).close()
    assert calls == [True] and os.environ["OPENAI_AGENTS_DISABLE_TRACING"] == "0"
