"""Multi-turn rollouts: trajectories that alternate model turns and environment steps, each on its own clock.

One thread runs an event loop over two sources: finished turns from the engine (relayrl/sources/turn_requests.py)
and finished environment steps from the workers (relayrl/envs/pool.py). A trajectory's next turn is
submitted as soon as its step returns, so the engine keeps generating for the others while one waits on a
slow tool; at most `env.max_inflight` trajectories are in flight (one environment worker each). A step past
`env.timeout_s` is killed with its worker and costs only its trajectory (`env.on_error`); so does a worker a
signal killed from outside, whose error does not blame the environment.

Images (a vision-language policy) in reset's messages and in observations: relayrl/sources/trajectory_images.py.

Token in, token out (relayrl/data/chat.py): a trajectory is a list of segments, generated tokens exactly as
the engine sampled them (loss mask 1, behaviour log-probs, versions) and observation tokens (mask 0); every
turn's prompt is the concatenation of the segments. The output is one `Rollout` per trajectory: its
`response_ids` are every token after the first prompt, with `loss_mask`. A turn whose prompt cannot continue those
tokens (the template re-renders earlier turns, an agent's call rewrites its history) forks under `env.tito=fork`,
the default: the sample so far is kept, placed after its group's members with `fork_of` naming its trajectory's
last sample, whose reward it takes (and, in the learner, its advantage: it is not a member of the group's baseline). Its
`finish_reason` is `length` when it was cut at env.max_total_tokens or its last model turn stopped at its token
budget (rollout.max_tokens or env.max_tokens_per_turn), as a single-turn response cut at max_tokens is. Its reward
is the turns' rewards combined per `env.reward`; `turn_rewards` keeps each turn's reward with the index of the
turn's last token, for the token-level estimators. Text the tokenizer can only write as its unk token (in
reset's first prompt or an observation) is counted (env/unknown_chars, observations) and warned about once per
run, naming the environment and the characters. `lockstep=True` is the baseline the benchmark compares
with: every trajectory's turn waits for the whole batch's generation, and every step for the slowest step.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from relayrl.data.chat import ChatCodec, Delta
from relayrl.envs.base import RawText, Step, observation_messages
from relayrl.envs.pool import KILLED
from relayrl.envs.tools import ToolTurn
from relayrl.errors import EnvError
from relayrl.sources.trajectory import (
    MultiTurnBatch,
    SampledTurn,
    Segment,
    Trajectory,
    UnknownCharacters,
    combine_rewards,
    driver_metrics,
    insert_forks,
    judge_step,
    turn_ends,
)
from relayrl.sources.trajectory_images import expanded, read_images, with_images
from relayrl.sources.turn_requests import TurnOutput
from relayrl.types import Prompt, Rollout, Sampling

GATHER_S = 0.02  # an environment answer later than this after the previous one waits for the next engine call
HeldAction = tuple[Trajectory, str | ToolTurn, SampledTurn]  # a turn's action (its text, or env.tools' parsed turn)


@dataclass
class EnvTools:
    """env.tools for a driver: the OpenAI schemas the chat template renders, and the parser (vLLM's, for the
    model's family: relayrl/rollout/tool_calls.py TurnParser) that reads each sampled turn's calls."""

    schemas: list[dict[str, Any]]
    parser: Any


class MultiTurnDriver:
    """Runs `n` trajectories per prompt through `turns` (an engine adapter) and `pool` (environment workers)."""

    def __init__(
        self,
        turns,
        pool,
        codec: ChatCodec,
        env,
        sampling: Sampling,
        lockstep: bool = False,
        unknown: UnknownCharacters | None = None,
        context: int | None = None,
        tools: EnvTools | None = None,
    ):
        self.turns, self.pool, self.codec, self.env = turns, pool, codec, env
        self.tools = tools  # env.tools: the schemas every first prompt renders, the parser reading each turn
        self.unknown = unknown or UnknownCharacters()  # the source passes its own: one warning per run
        self.sampling = sampling
        self.per_turn = env.max_tokens_per_turn or sampling.max_tokens
        self.lockstep = lockstep
        self.context = context  # the engines' max_model_len: a turn's prompt plus its budget stays within it
        self.stop = tuple(sampling.stop)  # and the environment's own (its `stop` attribute), from reset on
        self.keys = itertools.count()

    def run(self, prompts: list[Prompt], n: int) -> MultiTurnBatch:
        waiting = deque(Trajectory(p, i, next(self.keys)) for p in prompts for i in range(n))
        order = list(waiting)
        self.live: dict[int, Trajectory] = {}
        self.held_turns: list[Trajectory] = []  # lockstep only: turns waiting for every step to return
        self.held_actions: list[HeldAction] = []  # lockstep only: steps waiting for the engine
        self.stats = {"mismatch": 0, "forks": 0, "unknown_chars": 0, "env_wait_s": 0.0}
        self.model_errors: dict[int, tuple[str, str]] = {}  # trajectory key -> the agent's exception (kind, message)
        try:
            while waiting or self.live:
                while waiting and self.pool.free:
                    self._start(waiting.popleft())
                self._release_held()
                idle = not self.turns.pending
                started = time.monotonic()
                for key, status, payload in self.pool.poll(1.0 if idle else 0.0):
                    self._on_env(self.live[key], status, payload)
                if idle:
                    self.stats["env_wait_s"] += time.monotonic() - started
                if self.turns.pending and self.turns.one_call_per_step:
                    self._gather()
                if self.turns.pending:
                    for key, output in self.turns.step():
                        self._on_turn(self.live[key], output)
        finally:  # normally nothing is left; after an error, what is in flight is dropped
            self.turns.abort()
            for key in list(self.live):
                self.pool.release(key)
        judge_step(order, self.model_errors, self._spec())
        return self._batch(order)

    def _gather(self) -> None:
        """An engine that runs one call per step (HF generate, a Ray replica) serves only the turns queued
        when it is called: let the environment answers that are on their way join that call, rather than
        spend a call on each. Waits while answers keep arriving (GATHER_S apart) and steps are out."""
        while self.pool.busy:
            results = self.pool.poll(GATHER_S)
            if not results:
                return
            for key, status, payload in results:
                self._on_env(self.live[key], status, payload)

    # ---- events ----------------------------------------------------------------------------------------
    def _start(self, trajectory: Trajectory) -> None:
        self.live[trajectory.key] = trajectory
        row = dict(trajectory.prompt.columns)
        row.update(
            {"messages": trajectory.prompt.messages}
            if trajectory.prompt.messages
            else {"prompt": trajectory.prompt.text}
        )
        self.pool.reset(trajectory.key, row, trajectory.where())

    def _on_env(self, trajectory: Trajectory, status: str, payload: Any) -> None:
        if status != "ok":
            return self._fail(trajectory, status, payload)
        if trajectory.first is None:  # reset's answer: the first observation, and the environment's stop strings
            messages, stop, *offered = payload  # an agent's first call also offers its tools
            schemas = offered[0] if offered else (self.tools.schemas if self.tools else None)
            self._begin(trajectory, messages, schemas)
            trajectory.base = len(trajectory.prompt_ids())
            self.stop = tuple(self.sampling.stop) + tuple(stop)
            return self._submit(trajectory)
        step: Step = payload
        trajectory.rewards.append(step.reward)
        trajectory.tool_calls += int(step.info.get("tool_calls", 0))
        trajectory.tool_errors += int(step.info.get("tool_errors", 0))
        trajectory.success = bool(step.info.get("success", trajectory.success))
        if step.done or trajectory.turns >= self.env.max_turns:
            return self._finish(trajectory)
        assert step.observation is not None  # as_step allows None only with done=True
        observed = step.observation
        observed = observed if isinstance(observed, RawText) else observation_messages(observed)
        if step.info.get("rebuilt"):  # an agent's call that does not extend its earlier ones
            return self._restart(trajectory, observed, step.info.get("tools"))
        self._observe(trajectory, observed)

    def _begin(self, trajectory: Trajectory, messages: list[dict[str, Any]] | RawText, tools: list | None) -> None:
        """The sample's first prompt, rendered from `messages` (with the tools an agent offers), or an agent's
        completions prompt as it is (its ids, or its text tokenised with the tokenizer's special tokens, as
        vLLM's completions server does)."""
        if isinstance(messages, RawText):
            ids = messages.ids if messages.ids is not None else self.codec.tokenizer(messages.text)["input_ids"]
            text, messages = (messages.text if messages.ids is None else self.codec.tokenizer.decode(ids)), []
            self._check_known(trajectory, ids, text)
            images, engine_ids = [], None
        else:  # image parts become placeholders; the row's images fill reset's bare ones
            messages, images = read_images(messages, trajectory.where(), trajectory.prompt.images)
            text, ids = self.codec.first_prompt(messages, tools)
            self._check_known(trajectory, ids, "".join(m["content"] for m in messages))
            engine_ids = None
            if images:
                ids, engine_ids = expanded(
                    self.codec.tokenizer, text, images, not self.codec.templated, trajectory.where()
                )
        p = trajectory.prompt
        trajectory.first = Prompt(
            id=p.id,
            text=text,
            token_ids=ids,
            columns=p.columns,
            messages=messages or None,
            images=images or None,
            engine_token_ids=engine_ids,
        )
        trajectory.history, trajectory.tools, trajectory.segments = list(messages), tools, []

    def _restart(self, trajectory: Trajectory, messages: list[dict[str, Any]] | RawText, tools: list | None) -> None:
        """An agent's call that rewrote its earlier messages (or tools): its tokens cannot continue the sample's.
        env.tito=fork (the default) keeps the sample so far and starts a new one from this call; retokenize starts
        the new one and drops the old (its turns are now prompt); strict stops, naming the call."""
        if self.env.tito == "strict":
            raise EnvError(
                f"{trajectory.where()}: the agent's call does not extend its earlier calls (it changed or dropped "
                "earlier messages, or its tools), so the trajectory's tokens cannot continue unchanged; set "
                "env.tito=fork (a new sample from this call) or env.tito=retokenize"
            )
        self.stats["mismatch"] += 1
        if self.env.tito == "fork" and trajectory.segments:
            self.stats["forks"] += 1
            trajectory.forks.append(self._rollout(trajectory))
        trajectory.earlier_turns = trajectory.turns  # the new sample's first turn is the trajectory's next
        spent = trajectory.spent
        self._begin(trajectory, messages, tools)
        trajectory.base = len(trajectory.prompt_ids()) - spent  # the budget goes on from where it was
        self._submit(trajectory)

    def _on_turn(self, trajectory: Trajectory, output: TurnOutput) -> None:
        output = self._cut_at_stop(output)
        turn = SampledTurn(trajectory.prompt_ids(), output)
        trajectory.segments.append(Segment(output.token_ids, True, output.logprobs, output.versions))
        trajectory.turns += 1
        trajectory.last_turn_cut = output.finish_reason == "length"
        action = self.codec.action_text(output.token_ids)
        if self.tools is not None:  # env.tools: the worker runs the calls the parser reads (relayrl/envs/tools.py)
            parsed = self.tools.parser.parse_sampled(output.token_ids, output.finish_reason, trajectory.tools, "policy")
            calls = {"tool_calls": parsed.tool_calls} if parsed.tool_calls else {}
            trajectory.history.append({"role": "assistant", "content": parsed.content or "", **calls})
            unread = 0 if parsed.tool_calls else parsed.tool_errors  # a call to an unknown tool: the worker counts it
            action = ToolTurn(parsed.content or "", parsed.tool_calls, unread)
        else:
            trajectory.history.append({"role": "assistant", "content": action})
        if output.finish_reason == "length" and trajectory.spent >= self.env.max_total_tokens:
            trajectory.truncated = True
            return self._finish(trajectory)
        if self.lockstep:
            self.held_actions.append((trajectory, action, turn))
        else:
            self.pool.step(trajectory.key, action, trajectory.where(), turn)

    def _cut_at_stop(self, output: TurnOutput) -> TurnOutput:
        """The turn up to the token that completes a stop string (an engine that generated past it: HF generate
        cannot match stop strings on every tokenizer, so batches are generated without them). Sampling is left
        to right, so the cut turn is what stopping there would have sampled."""
        ids = output.token_ids
        if not self.stop or not any(s in self.codec.action_text(ids) for s in self.stop):
            return output
        low, high = 1, len(ids)  # the shortest prefix whose text holds a stop string
        while low < high:
            middle = (low + high) // 2
            if any(s in self.codec.action_text(ids[:middle]) for s in self.stop):
                high = middle
            else:
                low = middle + 1
        if low == len(ids) and output.finish_reason == "stop":
            return output
        return TurnOutput(ids[:low], output.logprobs[:low], output.versions[:low], "stop")

    def _observe(self, trajectory: Trajectory, messages: list[dict[str, Any]] | RawText) -> None:
        if isinstance(messages, RawText):  # a completions call's new text (or ids) after the sampled tokens
            ids = messages.ids if messages.ids is not None else self.codec.encode(messages.text)
            delta = Delta(ids, True)
            self._check_known(trajectory, ids, messages.text)
            images = []
        else:
            generated = trajectory.segments[-1].token_ids
            messages, images = read_images(messages, trajectory.where())
            delta = self.codec.observation(trajectory.history, generated, messages, trajectory.tools)
            self._check_known(trajectory, delta.token_ids, "".join(m["content"] for m in messages))
            trajectory.history.extend(messages)
        if not delta.prefix_ok:
            self.stats["mismatch"] += 1
            if not self._rerender(trajectory, delta.full_text, bool(images)):
                return
        else:
            version = trajectory.segments[-1].versions[-1] if trajectory.segments[-1].versions else 0
            ids, engine_ids = delta.token_ids, None
            if images:  # the learner's ids expand each image; vLLM gets one placeholder per image and expands it
                ids, engine_ids = expanded(self.codec.tokenizer, delta.text, images, False, trajectory.where())
            segment = Segment(ids, False, [0.0] * len(ids), [version] * len(ids), images, engine_ids)
            trajectory.segments.append(segment)
        overflow = trajectory.spent - self.env.max_total_tokens
        if self.context is not None:  # nor past the engines' context (an agent's long prompt)
            overflow = max(overflow, len(trajectory.prompt_ids()) - self.context)
        if overflow >= 0:  # no room left for another turn: cut the observation, keep the trajectory, flag it
            last = trajectory.segments[-1]
            keep = 0 if last.images else len(last.token_ids) - overflow  # an image's tokens are never cut apart
            trajectory.segments[-1] = Segment(last.token_ids[:keep], False, last.logprobs[:keep], last.versions[:keep])
            trajectory.truncated = True
            return self._finish(trajectory)
        self._submit(trajectory)

    def _rerender(self, trajectory: Trajectory, full_text: str, shows_images: bool) -> bool:
        """The template changed earlier tokens: env.tito decides. False when the trajectory has ended."""
        if shows_images or trajectory.images():
            raise EnvError(
                f"{trajectory.where()}: the chat template renders the earlier turns differently once this "
                "observation is added, and a trajectory with images cannot be re-rendered (its image tokens come "
                "from the processor, not from the text); use a chat template that keeps earlier turns as they were"
            )
        if self.env.tito == "strict":
            raise EnvError(
                f"{trajectory.where()}: the chat template renders the earlier turns differently once this "
                "observation is added (it rewrites or drops earlier content), so the trajectory's tokens cannot "
                "continue unchanged; set env.tito=fork (a new sample from here) or env.tito=retokenize"
            )
        ids = self.codec.encode(full_text)
        assert trajectory.first is not None  # an observation comes after reset's answer
        first = trajectory.first.token_ids
        if ids[: len(first)] != first:
            raise EnvError(
                f"{trajectory.where()}: env.tito={self.env.tito}: the re-rendered history does not start with the "
                "first prompt's tokens; the chat template rewrites the first prompt itself"
            )
        if self.env.tito == "fork":  # the sample so far is kept (trained once); a new one continues from here
            self.stats["forks"] += 1
            trajectory.forks.append(self._rollout(trajectory))
        trajectory.earlier_turns = trajectory.turns  # as in `_restart`: the re-rendered turns are not trained
        version = trajectory.segments[-1].versions[-1] if trajectory.segments[-1].versions else 0
        rest = ids[len(first) :]
        trajectory.segments = [Segment(rest, False, [0.0] * len(rest), [version] * len(rest))]
        return True

    def _submit(self, trajectory: Trajectory) -> None:
        budget = min(self.per_turn, self.env.max_total_tokens - trajectory.spent)
        if self.context is not None:
            budget = min(budget, self.context - len(trajectory.prompt_ids()))
        if budget <= 0 and not trajectory.segments:  # an agent's own prompt, too long to answer at all
            length = len(trajectory.prompt_ids())
            message = f"the call's prompt is {length} tokens, leaving no room in the engines' context of {self.context}"
            return self._fail(trajectory, "env_error", message)
        if budget <= 0:
            trajectory.truncated = True
            return self._finish(trajectory)
        if self.lockstep:
            self.held_turns.append(trajectory)
            return
        sampling = replace(self.sampling, n=1, max_tokens=budget, stop=self.stop)
        shown = with_images(trajectory, self.codec.tokenizer)  # every image so far (None: a text-only trajectory)
        self.turns.submit(trajectory.key, trajectory.prompt_ids(), sampling, shown)

    def _release_held(self) -> None:
        """Lockstep: every step waits until the engine has finished every turn, every turn until every step
        has returned."""
        if self.held_actions and not self.turns.pending:
            for trajectory, action, turn in self.held_actions:
                self.pool.step(trajectory.key, action, trajectory.where(), turn)
            self.held_actions = []
        if self.held_turns and not self.pool.busy and not self.held_actions:
            held, self.held_turns = self.held_turns, []
            self.lockstep = False
            for trajectory in held:
                self._submit(trajectory)
            self.lockstep = True

    def _check_known(self, trajectory: Trajectory, ids: list[int], text: str) -> None:
        """Count an observation the tokenizer writes with its unk token (the model never sees those characters)."""
        unk = self.codec.tokenizer.unk_token_id
        if unk is not None and unk in ids:
            self.stats["unknown_chars"] += 1
            self.unknown.warn(self.codec.tokenizer, text, f"{trajectory.where()}: {self._spec()}")

    def _spec(self) -> str:
        return f"env.agent={self.env.agent!r}" if self.env.agent else f"env.fn={self.env.env_class!r}"

    def _fail(self, trajectory: Trajectory, status: str, message: Any) -> None:
        """A trajectory that ended without a reward. Besides env.on_error's statuses, an agent's (relayrl/agents/
        pool.py): `broken` (a setup that cannot work: the run stops), `model_error` (an error over what the model
        wrote: scored 0, whatever env.on_error but skip says), `no_call` (no model call: no sample, env/no_call)."""
        if status == "broken":
            raise EnvError(f"{trajectory.where()}: {self._spec()}: {message}")
        if status == "no_call":
            trajectory.failed = "no_call"
            return self._finish(trajectory)
        if status == "model_error":
            self.model_errors[trajectory.key] = message
            status, message = "zero", message[1]
        elif self.env.on_error == "error" and status == KILLED:  # not the environment's failure: no on_error hint
            raise EnvError(
                f"{trajectory.where()}: {message}: a signal from outside the run ended the worker (the kernel's "
                "out-of-memory killer sends SIGKILL: check the environment's memory use)"
            )
        elif self.env.on_error == "error":
            raise EnvError(f"{trajectory.where()}: {message} (set env.on_error=zero or skip to go on without it)")
        trajectory.failed = "timeout" if status == "timeout" else "error"
        trajectory.rewards = [0.0]
        self._finish(trajectory)

    def _finish(self, trajectory: Trajectory) -> None:
        self.pool.release(trajectory.key)
        del self.live[trajectory.key]

    # ---- output ----------------------------------------------------------------------------------------
    def _rollout(self, trajectory: Trajectory, group_index: int | None = None) -> Rollout:
        segments = trajectory.segments
        ids = [t for s in segments for t in s.token_ids]
        assert trajectory.first is not None  # only trajectories that were reset become rollouts
        prompt = trajectory.first
        if images := trajectory.images():  # the learner's forward reads every image of the trajectory, in order
            prompt = replace(prompt, images=images, image_inputs=trajectory.tensors(self.codec.tokenizer))
        return Rollout(
            prompt=prompt,
            group_index=trajectory.group_index if group_index is None else group_index,
            response_ids=ids,
            response_text=self.codec.action_text(ids),
            behaviour_logprobs=[lp for s in segments for lp in s.logprobs],
            finish_reason="length" if trajectory.truncated or trajectory.last_turn_cut else "stop",
            versions=[v for s in segments for v in s.versions],
            loss_mask=[int(s.trained) for s in segments for _ in s.token_ids],
            turn_rewards=None
            if trajectory.failed
            else turn_ends(segments, trajectory.rewards[trajectory.earlier_turns :]),
        )

    def _batch(self, order: list[Trajectory]) -> MultiTurnBatch:
        rollouts, rewards, forks = [], [], []
        kept = [
            t
            for t in order
            if t.first is not None
            and not (t.failed and self.env.on_error == "skip")
            and not (t.truncated and self.env.on_overflow == "drop")
        ]
        members: dict[int, int] = {}  # group -> members kept so far: a group still starts at group_index 0
        for trajectory in kept:
            reward = combine_rewards(trajectory.rewards, self.env.reward, self.env.gamma)
            group = id(trajectory.prompt)
            members[group] = members.get(group, -1) + 1
            rollouts.append(self._rollout(trajectory, members[group]))
            rewards.append(reward)
            forks += [(rollouts[-1], fork, reward) for fork in trajectory.forks]
        insert_forks(rollouts, rewards, forks)
        return MultiTurnBatch(rollouts, rewards, driver_metrics(order, rollouts, self.stats))
