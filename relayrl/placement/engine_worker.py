"""A rollout engine as a Ray actor: vLLM in the actor's process, plus the receiving half of a transport.

The actor's OpenMP threads are pinned to the cores its bundle was given (`VLLM_CPU_OMP_THREADS_BIND`),
set before vLLM is imported; torch's intra-op threads are set explicitly, because Ray leaves actors at
one thread unless told otherwise.
"""

from __future__ import annotations

import os
import time

from relayrl.sync.buckets import Layout
from relayrl.sync.transports import Manifest, Receiver, join_group, make_receiver


class EngineWorker:
    def __init__(self, model_path: str, max_model_len: int, seed: int, kv_cache_gib: float, threads: int,
                 cores: str):
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cores
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import torch

        torch.set_num_threads(threads)
        from relayrl.rollout.vllm_engine import VLLMEngine

        self.engine = VLLMEngine(model_path, max_model_len, seed, kv_cache_gib)
        torch.set_num_threads(threads)
        self.receiver: Receiver | None = None
        self.sync_group = None

    def ping(self) -> int:
        return os.getpid()

    def generate(self, prompts, sampling, version):
        return self.engine.generate(prompts, sampling, version)

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        return self.engine.prompt_logprobs(token_ids)

    def join_sync_group(self, address: str, port: int, rank: int, world: int, timeout_s: float) -> None:
        self.sync_group = join_group(address, port, rank, world, timeout_s)

    def open_receiver(self, transport: str, layout: Layout, checksum: bool, timeout_s: float) -> None:
        self.receiver = make_receiver(transport, layout, checksum, self.sync_group, timeout_s)

    def receive_weights(self, manifest: Manifest) -> float:
        """Fetch, verify and load one push; returns the seconds it took on this side."""
        start = time.perf_counter()
        self.engine.load_weights(self.receiver.receive(manifest), manifest.version)
        return time.perf_counter() - start
