"""Turn requests: submit one trajectory's next turn to the engine and collect turns as they finish.

The multi-turn driver (relayrl/sources/trajectories.py) needs to add a request whenever a trajectory's
environment step returns, not once per batch. Two adapters give it `submit(key, prompt_ids, sampling)`
and `step() -> finished turns`:

- `VLLMTurns`: vLLM's own request/step loop (`LLMEngine.add_request` / `step`, as `VLLMEngine.generate_until`
  uses it for partial rollouts). vLLM 0.32's offline `LLM` has no public per-request async API; its engine
  core's add/step is the continuous-batching loop the server runs: a request added between two steps joins
  the running batch at the next step. This is the honest way to interleave in-process.
- `BatchTurns`: any engine with `generate(prompts, sampling, version)` (HF generate, a Ray engine group):
  each `step` generates every turn queued since the last one, as one batch. Environment steps still run
  while the batch generates (they are in worker processes); a turn waits at most one batch. Stop strings
  are left to the driver, which cuts a turn where one is completed (relayrl/sources/trajectories.py).

`turn_requests` picks one by what the engine group declares (`EngineGroup.request_loop`, relayrl/rollout/protocols.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from relayrl.rollout.seeds import turn_seed
from relayrl.types import Prompt, Sampling

if TYPE_CHECKING:
    from relayrl.rollout.protocols import EngineGroup


@dataclass
class TurnOutput:
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str  # "stop" or "length"


def turn_requests(engines: EngineGroup, version: int = 0, replicas: list[int] | None = None):
    """The adapter for an engine group (a single engine comes wrapped in `LocalEngineGroup`): vLLM's request loop
    when the group declares one (`EngineGroup.request_loop`: one in-process vLLM engine), else batches of `generate` on
    `replicas` (default all; HF generate, Ray replicas, which tag each token with the version they hold when
    they run it, so a trajectory that spans a weight push records both). `version` tags the tokens of a local
    engine that does not track its own."""
    if engines.request_loop is not None:
        return VLLMTurns(engines.request_loop)
    return BatchTurns(engines, version, replicas)


class TurnSeeds:
    """The seed of each turn submitted, keyed by trajectory and turn (relayrl/rollout/seeds.py `turn_seed`), not
    by the order turns arrive in, which follows the environments' timing. The driver's keys are trajectory
    numbers; any other key is numbered in the order it is first seen."""

    def __init__(self):
        self._turns: dict[Hashable, int] = {}  # turns submitted per trajectory key
        self._numbers: dict[Hashable, int] = {}

    def next(self, key: Hashable, sampling: Sampling) -> int | None:
        turn = self._turns[key] = self._turns.get(key, -1) + 1
        trajectory = key if isinstance(key, int) else self._numbers.setdefault(key, len(self._numbers))
        return turn_seed(sampling.seed, trajectory, turn)


class VLLMTurns:
    one_call_per_step = False  # a turn joins the running batch whenever it is submitted

    def __init__(self, engine):
        self.engine = engine
        self._core = engine.llm.llm_engine
        self._live: dict[str, Hashable] = {}
        self._ids = itertools.count()
        self._seeds = TurnSeeds()
        self._shown: dict[str, Prompt] = {}  # the requests with images: vLLM's expansion is checked

    @property
    def pending(self) -> int:
        return len(self._live)

    def submit(self, key: Hashable, prompt_ids: list[int], sampling: Sampling, shown: Prompt | None = None) -> None:
        """`shown`: a prompt with images (`prompt_ids` expanded; relayrl/sources/trajectory_images.py)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from relayrl.rollout.vllm_engine import engine_request

        number = next(self._ids)
        seed = self._seeds.next(key, sampling)
        params = SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            max_tokens=sampling.max_tokens,
            stop=list(sampling.stop) or None,
            logprobs=0,
            output_kind=RequestOutputKind.FINAL_ONLY,
            seed=seed,
            logit_bias=self.engine.never_sampled,  # a vision-language model's image tokens, as its generate
        )
        request_id = f"turn{number}"
        # under sync.lora=adapter the newest pushed adapter, as the engine's own generate uses
        adapter = self.engine._adapter()
        request = engine_request(shown) if shown is not None else {"prompt_token_ids": list(prompt_ids)}
        self._core.add_request(request_id, request, params, lora_request=adapter)
        self._live[request_id] = key
        if shown is not None:
            self._shown[request_id] = shown

    def step(self) -> list[tuple[Hashable, TurnOutput]]:
        from relayrl.rollout.vllm_engine import check_expansion

        finished = []
        for out in self._core.step():
            if not out.finished or out.request_id not in self._live:
                continue
            if (shown := self._shown.pop(out.request_id, None)) is not None:
                check_expansion(shown, out.prompt_token_ids)
            completion = out.outputs[0]
            tokens = list(completion.token_ids)
            logprobs: list[float] = [step[t].logprob for step, t in zip(completion.logprobs or (), tokens)]
            if len(logprobs) != len(tokens):
                raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(tokens)} tokens of a turn")
            output = TurnOutput(
                tokens, logprobs, [self.engine.version] * len(tokens), completion.finish_reason or "length"
            )
            finished.append((self._live.pop(out.request_id), output))
        return finished

    def abort(self) -> None:
        if self._live:
            self._core.abort_request(list(self._live))
            self._live.clear()
            self._shown.clear()


