"""The calculator task (examples/agent_calculator/) written with pydantic-ai, as its docs write an agent: an `Agent`
with a `tool_plain`, run with an `OpenAIChatModel`. relayrl's client goes in through `OpenAIProvider(openai_client=...)`;
pydantic-ai keeps the message history and sends it back each call.

- `agent`: `Agent.run`.
- `streamed_agent`: `Agent.run_stream` (`stream: true`).

    relayrl train examples/agent_libraries/config.yaml env.agent=examples/agent_libraries/pydantic_ai_agent.py:agent
"""

from __future__ import annotations

from pydantic_ai import Agent, UsageLimitExceeded, UsageLimits
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

LIMITS = UsageLimits(request_limit=4)  # model calls per problem
calculator = Agent(output_type=str)


@calculator.tool_plain
def add(a: int, b: int) -> int:
    """The sum of two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def policy(client) -> OpenAIChatModel:
    return OpenAIChatModel("policy", provider=OpenAIProvider(openai_client=client))


async def agent(client, row):
    try:
        result = await calculator.run(row["prompt"], model=policy(client), usage_limits=LIMITS)
    except UsageLimitExceeded:
        return 0.0
    return float(result.output.strip() == row["answer"])


async def streamed_agent(client, row):
    try:
        async with calculator.run_stream(row["prompt"], model=policy(client), usage_limits=LIMITS) as result:
            output = await result.get_output()
    except UsageLimitExceeded:
        return 0.0
    return float(output.strip() == row["answer"])
