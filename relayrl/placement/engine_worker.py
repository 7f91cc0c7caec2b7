"""A rollout engine as a Ray actor: the run's engine (built from its `EngineSettings`, the `rollout` section and the model, by the same function as a
local run's) in the actor's process, plus the receiving half of a transport (`WeightSink`); with `broadcast` into
a vLLM engine the receiving half is the engine's own workers, and this actor opens and closes each session.

The engine is told the cores its bundle was given (it pins its threads to them); torch's intra-op threads
are set explicitly, because Ray leaves actors at one thread unless told otherwise. With
`rollout.tensor_parallel` T > 1 the engine's T rank processes are this actor's children, each pinned to its
share of those cores (relayrl/rollout/vllm_tp.py); they end when the actor does.
"""

from __future__ import annotations

import os
import time
from typing import cast

from relayrl.rollout.build import EngineSettings, engine_from_settings
from relayrl.rollout.protocols import WorkersReceive
from relayrl.sync.endpoints import WeightSink
from relayrl.sync.transports import WorkerMembership


class EngineWorker(WeightSink):
    in_workers = False  # set by open_receiver: the engine's workers receive each push (broadcast into vLLM)

    def __init__(self, settings: EngineSettings, max_model_len: int, threads: int, cores: str):
        import torch

        torch.set_num_threads(threads)
        start = time.perf_counter()
        self.engine = engine_from_settings(settings, max_model_len, cores=cores)
        self.start_s = time.perf_counter() - start
        torch.set_num_threads(threads)

    def ping(self) -> int:
        return os.getpid()

    def start_seconds(self) -> float:
        """How long the engine took to start (vLLM's load, profile and KV-cache allocation included)."""
        return self.start_s

    def sleep(self, level: int) -> None:
        self.engine.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.engine.wake_up(tags)

    def generate(self, prompts, sampling, version=None):
        """Tokens are tagged with the version this engine holds when it runs the call (calls and weight
        loads run in the order they were sent, so under async schedules that may be newer than the
        caller's view)."""
        return self.engine.generate(prompts, sampling, self.engine.version)

    def generate_timed(self, prompts, sampling, version=None):
        """`generate`, with the wall-clock start and end of the call in this actor (for the timeline)."""
        start = time.time()
        rollouts = self.generate(prompts, sampling)
        return rollouts, start, time.time()

    def generate_until(self, samples, sampling, groups_needed: int):
        return self.engine.generate_until(samples, sampling, groups_needed)

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        return self.engine.prompt_logprobs(token_ids)

    def load_weights(self, named_tensors, version: int) -> None:
        self.engine.load_weights(named_tensors, version)

    # `broadcast` into a vLLM engine: its workers are the group's members and receive every push themselves
    # (relayrl/rollout/vllm_transfer.py); this actor only opens and closes each weight-update session.

    def _workers_receive(self) -> WorkersReceive | None:
        return cast("WorkersReceive", self.engine) if getattr(self.engine, "receives_in_workers", False) else None

    def sync_ranks(self) -> int:
        engine = self._workers_receive()
        return engine.tensor_parallel if engine else 1

    def join_sync_group(self, address: str, port: int, rank: int, world: int, timeout_s: float) -> None:
        engine = self._workers_receive()
        if engine:
            engine.join_weight_group(WorkerMembership(address, port, rank, world, timeout_s))
        else:
            super().join_sync_group(address, port, rank, world, timeout_s)

    def open_receiver(self, transport: str, layout, checksum: bool, timeout_s: float) -> None:
        engine = self._workers_receive() if transport == "broadcast" else None
        self.in_workers = engine is not None
        if engine:
            engine.open_weight_receivers(layout, checksum)
        else:
            super().open_receiver(transport, layout, checksum, timeout_s)

    def receive_weights(self, manifest) -> float:
        if not self.in_workers:
            return super().receive_weights(manifest)
        start = time.perf_counter()
        cast("WorkersReceive", self.engine).receive_broadcast(manifest.version, manifest.buckets)
        return time.perf_counter() - start
