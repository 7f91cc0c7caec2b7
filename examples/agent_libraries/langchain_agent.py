"""The calculator task (examples/agent_calculator/) written with LangChain 1.x, as its docs write an agent:
`create_agent` (a LangGraph graph) with a `ChatOpenAI` model and a `@tool`. relayrl's endpoint goes in as
`base_url`; the agent keeps the whole conversation and sends it back each call.

- `agent`: `ainvoke`, the final state's last message is the answer.
- `streamed_agent`: `astream(stream_mode="messages")`, the model's tokens as they are sampled (`stream: true`).

    relayrl train examples/agent_libraries/config.yaml env.agent=examples/agent_libraries/langchain_agent.py:agent
"""

from __future__ import annotations

from langchain.agents import create_agent
from langchain.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError

MAX_CALLS = 4
STEPS = 2 * MAX_CALLS  # LangGraph counts graph steps: a model call and its tool calls are two


@tool
def add(a: int, b: int) -> int:
    """The sum of two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def calculator(client, streaming: bool = False):
    model = ChatOpenAI(model="policy", base_url=str(client.base_url), api_key=client.api_key, streaming=streaming)
    return create_agent(model, tools=[add])


async def agent(client, row):
    inputs = {"messages": [{"role": "user", "content": row["prompt"]}]}
    try:
        state = await calculator(client).ainvoke(inputs, {"recursion_limit": STEPS})
    except GraphRecursionError:
        return 0.0
    return float(state["messages"][-1].text.strip() == row["answer"])


async def streamed_agent(client, row):
    inputs = {"messages": [{"role": "user", "content": row["prompt"]}]}
    answer: dict[str, str] = {}  # the model's text per message id, token by token
    try:
        async for token, metadata in calculator(client, streaming=True).astream(
            inputs, {"recursion_limit": STEPS}, stream_mode="messages"
        ):
            if metadata["langgraph_node"] == "model":
                answer[token.id] = answer.get(token.id, "") + token.text
    except GraphRecursionError:
        return 0.0
    final = list(answer.values())[-1] if answer else ""
    return float(final.strip() == row["answer"])
