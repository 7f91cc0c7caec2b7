"""An agent written only against the `openai` client, trained by relayrl through `env.agent`.

`retry_agent` asks the row's question; a wrong answer hears `feedback` and gets another attempt, up to
`attempts`; a right one on attempt k earns gamma**k. Nothing in it knows about relayrl: pointed at any
OpenAI-compatible server (`AsyncOpenAI(base_url=...)`) it runs the same. relayrl hands it a client whose base
URL serves the policy, records the tokens of every call, and trains on them with the reward it returns.

    relayrl train examples/openai_agent/config.yaml     (after the demo's warm start: see config.yaml)
"""

from __future__ import annotations


async def retry_agent(client, row, feedback: str = "+", attempts: int = 2, gamma: float = 0.5):
    messages = [{"role": "user", "content": row["prompt"]}]
    for attempt in range(attempts):
        response = await client.chat.completions.create(model="policy", messages=messages)
        reply = response.choices[0].message.content or ""
        if reply.strip() == str(row["answer"]).strip():
            return {"reward": gamma**attempt, "success": True}
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": feedback}]
    return {"reward": 0.0, "success": False}
