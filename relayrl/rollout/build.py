"""Building the run's rollout engine: `engine_from_config`, the one construction path, in the driver and in every
Ray engine actor alike. Imports an engine's module only for the engine asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relayrl.rollout.protocols import Engine


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
