"""The calculator task (examples/agent_calculator/) written with DSPy, as its docs write an agent: a `dspy.ReAct` module
with a plain function as its tool, on a `dspy.LM`. relayrl's endpoint goes in as `api_base`; `cache=False`, or DSPy
answers a repeated prompt from its disk cache and the trajectory has no tokens.

DSPy renders each step's whole trajectory into a new prompt (~2,500 tokens with its instructions): its calls do not
extend the previous ones and each starts a new sample (`env.tito=fork`). The model needs 4,096 positions.

    relayrl train examples/agent_libraries/config.yaml env.agent=examples/agent_libraries/dspy_agent.py:agent
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # DSPy's LM may go through litellm: no download
import dspy  # noqa: E402


def add(a: int, b: int) -> int:
    """The sum of two integers."""
    return a + b


calculator = dspy.ReAct("question -> answer", tools=[add], max_iters=4)


async def agent(client, row):
    lm = dspy.LM("openai/policy", api_base=str(client.base_url), api_key=client.api_key, cache=False)
    with dspy.context(lm=lm):
        prediction = await calculator.acall(question=row["prompt"])
    return float(str(prediction.answer).strip() == row["answer"])
