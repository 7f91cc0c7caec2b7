"""How an agent's trajectory fails through the endpoint (relayrl/agents/outcomes.py, pool.py), with a scripted engine:
an agent's own exception or a non-reward return is named with its sample and handled per env.on_error, one past its
deadline is cancelled and counted; an exception the agent's library raises over what the model wrote scores the
trajectory 0 while the same one from every trajectory stops the run; a trajectory that never called the model is
counted and a step without any call stops the run; a line logged from every trajectory is logged once and counted;
the Agents SDK's trace export is off."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import warnings

import pytest

from relayrl.agents.pool import AgentPool
from relayrl.agents.server import AgentServer
from relayrl.errors import EnvError
from tests.unit.agent_harness import drive, said
from tests.unit.test_tito import chat_tokenizer

HERE = "tests.unit.test_agents_faults"


# ---------------------------------------------------------------------------------------------- agents
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


# ---------------------------------------------------------------------------------------------- harness
@pytest.fixture(scope="module")
def server():
    endpoint = AgentServer()
    yield endpoint
    endpoint.close()


# ---------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize(
    ("agent", "status", "says"),
    [
        (
            raises,
            "error",
            r"^sample 0#0 turn 1: the agent raised ValueError: the agent's own bug \(.*test_agents_faults.py:\d+\)",
        ),
        (returns_text, "env_error", r"^sample 0#0 turn 1: the agent returned 'right', not a finite reward"),
    ],
)
def test_a_failing_agent_is_named_and_handled_per_on_error(server, agent, status, says):
    with pytest.raises(EnvError, match=says):
        drive(server, agent, ["4"])
    batch, _, _ = drive(server, agent, ["4"], on_error="zero", prompts=("1+1=", "2+2="))
    assert batch.metrics["env/errors"] == 2 and all(r == 0.0 for r in batch.rewards)


def test_an_agent_past_its_deadline_is_cancelled_and_counted(server):
    batch, _, _ = drive(server, sleeps, ["4"], on_error="zero", timeout_s=0.5)
    assert batch.metrics["env/timeouts"] == 1 and batch.rewards == [0.0]
    with pytest.raises(EnvError, match=r"ran over env.timeout_s=0.5 s before its next call"):
        drive(server, sleeps, ["4"], timeout_s=0.5)


def test_an_error_over_the_models_output_scores_the_trajectory_0_and_a_broken_agent_stops_the_run(server):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch, _, _ = drive(server, sdk_agent, ["4"], prompts=("2+2=", "3+3="), n=1)
        batch2, _, _ = drive(server, sdk_agent, ["7"], prompts=("2+2=",), n=1)
    # the one whose answer is not its sum scores 0 (counted), the run goes on under env.on_error=error; the
    # traceback is printed once
    assert sorted(batch.rewards) == [0.0, 1.0] and batch.metrics["env/errors"] == 1
    assert batch2.rewards == [0.0] and batch2.metrics["env/errors"] == 1
    tracebacks = said(caught, "the agent raised agents.exceptions.ModelBehaviorError")
    assert len(tracebacks) == 2 and "Traceback" in tracebacks[0]  # one per run (each `run` is a pool of its own)
    batch, _, _ = drive(server, json_agent, ["5"])
    assert batch.rewards == [1.0]
    batch, _, _ = drive(server, json_agent, ["five"])  # json.JSONDecodeError, from the model's reply
    assert batch.rewards == [0.0] and batch.metrics["env/errors"] == 1
    # the same error from every trajectory of a step: the agent (or its setup) is broken
    with pytest.raises(EnvError, match=r"every one of the step's 2 trajectories ended in .*StrictOutput, an error the"):
        drive(server, subclass_agent, ["4"], n=2)
    # ... or from each of the run's first 8 trajectories, before the step ends
    with pytest.raises(EnvError, match=r"first 8 trajectories all ended in the same exception .*StrictOutput"):
        drive(server, subclass_agent, ["4"], n=9)
    with pytest.raises(EnvError, match=r"first 8 trajectories all ended in the same exception .*ValueError: the agent"):
        drive(server, raises, ["4"], n=9, on_error="zero")  # the agent's own bug, whatever env.on_error says
    # an agent's own exception (or one before the model said anything) stops the run at once, as before
    with pytest.raises(EnvError, match=r"sample 0#0 reset: the agent raised JSONDecodeError"):
        drive(server, bug_before_the_model, ["4"], n=2)


def test_a_trajectory_without_a_model_call_is_counted_and_a_step_without_any_stops_the_run(server):
    CACHE.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch, turns, _ = drive(server, cached, ["5"], n=4)
    assert len(turns.prompts) == 1 and batch.metrics["env/no_call"] == 3 and len(batch.rollouts) == 1
    assert batch.rewards == [1.0] and batch.metrics["env/errors"] == 0
    # one line for the first, with its likely cause; one line summing up the rest at the step's end
    (first,) = said(caught, "later trajectories like it are counted")
    assert "the agent returned before its first model call" in first and "DSPy's cache=True" in first
    assert len(said(caught, "(repeated 2 more times this step)")) == 1
    with pytest.raises(EnvError, match=r"none of the step's 2 trajectories made a model call: .*DSPy's cache=True"):
        drive(server, never_calls, ["4"], n=2, on_error="zero")


@pytest.mark.parametrize("agent", [chatty, plain_chatty])
def test_a_line_the_agents_library_logs_from_every_trajectory_is_logged_once_and_counted(server, agent, caplog):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch, _, _ = drive(server, agent, ["5"], n=4)
    assert batch.rewards == [1.0] * 4
    logged = [r for r in caplog.records if r.name == "chatty_library"]
    assert len(logged) == 1 and logged[0].getMessage() == "no key set, skipping export of 2+3="
    (summary,) = said(caught, "chatty_library logged")
    assert summary.endswith("'no key set, skipping export of 2+3=' (repeated 3 more times this step)")
    logging.getLogger("chatty_library").warning("outside the agents")  # the pool closed: the filter is gone
    assert len([r for r in caplog.records if r.name == "chatty_library"]) == 2


def test_the_agents_sdk_trace_export_is_off_unless_the_user_set_it(server, monkeypatch):
    import sys
    import types

    calls = []
    sdk = types.ModuleType("agents")
    sdk.set_tracing_disabled = calls.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "agents", sdk)
    monkeypatch.delenv("OPENAI_AGENTS_DISABLE_TRACING", raising=False)
    AgentPool(server, f"{HERE}:never_calls", {}, 1, 1.0, chat_tokenizer("qwen")).close()
    assert calls == [True] and os.environ["OPENAI_AGENTS_DISABLE_TRACING"] == "1"
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "0")  # the user's choice: tracing on
    AgentPool(server, f"{HERE}:never_calls", {}, 1, 1.0, chat_tokenizer("qwen")).close()
    assert calls == [True] and os.environ["OPENAI_AGENTS_DISABLE_TRACING"] == "0"
