"""The rollout-engine seams: an `Engine` generates rollouts and takes new weights; an `EngineGroup` (what the
rest of the run holds) spreads that over replicas. `engine_from_config` is the one way an engine is built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, Sequence

import torch

from relayrl.types import Prompt, Rollout


@dataclass(frozen=True)
class Sampling:
    """How to sample. temperature == 0 means greedy decoding."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 64
    min_tokens: int = 0  # EOS and stop strings are ignored before this many tokens
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int | None = None
    request_offset: int = 0  # index of the first prompt within the step's batch (a replica's share of it)

    @classmethod
    def greedy(cls, max_tokens: int, stop: Iterable[str] = (), min_tokens: int = 0) -> "Sampling":
        return cls(n=1, temperature=0.0, max_tokens=max_tokens, min_tokens=min_tokens, stop=tuple(stop))


@dataclass
class PartialSample:
    """One response being generated in pieces (partial rollouts): the tokens so far, the log-prob and the
    policy version of each, and how it ended (None while unfinished)."""

    prompt: Prompt
    group: int  # which group (prompt draw) it belongs to
    group_index: int
    seed: int | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def to_rollout(self) -> Rollout:
        return Rollout(
            prompt=self.prompt,
            group_index=self.group_index,
            response_ids=list(self.token_ids),
            response_text=self.text,
            behaviour_logprobs=list(self.logprobs),
            finish_reason=self.finish_reason or "length",
            versions=list(self.versions),
        )


class Engine(Protocol):
    """One inference engine in this process (vLLM, HF generate): what an engine group drives on each replica."""

    version: int  # the policy version of the weights it holds

    def generate(self, prompts: list[Prompt], sampling: Sampling, version: int) -> list[Rollout]:
        """`sampling.n` rollouts per prompt, prompt-major, with behaviour log-probs of the sampling pass."""

    def generate_until(
        self, samples: list[PartialSample], sampling: Sampling, groups_needed: int
    ) -> list[PartialSample]:
        """Partial rollouts: continue `samples` until `groups_needed` groups have finished (the async schedule)."""

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Replace the policy weights (checkpoint names) and drop any cache computed with the old ones."""

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """Teacher-forced log-probs of tokens 1..N-1 at temperature 1 (the sync's parity probe)."""


class EngineGroup(Protocol):
    """What the controller, the schedules and the sync hold: the run's engine replicas (a local engine is a
    one-replica group, relayrl/rollout/local_group.py; Ray actors are relayrl/placement/engines.py)."""

    replicas: Sequence[Any]  # one handle per replica, each with the `Engine` methods
    # the in-process engine whose own request/step loop takes a new request between two steps (vLLM's), so a
    # multi-turn trajectory's next turn joins the running batch (relayrl/envs/requests.py); None: turns go in
    # batches through `generate` (HF generate, Ray replicas)
    request_loop: Engine | None

    def generate(self, prompts: list[Prompt], sampling: Sampling, version: int) -> list[Rollout]:
        """`submit` to every replica, then `finish`: the rollouts in prompt order."""

    def submit(self, prompts: list[Prompt], sampling: Sampling, version: int, replicas: list[int] | None = None) -> Any:
        """Start generating (the prompts split across `replicas`, default all); `finish` collects."""

    def finish(self, pending: Any) -> list[Rollout]:
        """The rollouts of a `submit`, in prompt order."""

    def generate_until(
        self, replica: int, samples: list[PartialSample], sampling: Sampling, groups_needed: int
    ) -> list[PartialSample]:
        """`Engine.generate_until` on one replica."""

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """`Engine.prompt_logprobs` on the first replica."""

    def take_spans(self) -> list[tuple[int, float, float]]:
        """(replica, start, end) of the generate calls since the last take, for the timeline."""

    def metrics(self) -> dict[str, float]:
        """The group's own metrics (restarts), added to every step's."""


def engine_from_config(config, max_model_len: int, cores: str | None = None) -> Engine:
    """The run's rollout engine, from `config.rollout` (plus `model.path` and `train.seed`): the one construction
    path, used in the driver (`placement.mode=local`) and in every Ray engine actor, so no `rollout.*` setting
    can reach one and not the other. `cores`: the CPU cores a Ray actor was given (vLLM pins its threads)."""
    from relayrl.sync.lora import adapter_spec

    r = config.rollout
    return build_engine(
        r.engine,
        config.model.path,
        max_model_len,
        config.train.seed,
        kv_cache_gib=r.kv_cache_gib,
        gpu_memory_utilization=r.gpu_memory_utilization,
        prefix_caching=r.prefix_caching,
        cores=cores,
        adapter=adapter_spec(config),  # sync.lora=adapter: the engine serves LoRA adapters (relayrl/sync/lora.py)
        tensor_parallel=r.tensor_parallel,
    )


def build_engine(
    kind: str,
    model_path: str,
    max_model_len: int,
    seed: int,
    kv_cache_gib: float = 1.0,
    gpu_memory_utilization: float = 0.5,
    prefix_caching: str = "auto",
    cores: str | None = None,
    adapter=None,
    tensor_parallel: int = 1,
) -> Engine:
    if kind == "vllm":
        from relayrl.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(
            model_path,
            max_model_len,
            seed,
            kv_cache_gib,
            gpu_memory_utilization,
            prefix_caching,
            cores,
            adapter,
            tensor_parallel=tensor_parallel,
        )
    if kind == "hf":
        from relayrl.rollout.hf_engine import HFEngine

        return HFEngine(model_path)
    raise ValueError(f"unknown rollout engine {kind!r}")
