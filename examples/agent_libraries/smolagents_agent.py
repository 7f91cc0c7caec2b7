"""The calculator task (examples/agent_calculator/) written with smolagents, as its docs write an agent: a `@tool` and
a `ToolCallingAgent` on an `OpenAIServerModel`. relayrl's endpoint goes in as `api_base`. smolagents is synchronous:
a plain `def`, which relayrl hands a sync `openai.OpenAI` client (run in a thread).

smolagents writes its own conversation each step (its ~3,450-token system prompt, earlier tool calls sent back as
text, a last call without tools when `max_steps` runs out): its calls do not extend the previous ones, and each
starts a new sample (`env.tito=fork`). The model needs 4,096 positions for the prompt.

    relayrl train examples/agent_libraries/config.yaml env.agent=examples/agent_libraries/smolagents_agent.py:agent
"""

from __future__ import annotations

from smolagents import OpenAIServerModel, ToolCallingAgent, tool


@tool
def add(a: int, b: int) -> int:
    """The sum of two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def agent(client, row):
    model = OpenAIServerModel(model_id="policy", api_base=str(client.base_url), api_key=client.api_key)
    calculator = ToolCallingAgent(tools=[add], model=model, max_steps=4, verbosity_level=0)
    return float(str(calculator.run(row["prompt"])).strip() == row["answer"])
