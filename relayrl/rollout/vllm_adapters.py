"""The LoRA adapters a vLLM engine serves (`sync.lora=adapter`, relayrl/rollout/vllm_engine.py): each pushed adapter
written to a per-version directory (tmpfs) and registered under a name and id never used before; a request keeps the
adapter it started on to its end while newer ones load; the newest `keep` stay loaded and older ones are removed. At
start every adapter key is mapped onto the engine's LoRA modules and a random non-zero adapter must change the
engine's log-probs, so an adapter the engine ignores stops the run.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections import deque
from collections.abc import Iterable
from pathlib import Path

import torch

from relayrl.errors import SyncError
from relayrl.models.adapter_sync import AdapterSpec, map_adapter_keys
from relayrl.rollout.vllm_tp import LoraView

# vLLM 0.32's accepted `max_lora_rank` values (vllm/config/lora.py)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class EngineAdapters:
    """The LoRA adapters an engine holds: one per pushed version, each under a name and id never used before."""

    def __init__(self, llm, spec: AdapterSpec):
        self.llm, self.spec = llm, spec
        shm = Path("/dev/shm")
        self.root = Path(tempfile.mkdtemp(prefix="relayrl-lora-", dir=shm if shm.is_dir() else None))
        weakref.finalize(self, shutil.rmtree, str(self.root), True)
        self.next_id, self.loaded, self.current = 1, deque(), None

    @staticmethod
    def engine_args(spec: AdapterSpec) -> dict:
        rank = next((r for r in LORA_RANKS if r >= spec.rank), None)
        if rank is None:
            raise ValueError(f"model.lora.rank={spec.rank}: vLLM serves adapters up to rank {LORA_RANKS[-1]}")
        return {"enable_lora": True, "max_lora_rank": rank, "max_loras": spec.keep, "max_cpu_loras": spec.keep}

    def request(self, tensors: dict[str, torch.Tensor], version: int):
        """Write `tensors` as a peft adapter directory and name it: a fresh name, id and path per call."""
        from vllm.lora.request import LoRARequest

        from relayrl.models.lora import write_adapter_dir

        adapter_id, self.next_id = self.next_id, self.next_id + 1
        name = f"relayrl-v{version}-{adapter_id}"
        path = write_adapter_dir(self.root / name, self.spec.config, tensors)
        return LoRARequest(name, adapter_id, str(path))

    def register(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        tensors = dict(named_tensors)
        if tensors.keys() != self.spec.shapes.keys():
            odd = sorted(tensors.keys() ^ self.spec.shapes.keys())
            raise SyncError(
                f"policy version {version}: the pushed adapter's tensors differ from the engine's ({odd[:3]})"
            )
        request = self.request(tensors, version)
        self.llm.llm_engine.add_lora(request)  # loaded now, not by the first request that needs it
        self.loaded.append(request)
        self.current = request
        while len(self.loaded) > self.spec.keep:
            self.remove(self.loaded.popleft())

    def remove(self, request) -> None:
        self.llm.llm_engine.remove_lora(request.lora_int_id)
        shutil.rmtree(request.lora_path, ignore_errors=True)

    def check(self, model, prompt_logprobs, max_model_len: int = 64) -> None:
        """Every adapter key lands on a LoRA module of the engine, and a random non-zero adapter changes the
        engine's log-probs (an adapter the engine silently ignores would otherwise serve the base model).
        `model`: the engine's model, or a T-rank engine's `LoraView` of it."""
        view = model if isinstance(model, LoraView) else LoraView.of(model)
        map_adapter_keys(self.spec.shapes, set(view.served), view.packed)
        generator = torch.Generator().manual_seed(0)
        noise = {k: torch.randn(shape, generator=generator) / shape[-1] ** 0.5 for k, shape in self.spec.shapes.items()}
        probe = self.request(noise, version=-1)
        token_ids = [i % view.vocab for i in range(3, 3 + min(16, max_model_len - 1))]
        gap = max(abs(a - b) for a, b in zip(prompt_logprobs(token_ids), prompt_logprobs(token_ids, probe)))
        self.remove(probe)
        if gap < 1e-4:
            raise SyncError(
                f"a non-zero LoRA adapter changed no log-prob of the engine (largest change {gap:.2e}): its "
                "tensors are not applied; check model.lora.target_modules against the engine's modules"
            )
