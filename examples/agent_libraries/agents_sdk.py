"""The calculator task (examples/agent_calculator/) written with the OpenAI Agents SDK (`openai-agents`), as its docs
write an agent: a `function_tool`, an `Agent`, `Runner.run`. relayrl's client goes in as the model's `openai_client`.

- `agent`: `OpenAIChatCompletionsModel`, chat completions; it sends the whole history back each turn, so every
  call continues the trajectory's tokens.
- `responses_agent`: the SDK's default model, `OpenAIResponsesModel` (`/v1/responses`).
- `streamed_agent`: the default model through `Runner.run_streamed` (`stream: true`).

Tracing is off: the SDK would otherwise export every run's trace to OpenAI.

    relayrl train examples/agent_libraries/config.yaml env.agent=examples/agent_libraries/agents_sdk.py:agent
"""

from __future__ import annotations

from agents import (
    Agent,
    MaxTurnsExceeded,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

set_tracing_disabled(True)
MAX_CALLS = 4


@function_tool
def add(a: int, b: int) -> int:
    """The sum of two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def calculator(model) -> Agent:
    return Agent(name="calculator", model=model, tools=[add])


def reward(output, row) -> float:
    return float(str(output or "").strip() == row["answer"])


async def agent(client, row):
    model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
    try:
        result = await Runner.run(calculator(model), row["prompt"], max_turns=MAX_CALLS)
    except MaxTurnsExceeded:
        return 0.0
    return reward(result.final_output, row)


async def responses_agent(client, row):
    model = OpenAIResponsesModel(model="policy", openai_client=client)
    try:
        result = await Runner.run(calculator(model), row["prompt"], max_turns=MAX_CALLS)
    except MaxTurnsExceeded:
        return 0.0
    return reward(result.final_output, row)


async def streamed_agent(client, row):
    model = OpenAIResponsesModel(model="policy", openai_client=client)
    result = Runner.run_streamed(calculator(model), row["prompt"], max_turns=MAX_CALLS)
    try:
        async for _event in result.stream_events():
            pass  # text deltas, tool calls, tool outputs as they come
    except MaxTurnsExceeded:
        return 0.0
    return reward(result.final_output, row)
