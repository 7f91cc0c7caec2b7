"""Agent trajectories for the multi-turn driver: an agent program's model calls become the driver's turns.

`AgentPool` has the environment pool's interface (relayrl/envs/pool.py: `reset`, `step`, `poll`, `release`,
`free`, `busy`), so the multi-turn driver (relayrl/sources/trajectories.py) runs agents exactly as it runs
environments, token in, token out: `reset` starts `agent(client, row, **env.kwargs)` on the endpoint's loop
(relayrl/agents/server.py), with an OpenAI client whose base URL is the trajectory's own; the agent's first
call is what `reset` answers (its messages and tools render the first prompt); each later call is a step's
observation: the messages it appends after the assistant message it was answered with (tool results, a user
turn), whose tokens the driver appends after the sampled ones; the agent's return value is the final step's
reward. `step` answers the pending call from the tokens the engine sampled (relayrl/agents/chat.py builds the
reply, tool calls parsed by vLLM's parser).

A `/v1/responses` call is read into the same messages and tools as a chat call (relayrl/agents/responses.py) and
answered with a `response` object; `stream=true` answers either as server-sent events made from the finished
reply (relayrl/agents/streaming.py). A `/v1/completions` call (a prompt text or token ids, no chat template) is
served the same way: its first prompt is taken as it is, and a later one that extends the last prompt and its answer (the reply's text, or its
prompt and sampled ids) is a step whose observation is the appended text or ids (`RawText`).

A call that does not extend the earlier ones (the agent edited or dropped earlier messages, or changed its
tools) is a step flagged `rebuilt`, carrying all its messages: the driver ends the sample there and starts a
new one from this call per `env.tito`. One call at a time per trajectory, but a client's retry (the same request
again, while it is answered or after) gets that call's reply, never a second sample; between two calls (and before
the first) the agent has `env.timeout_s`, then it is cancelled (a coroutine stops at its next await; a plain
function's thread cannot be stopped, and its next call is refused). A call after the trajectory has ended
(env.max_turns, env.max_total_tokens) is answered 400 and the agent cancelled.

`env.tool_parser` left '' is the one the chat template's format names; with none, a call with `tools=` is the
status `broken` (the run stops). How a trajectory ends besides its reward (relayrl/agents/outcomes.py): an
exception over what the model wrote is `model_error` (scored 0), any other exception `error` (env.on_error),
no call at all `no_call`, and the run's first trajectories all ending in one exception class `broken`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import itertools
import math
import queue
import threading
import time
import traceback
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from relayrl.agents.chat import (
    ChatRequest,
    RequestError,
    answer,
    answer_text,
    error_body,
    read_completion_request,
    read_request,
    same_reply,
    tool_call,
)
from relayrl.agents.clients import AgentClients
from relayrl.agents.loading import load_agent
from relayrl.agents.outcomes import (
    AGENT_THREADS,
    Faults,
    agents_sdk_tracing_off,
    broken_setup,
    kind_of,
    model_behaviour,
    no_tool_parser,
)
from relayrl.agents.responses import Previous, ResponsesRequest, answer_response, read_response_request, remembered
from relayrl.agents.sampling import RunSampling, warn_overridden
from relayrl.agents.server import AgentServer
from relayrl.agents.streaming import Stream, chat_stream, response_stream, token_pieces
from relayrl.envs.base import RawText, Step
from relayrl.envs.tools import template_parser
from relayrl.rollout.tool_calls import ParsedTurn, TurnParser

_pool_ids = itertools.count()
GRACE_S = 1.0  # an agent still running when its trajectory ends is cancelled this long after


@dataclass
class _Agent:
    """One trajectory's agent, as the pool tracks it."""

    key: Hashable
    url_key: str
    where: str
    run: concurrent.futures.Future | None = None
    deadline: float | None = None  # while its own code runs
    request: ChatRequest | None = None  # the call being answered
    reply: asyncio.Future | None = None
    messages: list[dict[str, Any]] | None = None  # the last answered call's messages
    answered: dict[str, Any] | None = None  # and the assistant message it was answered with
    tools: list[dict[str, Any]] | None = None
    last: tuple[ChatRequest, dict[str, Any] | Stream] | None = (
        None  # the last answered call and its reply (a retry's answer)
    )
    # after a completions call: its prompt and answer, as ids and (a text prompt) as text: what the next must extend
    so_far: tuple[list[int], str | None] | None = None
    previous: Previous | None = None  # after a /v1/responses call: what a previous_response_id naming it continues
    calls: int = 0
    tool_calls: int = 0  # in the answers since the last event
    tool_errors: int = 0
    outcome: tuple | None = None  # its end, held while a reply is still pending
    ended: bool = False


