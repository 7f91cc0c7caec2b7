"""The rollout-engine seams: an `Engine` generates rollouts and takes new weights; an `EngineGroup` (what the
rest of the run holds) spreads that over replicas. The requests and partial samples they take are in
relayrl/types.py; `rollout.build.engine_from_settings` is the one way an engine is built."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import torch

from relayrl.types import PartialSample, Prompt, Rollout, Sampling


class Engine(Protocol):
    """One inference engine in this process (vLLM, HF generate): what an engine group drives on each replica."""

    version: int  # the policy version of the weights it holds

    def generate(self, prompts: list[Prompt], sampling: Sampling, version: int) -> list[Rollout]:
        """`sampling.n` rollouts per prompt, prompt-major, with behaviour log-probs of the sampling pass."""
        ...

    def generate_until(
        self, samples: list[PartialSample], sampling: Sampling, groups_needed: int
    ) -> list[PartialSample]:
        """Partial rollouts: continue `samples` until `groups_needed` groups have finished (the async schedule)."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Replace the policy weights (checkpoint names) and drop any cache computed with the old ones."""
        ...

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """Teacher-forced log-probs of tokens 1..N-1 at temperature 1 (the sync's parity probe)."""
        ...

    def sleep(self, level: int) -> None:
        """Free the device between phases (level 1: weights to CPU memory; 2: dropped, a push refills them)."""
        ...

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Back on the device: `["weights"]`, `["kv_cache"]`, or everything (None)."""
        ...


class WorkersReceive(Protocol):
    """An engine whose workers join the weight-sync group themselves and take each broadcast push (vLLM:
    relayrl/rollout/vllm_transfer.py), so the bytes never pass through the process that drives it."""

    tensor_parallel: int  # its workers: the group ranks it holds
    version: int

    def join_weight_group(self, member: Any) -> None: ...

    def open_weight_receivers(self, layout: Any, checksum: bool) -> None: ...

    def receive_broadcast(self, version: int, buckets: list[int] | None = None) -> None: ...


class EngineGroup(Protocol):
    """What the controller, the schedules and the sync hold: the run's engine replicas (a local engine is a
    one-replica group, relayrl/rollout/local_group.py; Ray actors are relayrl/placement/engines.py)."""

    # The two attributes are read-only properties here so that a group may declare narrower types (a list of
    # replicas; a request_loop that is always None).
    @property
    def replicas(self) -> Sequence[Any]:
        """One handle per replica, each with the `Engine` methods."""
        ...

    @property
    def request_loop(self) -> Engine | None:
        """The in-process engine whose own request/step loop takes a new request between two steps (vLLM's), so
        a multi-turn trajectory's next turn joins the running batch (relayrl/sources/turn_requests.py); None:
        turns go in batches through `generate` (HF generate, Ray replicas)."""
        ...

    def generate(self, prompts: list[Prompt], sampling: Sampling, version: int) -> list[Rollout]:
        """`submit` to every replica, then `finish`: the rollouts in prompt order."""
        ...

    def submit(self, prompts: list[Prompt], sampling: Sampling, version: int, replicas: list[int] | None = None) -> Any:
        """Start generating (the prompts split across `replicas`, default all); `finish` collects."""
        ...

    def finish(self, pending: Any) -> list[Rollout]:
        """The rollouts of a `submit`, in prompt order."""
        ...

    def generate_until(
        self, replica: int, samples: list[PartialSample], sampling: Sampling, groups_needed: int
    ) -> list[PartialSample]:
        """`Engine.generate_until` on one replica."""
        ...

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """`Engine.prompt_logprobs` on the first replica."""
        ...

    def sleep(self, level: int) -> None:
        """`Engine.sleep` on every replica."""
        ...

    def wake_up(self, tags: list[str] | None = None) -> None:
        """`Engine.wake_up` on every replica."""
        ...

    def take_spans(self) -> list[tuple[int, float, float]]:
        """(replica, start, end) of the generate calls since the last take, for the timeline."""
        ...

    def metrics(self) -> dict[str, float]:
        """The group's own metrics (restarts), added to every step's."""
        ...
