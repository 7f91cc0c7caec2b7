"""relayrl's verifiers harness, `relayrl-chat`: how every agent seat of a `verifiers:TASKSET` environment is played
(relayrl/envs/verifiers_env.py). Imported only where verifiers is installed.

A tool-less chat loop in this process: one non-streamed call per segment through the rollout's interception
`endpoint` (so the trace records the turn, and the call reaches the trajectory's endpoint as it was made), the
reply's text as the program's output. A resumed segment (the env's next user turn) relaunches on the whole
conversation, as verifiers' `null` harness does (`SUPPORTS_RESUME`), so each call extends the previous one.
verifiers finds a harness by id as a module: this one is registered as `verifiers.v1.harnesses.relayrl_chat`.
"""

from __future__ import annotations

import sys
from typing import Any, ClassVar

import verifiers.v1 as vf
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.runtimes import ProgramResult

from relayrl.errors import EnvError

HARNESS_ID = "relayrl-chat"

__all__ = ["ChatHarness", "ChatHarnessConfig"]


class ChatHarnessConfig(vf.HarnessConfig):
    id: str = HARNESS_ID


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    APPENDS_SYSTEM_PROMPT: ClassVar[bool] = True
    SUPPORTS_RESUME: ClassVar[bool] = True
    EXECUTES_CODE: ClassVar[bool] = False
    NEEDS_CONTAINER: ClassVar[bool] = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_) -> ProgramResult:
        import openai

        if mcp_urls:
            raise EnvError(f"the {HARNESS_ID} harness runs no tools; the task offers {', '.join(mcp_urls)}")
        system, prompt = self.resolve_prompt(data)
        messages: list[Any] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [message_to_wire(m) for m in prompt or []]
        async with openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0, timeout=None) as client:
            reply = await client.chat.completions.create(model=ctx.model, messages=messages)
        return ProgramResult(exit_code=0, stdout=reply.choices[0].message.content or "", stderr="")


sys.modules.setdefault(f"verifiers.v1.harnesses.{HARNESS_ID.replace('-', '_')}", sys.modules[__name__])