class AgentPool:
    def __init__(
        self,
        server: AgentServer,
        spec: str,
        kwargs: dict[str, Any],
        slots: int,
        timeout_s: float,
        tokenizer,
        tool_parser: str = "",
        sampling: RunSampling | None = None,
        reasoning_parser: str = "",
        faults: Faults | None = None,
    ):
        self.server, self.spec, self.kwargs, self.slots, self.timeout_s = server, spec, dict(kwargs), slots, timeout_s
        self.function = load_agent(spec)
        agents_sdk_tracing_off()
        self.tokenizer = tokenizer
        # env.tool_parser, else the one the chat template's format names; '' (not known): a call with tools= stops
        self.tool_parser = tool_parser or template_parser(tokenizer.chat_template) or ""
        parsing = self.tool_parser or reasoning_parser
        self.parser = TurnParser(tokenizer, self.tool_parser, reasoning_parser) if parsing else None
        self.sampling = sampling or RunSampling()
        self.faults = faults or Faults()
        self.faults.quiet_logs()
        self._id = next(_pool_ids)
        self._live: dict[Hashable, _Agent] = {}
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = concurrent.futures.ThreadPoolExecutor(slots, thread_name_prefix=AGENT_THREADS)
        self.clients = AgentClients()  # each trajectory's openai client, over one connection pool

    # ---- the environment pool's interface (driver thread) ------------------------------------------------
    @property
    def free(self) -> int:
        return self.slots - len(self._live)

    @property
    def busy(self) -> bool:
        """Some agent is running its own code: a call may be on its way."""
        with self._lock:
            return any(a.reply is None and not a.ended and a.outcome is None for a in self._live.values())

    def reset(self, key: Hashable, row: dict[str, Any], where: str) -> None:
        agent = _Agent(key, f"{self._id}-{key}", where.removesuffix(" reset"))
        agent.deadline = time.monotonic() + self.timeout_s
        self._live[key] = agent
        self.server.register(agent.url_key, lambda _key, body, kind: self._handle(agent, body, kind))
        agent.run = asyncio.run_coroutine_threadsafe(self._run(agent, row), self.server.loop)
        agent.run.add_done_callback(lambda run: self._on_end(agent, run))

    def step(self, key: Hashable, action: str, where: str, turn=None) -> None:
        """Answer the pending call with the turn the engine sampled (`turn`: the driver's SampledTurn)."""
        agent = self._live[key]
        request = agent.request
        assert request is not None and agent.reply is not None and turn is not None  # a turn answers a call
        if request.prompt is not None:  # a completions call
            return self._answer_text(agent, request, action, turn)
        parsed = ParsedTurn(action)
        if self.parser is not None:
            output = turn.output
            parsed = self.parser.parse_sampled(output.token_ids, output.finish_reason, request.tools, request.model)
        text, calls, errors = parsed.content, parsed.tool_calls, parsed.tool_errors
        responses = isinstance(request, ResponsesRequest)
        build, prefix = (answer_response, "resp") if responses else (answer, "chatcmpl")
        body = build(
            request,
            call_id=f"{prefix}-{agent.url_key}-{agent.calls}",
            prompt_ids=turn.prompt_ids,
            token_ids=turn.output.token_ids,
            logprobs=turn.output.logprobs,
            content=text,
            tool_calls=calls,
            finish_reason=turn.output.finish_reason,
            reasoning=parsed.reasoning,
            tokens=[self.tokenizer.decode([t]) for t in turn.output.token_ids] if request.logprobs else [],
        )
        answered = {"role": "assistant", "content": text or "", "tool_calls": _normal(calls)}
        previous = remembered(request, body["id"], answered) if isinstance(request, ResponsesRequest) else None
        with self._lock:
            agent.messages, agent.tools, agent.so_far = request.messages, request.tools, None
            agent.answered, agent.previous = answered, previous
            agent.tool_calls += len(calls)
            agent.tool_errors += errors
        self._reply(agent, self._streamed(request, body, turn) if request.stream else body)

    def _streamed(self, request: ChatRequest, body: dict[str, Any], turn) -> Stream:
        """A streamed call's reply: the finished one as events, its text in the sampled tokens' pieces."""
        pieces = token_pieces(self.tokenizer, turn.output.token_ids)
        if isinstance(request, ResponsesRequest):
            return response_stream(body, pieces)
        return chat_stream(body, pieces, request.include_usage)

    def _answer_text(self, agent: _Agent, request: ChatRequest, action: str, turn) -> None:
        """A completions call's answer: the sampled text; what the next call's prompt must start with is kept."""
        body = answer_text(
            request,
            call_id=f"cmpl-{agent.url_key}-{agent.calls}",
            prompt_ids=turn.prompt_ids,
            token_ids=turn.output.token_ids,
            logprobs=turn.output.logprobs,
            text=action,
            finish_reason=turn.output.finish_reason,
            tokens=[self.tokenizer.decode([t]) for t in turn.output.token_ids] if request.logprobs else [],
        )
        prompt = request.prompt
        so_far = turn.prompt_ids + turn.output.token_ids, prompt + action if isinstance(prompt, str) else None
        with self._lock:
            agent.messages, agent.tools, agent.so_far, agent.answered = [], None, so_far, None
            agent.previous = None
        self._reply(agent, body)

    def _reply(self, agent: _Agent, body: dict[str, Any] | Stream) -> None:
        with self._lock:
            agent.calls += 1
            agent.deadline = time.monotonic() + self.timeout_s
            assert agent.request is not None  # a turn answers a pending call
            agent.last = agent.request, body
            reply, agent.reply, agent.request = agent.reply, None, None
            outcome, agent.outcome = agent.outcome, None
        assert reply is not None  # a turn answers a pending call
        self.server.loop.call_soon_threadsafe(_resolve, reply, (200, body))
        if outcome is not None:  # it ended (a concurrent call failed) while this one was being answered
            self._events.put(outcome)

    def release(self, key: Hashable) -> None:
        agent = self._live.pop(key, None)
        if agent is None:
            return
        self.server.unregister(agent.url_key)
        with self._lock:
            agent.ended = True
            reply, agent.reply = agent.reply, None
        if reply is not None:
            message = f"{agent.where}: the trajectory has ended (env.max_turns or env.max_total_tokens reached)"
            self.server.loop.call_soon_threadsafe(_resolve, reply, (400, error_body(message)))
        if agent.run is not None and not agent.run.done():  # after a grace period to take the refusal in
            self.server.loop.call_soon_threadsafe(self.server.loop.call_later, GRACE_S, agent.run.cancel)

    def poll(self, timeout: float) -> list[tuple[Hashable, str, Any]]:
        now = time.monotonic()
        with self._lock:
            deadlines = [a.deadline for a in self._live.values() if a.deadline is not None]
        wait = max(0.0, min([timeout, *(d - now + 0.01 for d in deadlines)]))
        results = []
        try:
            results.append(self._events.get(timeout=wait) if wait > 0 else self._events.get_nowait())
            while True:
                results.append(self._events.get_nowait())
        except queue.Empty:
            pass
        results = [r for r in results if r[0] in self._live]
        now = time.monotonic()
        with self._lock:
            overdue = [a for a in self._live.values() if a.deadline is not None and now > a.deadline]
            for agent in overdue:
                agent.deadline = None
        for agent in overdue:
            if agent.run is not None:
                agent.run.cancel()
            message = f"the agent ran over env.timeout_s={self.timeout_s:g} s before its next call"
            results.append((agent.key, "timeout", message))
        return results

    def close(self) -> None:
        for key in list(self._live):
            self.release(key)
        self._threads.shutdown(wait=False, cancel_futures=True)
        self.clients.close(self.server.loop, after_s=2 * GRACE_S)
        self.faults.loud_logs()

    # ---- the endpoint's loop ---------------------------------------------------------------------------
    async def _run(self, agent: _Agent, row: dict[str, Any]):
        url = self.server.base_url(agent.url_key)
        if inspect.iscoroutinefunction(self.function):
            async with self.clients.async_client(url) as client:
                return await self.function(client, row, **self.kwargs)

        def plain():
            with self.clients.sync_client(url) as client:
                return self.function(client, row, **self.kwargs)

        result = await asyncio.get_running_loop().run_in_executor(self._threads, plain)
        return await result if inspect.isawaitable(result) else result

    async def _handle(self, agent: _Agent, body: Any, kind: str = "chat") -> tuple[int, dict[str, Any] | Stream]:
        if agent.ended:
            return 400, error_body(f"{agent.where}: the trajectory has ended")
        try:
            if kind == "responses":
                request = read_response_request(body, agent.previous)
            else:
                request = read_request(body) if kind == "chat" else read_completion_request(body)
        except RequestError as err:
            return 400, error_body(f"{agent.where} call {agent.calls + 1}: {err}", param=err.param)
        warn_overridden(self.spec, self.sampling, request.overridden)
        if (repeated := self._repeated(agent, request)) is not None:  # a client's retry: that call's reply
            return await repeated
        with self._lock:
            if agent.reply is not None or agent.ended:
                return 400, error_body(f"{agent.where}: one call at a time per trajectory (a call is being answered)")
            event = self._event(agent, request)
            agent.request, agent.deadline = request, None
            agent.reply = reply = asyncio.get_running_loop().create_future()
        self._events.put(event)
        return await reply

    def _event(self, agent: _Agent, request: ChatRequest) -> tuple[Hashable, str, Any]:
        """The first call: what reset answers. A later one: a step whose observation is what it appends (a chat
        call: its messages after the one it was answered with; a completions call: its prompt's text or ids after
        the last prompt and the answer). A call with tools= that no parser can read stops the run."""
        if request.tools and not self.tool_parser:
            return agent.key, "broken", no_tool_parser(request.tools)
        if agent.calls == 0:
            first = request.messages if request.prompt is None else _raw(request.prompt)
            return agent.key, "ok", (first, (), request.tools)
        info = {"tool_calls": agent.tool_calls, "tool_errors": agent.tool_errors}
        agent.tool_calls = agent.tool_errors = 0
        if request.prompt is not None:
            delta = _text_delta(agent.so_far, request.prompt)
            if delta is not None:
                return agent.key, "ok", Step(delta, 0.0, False, info)
            return agent.key, "ok", Step(_raw(request.prompt), 0.0, False, {**info, "rebuilt": True, "tools": None})
        kept, new = request.messages[: len(agent.messages or [])], request.messages[len(agent.messages or []) :]
        extends = (
            agent.answered is not None  # the last call was a chat call
            and kept == agent.messages
            and bool(new)
            and same_reply(new[0], agent.answered)
            and request.tools == agent.tools
        )
        if extends:
            return agent.key, "ok", Step(new[1:], 0.0, False, info)
        return agent.key, "ok", Step(request.messages, 0.0, False, {**info, "rebuilt": True, "tools": request.tools})

    def _on_end(self, agent: _Agent, run: concurrent.futures.Future) -> None:
        if agent.ended or run.cancelled():
            return
        error = run.exception()
        if error is not None:
            event = self._raised(agent, error)
        elif agent.calls == 0 and agent.request is None:
            event = (agent.key, "no_call", self._no_call(agent))
        else:
            event = self._final(agent, run.result())
        if (cause := self.faults.errors.trajectory_ended(error, agent.where)) is not None:
            event = (agent.key, "broken", broken_setup(cause))
        with self._lock:
            if agent.reply is not None:
                agent.outcome = event  # delivered once the pending call is answered
                return
            agent.deadline = None
        self._events.put(event)

    def _raised(self, agent: _Agent, error: BaseException) -> tuple[Hashable, str, Any]:
        """An exception over what the model wrote (relayrl/agents/outcomes.py) is the trajectory's outcome
        (`model_error`: scored 0, its first traceback printed); any other, or any before the model has answered
        once, is the agent's own (`error`)."""
        kind = model_behaviour(error) if agent.calls > 0 else None
        if kind is None:
            return agent.key, "error", f"the agent raised {_described(error)}"  # the driver names the sample
        self.faults.errors.first_of_its_kind(kind, error, f"env.agent={self.spec!r}", agent.where)
        return agent.key, "model_error", (kind_of(error), f"the agent raised {_described(error)}")

    def _no_call(self, agent: _Agent) -> str:
        """A trajectory without a model call has nothing to train: counted (env/no_call), warned once per step."""
        message = (
            "the agent returned before its first model call, so the trajectory has no sample: a client-side cache "
            "(DSPy's cache=True, litellm's or LangChain's cache) answering a prompt seen before, or an agent that "
            "returns early"
        )
        self.faults.notices.say(f"no_call {self.spec}", f"env.agent={self.spec!r}: {message}", agent.where)
        return message

    def _final(self, agent: _Agent, result: Any) -> tuple[Hashable, str, Any]:
        """The agent's return value as the last step: a number, or {reward, success}."""
        success = None
        if isinstance(result, dict):
            unknown = sorted(set(result) - {"reward", "success"})
            if unknown or "reward" not in result:
                return (
                    agent.key,
                    "env_error",
                    (f"the agent returned {result!r}: a dict holds 'reward' (and optionally 'success')"),
                )
            success, result = result.get("success"), result["reward"]
        if isinstance(result, bool) or not isinstance(result, int | float) or not math.isfinite(result):
            return agent.key, "env_error", f"the agent returned {result!r}, not a finite reward"
        info = {"tool_calls": agent.tool_calls, "tool_errors": agent.tool_errors}
        info["success"] = bool(result > 0) if success is None else bool(success)
        return agent.key, "ok", Step(None, float(result), True, info)

    def _repeated(self, agent: _Agent, request: ChatRequest) -> asyncio.Future | None:
        """A client's automatic retry (LangChain's, litellm's and the Agents SDK's own clients retry by default)
        repeats a call exactly, while it is being answered or after: it gets that call's reply, never a second
        sample. None for any other call."""
        with self._lock:
            if agent.reply is not None and agent.request == request:
                return agent.reply
            if agent.reply is not None or agent.last is None or agent.last[0] != request:
                return None
            answered = asyncio.get_running_loop().create_future()
            answered.set_result((200, agent.last[1]))
            return answered


def _resolve(reply: asyncio.Future, value) -> None:
    if not reply.done():
        reply.set_result(value)


def _normal(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls as an agent's message carries them back, read as `read_request` reads them (dict arguments)."""
    return [tool_call(c, -1) for c in calls]


def _described(error: BaseException) -> str:
    """`Type: message (file:line)`, at the innermost frame of the agent's own code (not openai's or asyncio's)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "site-packages" not in f.filename]
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


def _raw(prompt: str | list[int]) -> RawText:
    return RawText(text=prompt) if isinstance(prompt, str) else RawText(ids=list(prompt))


def _text_delta(so_far: tuple[list[int], str | None] | None, prompt: str | list[int]) -> RawText | None:
    """What a completions prompt appends to the last prompt and its answer (ids to their ids, text to their text),
    or None when it does not extend them (after a chat call, another text, text after an ids prompt)."""
    if so_far is None:
        return None
    ids, text = so_far
    if isinstance(prompt, str):
        return RawText(text=prompt[len(text) :]) if text is not None and prompt.startswith(text) else None
    return RawText(ids=list(prompt[len(ids) :])) if prompt[: len(ids)] == ids else None
