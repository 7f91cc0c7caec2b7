"""Building the run's rollout engine: `engine_from_settings`, the one construction path, in the driver and in every
Ray engine actor alike, from the `EngineSettings` its placement slices from the config. Imports an engine's module
only for the engine asked for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relayrl.config import ModelConfig, RolloutConfig
    from relayrl.models.adapter_sync import AdapterSpec
    from relayrl.rollout.protocols import Engine


@dataclass(frozen=True)
class EngineSettings:
    """What building the run's engine reads: the `rollout` section, the model (`model.path`, `model.lora`), the
    run's seed (`train.seed`), and how the LoRA adapter travels (`sync.lora`, and the versions an engine serving
    adapters keeps loaded: relayrl/models/adapter_sync.py)."""

    rollout: RolloutConfig
    model: ModelConfig
    seed: int
    lora_sync: str
    kept_versions: int

    def adapter(self) -> AdapterSpec | None:
        """`sync.lora=adapter`: what the engine serving LoRA adapters needs before the first push; else None."""
        from relayrl.models.adapter_sync import adapter_spec, lora_sync_mode

        mode = lora_sync_mode(self.model.lora, self.lora_sync, self.rollout.engine)
        return adapter_spec(self.model, mode, self.kept_versions)


@dataclass(frozen=True)
class EngineDevice:
    """How the engine uses its device, decided where the engine is built (an engine actor may have a GPU its
    driver lacks): `rollout.dtype` and `rollout.enforce_eager` resolved, whether it may sleep, and the model runner
    asked for."""

    dtype: str  # "bfloat16", "float16", "float32"
    eager: bool
    sleep: bool  # rollout.sleep is a level: vLLM is built with its sleep mode on
    model_runner: str = "auto"  # rollout.model_runner: vLLM's choice, or v1 / v2 asked for by name

    @classmethod
    def resolve(
        cls, dtype: str = "auto", enforce_eager: str = "auto", sleep: int | str = "off", model_runner: str = "auto"
    ) -> EngineDevice:
        import torch

        gpu = torch.cuda.is_available()
        if dtype == "auto":
            dtype = ("bfloat16" if torch.cuda.is_bf16_supported() else "float16") if gpu else "float32"
        eager = not gpu if enforce_eager == "auto" else enforce_eager == "on"
        return cls(dtype, eager, sleep not in ("off", "auto"), model_runner)


def engine_from_settings(settings: EngineSettings, max_model_len: int, cores: str | None = None) -> Engine:
    """The run's rollout engine, from its `rollout` section (plus the model and the seed): the one construction
    path, used in the driver (`placement.mode=local`) and in every Ray engine actor, so no `rollout.*` setting
    can reach one and not the other. `cores`: the CPU cores a Ray actor was given (vLLM pins its threads)."""
    from relayrl.rollout.memory import chosen_share

    r = settings.rollout
    return build_engine(
        r.engine,
        settings.model.path,
        max_model_len,
        settings.seed,
        kv_cache_gib=r.kv_cache_gib,
        gpu_memory_utilization=chosen_share(r.gpu_memory_utilization),
        prefix_caching=r.prefix_caching,
        cores=cores,
        adapter=settings.adapter(),  # sync.lora=adapter: the engine serves LoRA adapters
        tensor_parallel=r.tensor_parallel,
        device=EngineDevice.resolve(r.dtype, r.enforce_eager, r.sleep, r.model_runner),
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
