"""A local engine as a one-replica `EngineGroup`, so the controller, the schedules and the sync hold the same kind
of object whatever the placement.

The engine runs in the calling thread: `submit` generates at once (nothing overlaps in one process) and
`finish` hands the result back. No spans are recorded: the controller's own `generate` phase is the engine's
time on the timeline. `request_loop` is the engine itself when it is vLLM (multi-turn turns then join its
running batch). Nothing here restarts: an engine in the driver that fails ends the run with its error.
"""

from __future__ import annotations

import sys

from relayrl.rollout.protocols import Engine
from relayrl.types import PartialSample, Prompt, Rollout, Sampling


class LocalEngineGroup:
    def __init__(self, engine: Engine, start_s: float = 0.0):
        """`start_s`: how long the engine took to start (reported as `time/engine_start`)."""
        self.engine, self.start_s = engine, start_s
        self.replicas: list[Engine] = [engine]
        self.request_loop = engine if is_vllm(engine) else None

    def generate(self, prompts: list[Prompt], sampling: Sampling, version: int) -> list[Rollout]:
        return self.engine.generate(prompts, sampling, version)

    def submit(
        self, prompts: list[Prompt], sampling: Sampling, version: int, replicas: list[int] | None = None
    ) -> list[Rollout]:
        if replicas not in (None, [0]):
            raise ValueError(f"a local engine is replica 0 only, not {replicas}")
        return self.generate(prompts, sampling, version)

    def finish(self, pending: list[Rollout]) -> list[Rollout]:
        return pending

    def generate_until(
        self, replica: int, samples: list[PartialSample], sampling: Sampling, groups_needed: int
    ) -> list[PartialSample]:
        return self.engine.generate_until(samples, sampling, groups_needed)

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        return self.engine.prompt_logprobs(token_ids)

    def sleep(self, level: int) -> None:
        self.engine.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.engine.wake_up(tags)

    def take_spans(self) -> list[tuple[int, float, float]]:
        return []

    def metrics(self) -> dict[str, float]:
        return {"time/engine_start": self.start_s}


def is_vllm(engine: Engine) -> bool:
    """Whether `engine` is relayrl's in-process vLLM engine. Its module is imported wherever one was built, so
    looking it up never imports vLLM."""
    module = sys.modules.get("relayrl.rollout.vllm_engine")
    return module is not None and isinstance(engine, module.VLLMEngine)