class BatchTurns:
    one_call_per_step = True  # a turn waits for the next `step`: the driver gathers turns for it

    def __init__(self, engines: EngineGroup, version: int = 0, replicas: list[int] | None = None):
        self.engine, self.version, self.replicas = engines, version, replicas
        self._queued: list[tuple[Hashable, Prompt, Sampling]] = []
        self._seeds = TurnSeeds()

    @property
    def pending(self) -> int:
        return len(self._queued)

    def submit(self, key: Hashable, prompt_ids: list[int], sampling: Sampling, shown: Prompt | None = None) -> None:
        """`shown`: a prompt with images (`prompt_ids` expanded; relayrl/sources/trajectory_images.py)."""
        prompt = shown if shown is not None else Prompt(id="", text="", token_ids=list(prompt_ids))
        self._queued.append((key, prompt, replace(sampling, seeds=(self._seeds.next(key, sampling),))))

    def step(self) -> list[tuple[Hashable, TurnOutput]]:
        """Generate every queued turn in one call, to the longest budget; each is cut to its own budget after
        (the same tokens as stopping there: sampling is left to right)."""
        queued, self._queued = self._queued, []
        with_images = [q for q in queued if q[1].images]  # an engine's batch takes one kind at a time
        if with_images and len(with_images) < len(queued):
            return self._generate([q for q in queued if not q[1].images]) + self._generate(with_images)
        return self._generate(queued)

    def _generate(self, queued: list[tuple[Hashable, Prompt, Sampling]]) -> list[tuple[Hashable, TurnOutput]]:
        if not queued:
            return []
        longest = max(s.max_tokens for _, _, s in queued)
        # stop strings are matched by the driver (HF generate's matcher fails on some tokenizers)
        # each turn with its own seed (by trajectory and turn): what it draws does not depend on the turns beside it
        seeds = tuple(s.seeds[0] for _, _, s in queued if s.seeds)
        sampling = replace(queued[0][2], n=1, max_tokens=longest, stop=(), seeds=seeds)
        prompts = [replace(prompt, id=str(i)) for i, (_, prompt, _) in enumerate(queued)]
        if self.replicas is None:  # every replica: the group splits the call
            rollouts = self.engine.generate(prompts, sampling, self.version)
        else:  # an async producer's own replica
            rollouts = self.engine.finish(self.engine.submit(prompts, sampling, self.version, self.replicas))
        finished = []
        for (key, _, own), rollout in zip(queued, rollouts):
            cut = own.max_tokens
            ids = rollout.response_ids[:cut]
            finish = "length" if len(rollout.response_ids) > cut else rollout.finish_reason
            finished.append((key, TurnOutput(ids, rollout.behaviour_logprobs[:cut], rollout.versions[:cut], finish)))
        return finished

    def abort(self) -> None:
        self._queued.clear()
