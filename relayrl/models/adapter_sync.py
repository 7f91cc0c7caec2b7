"""How a run's LoRA adapter travels to its engines (`sync.lora`; `auto` is resolved by relayrl/sync/lora.py).

`lora_sync_mode` is what the learner and every engine read; `adapter_spec` is what a vLLM engine serving adapters
needs before the first push; `map_adapter_keys` says where adapter tensors land on an engine's (fused) modules.
Light on purpose (no torch, no peft): the planner reads it as well as the learner and the engines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from relayrl.errors import ConfigError, SyncError

if TYPE_CHECKING:
    from relayrl.config import LoraConfig, ModelConfig, TrainConfig


def engine_serves_lora(kind: str) -> bool:
    if kind == "auto":  # rollout.engine=auto picks vLLM where it is installed
        import importlib.util

        return importlib.util.find_spec("vllm") is not None
    return kind == "vllm"


def lora_sync_mode(lora: LoraConfig | None, wanted: str, engine: str) -> str | None:
    """None for full fine-tuning (`model.lora` unset), else "adapter" or "merged": `wanted` (`sync.lora`) as the
    engine (`rollout.engine`) allows."""
    if lora is None:
        return None
    if wanted == "auto":
        return "adapter" if engine_serves_lora(engine) else "merged"
    if wanted == "adapter" and not engine_serves_lora(engine):
        raise ConfigError(
            f"sync.lora=adapter needs an engine that serves LoRA adapters (vLLM); rollout.engine={engine} "
            "loads full weights: use sync.lora=merged (or auto)"
        )
    return wanted


@dataclass(frozen=True)
class AdapterSpec:
    """What an engine serving adapters needs to know before the first push: the adapter's resolved peft
    config, its tensors' saved names and shapes (built on the meta device), and how many versions to keep."""

    config: dict
    shapes: dict[str, tuple[int, ...]]
    rank: int
    keep: int  # versions kept loaded: max_staleness + 1 that samples may come from, and the one loading


def kept_versions(train: TrainConfig) -> int:
    staleness = {"sync": 0, "one_step_off": 1}.get(train.schedule, train.max_staleness)
    return staleness + 2  # a rollout started on the oldest usable version finishes on it while the next loads


def adapter_spec(model: ModelConfig, mode: str | None, keep: int) -> AdapterSpec | None:
    """The engine's half of `sync.lora=adapter` (`mode`, from `lora_sync_mode`) for `model`, keeping `keep`
    versions (`kept_versions`); None when the run pushes full (or merged) weights."""
    lora = model.lora
    if lora is None or mode != "adapter":
        return None
    from relayrl.models.lora import adapter_layout

    resolved, shapes = adapter_layout(model.path, lora)
    return AdapterSpec(resolved, shapes, lora.rank, keep)


def adapter_module(key: str) -> str:
    """The module an adapter tensor belongs to, under the base model's names:
    `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` -> `model.layers.0.self_attn.q_proj`."""
    module = key.removeprefix("base_model.model.")
    for suffix in (".lora_A.weight", ".lora_B.weight", ".lora_embedding_A", ".lora_embedding_B"):
        if module.endswith(suffix):
            return module[: -len(suffix)]
    raise SyncError(f"adapter tensor {key!r} is not a LoRA A/B weight")


def map_adapter_keys(keys, engine_modules: set[str], packed: dict[str, list[str]]) -> dict[str, str]:
    """{adapter key: the engine module it lands on}. An engine that fuses projections (vLLM's Llama: q/k/v
    into `qkv_proj`, gate/up into `gate_up_proj`, per `packed`) takes them as slices of the fused module. A
    key whose module the engine lacks (or serves without LoRA) stops the run naming it: left unchecked, the
    engine would silently serve the base model."""
    fused_of = {part: fused for fused, parts in packed.items() for part in parts}
    mapped = {}
    for key in keys:
        module = adapter_module(key)
        parent, _, leaf = module.rpartition(".")
        target = f"{parent}.{fused_of[leaf]}" if leaf in fused_of else module
        if target not in engine_modules:
            near = sorted(m for m in engine_modules if m.startswith(parent + "."))[:4]
            raise SyncError(
                f"adapter tensor {key} (module {module}) maps to engine module {target}, which the engine does "
                f"not serve with LoRA (under {parent or 'the root'} it has: {', '.join(near) or 'nothing'}); "
                "change model.lora.target_modules"
            )
        mapped[key] = target
    return mapped
