"""Building the run's rollout engine: `engine_from_config`, the one construction path, in the driver and in every
Ray engine actor alike. Imports an engine's module only for the engine asked for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relayrl.rollout.protocols import Engine


@dataclass(frozen=True)
class EngineDevice:
    """How the engine uses its device, decided where the engine is built (an engine actor may have a GPU its
    driver lacks): `rollout.dtype` and `rollout.enforce_eager` resolved, and whether it may sleep."""

    dtype: str  # "bfloat16", "float16", "float32"
    eager: bool
    sleep: bool  # rollout.sleep is a level: vLLM is built with its sleep mode on

    @classmethod
    def resolve(cls, dtype: str = "auto", enforce_eager: str = "auto", sleep: int | str = "off") -> EngineDevice:
        import torch

        gpu = torch.cuda.is_available()
        if dtype == "auto":
            dtype = ("bfloat16" if torch.cuda.is_bf16_supported() else "float16") if gpu else "float32"
        eager = not gpu if enforce_eager == "auto" else enforce_eager == "on"
        return cls(dtype, eager, sleep not in ("off", "auto"))


def engine_from_config(config, max_model_len: int, cores: str | None = None) -> Engine:
    """The run's rollout engine, from `config.rollout` (plus `model.path` and `train.seed`): the one construction
    path, used in the driver (`placement.mode=local`) and in every Ray engine actor, so no `rollout.*` setting
    can reach one and not the other. `cores`: the CPU cores a Ray actor was given (vLLM pins its threads)."""
    from relayrl.models.adapter_sync import adapter_spec

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
        adapter=adapter_spec(
            config
        ),  # sync.lora=adapter: the engine serves LoRA adapters (relayrl/models/adapter_sync.py)
        tensor_parallel=r.tensor_parallel,
        device=EngineDevice.resolve(r.dtype, r.enforce_eager, r.sleep),
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
    device: EngineDevice | None = None,
) -> Engine:
    """An engine of `kind`; `device` defaults to `EngineDevice.resolve()` (auto dtype and eager mode, no sleep)."""
    device = device or EngineDevice.resolve()
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
            device=device,
        )
    if kind == "hf":
        from relayrl.rollout.hf_engine import HFEngine

        return HFEngine(model_path, dtype=device.dtype)
    raise ValueError(f"unknown rollout engine {kind!r}")
