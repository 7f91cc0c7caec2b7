"""A tool-using agent written only against the `openai` client: sums of two three-digit numbers, with an `add`
tool. The model either answers at once or calls `add` (then answers in a later call: several calls per
trajectory); the agent runs each call and sends the result back as a `tool` message; a malformed call gets an
error message back. Reward 1 for the right final answer. relayrl parses the calls with vLLM's hermes parser
(`env.tool_parser: hermes`).
"""

from __future__ import annotations

import json

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


def run_tool(arguments: str) -> str:
    try:
        values = json.loads(arguments)
        return str(int(values["a"]) + int(values["b"]))
    except (ValueError, TypeError, KeyError):
        return "error: add needs integers a and b"


async def calculator_agent(client, row, max_calls: int = 4):
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(max_calls):
        response = await client.chat.completions.create(model="policy", messages=messages, tools=[ADD])
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return float((message.content or "").strip() == row["answer"])
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(call.function.arguments)})
    return 0.0
