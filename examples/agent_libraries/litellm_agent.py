"""The calculator task (examples/agent_calculator/) written with litellm, as its docs write a tool loop:
`litellm.acompletion` with `tools=`, the reply message appended, each call run and its result appended as a `tool`
message. relayrl's endpoint goes in as `api_base` (an `openai/` model name: an OpenAI-compatible server).

- `agent`: one reply per call.
- `streamed_agent`: `stream=True`, the chunks put back together by `litellm.stream_chunk_builder`.

litellm fetches its model price list from the internet when imported unless LITELLM_LOCAL_MODEL_COST_MAP is set.

    relayrl train examples/agent_libraries/config.yaml env.agent=examples/agent_libraries/litellm_agent.py:agent
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # the copy shipped in the package: no download
import litellm  # noqa: E402

MAX_CALLS = 4
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "the sum of two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def add(arguments: str) -> str:
    try:
        values = json.loads(arguments)
        return str(int(values["a"]) + int(values["b"]))
    except (ValueError, TypeError, KeyError):
        return "error: add needs integers a and b"


async def agent(client, row, stream: bool = False):
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(MAX_CALLS):
        settings = {"model": "openai/policy", "api_base": str(client.base_url), "api_key": client.api_key}
        if stream:
            chunks = [
                chunk
                async for chunk in await litellm.acompletion(**settings, messages=messages, tools=[ADD], stream=True)
            ]
            response = litellm.stream_chunk_builder(chunks, messages=messages)
        else:
            response = await litellm.acompletion(**settings, messages=messages, tools=[ADD])
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return float((message.content or "").strip() == row["answer"])
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": add(call.function.arguments)})
    return 0.0


async def streamed_agent(client, row):
    return await agent(client, row, stream=True)
