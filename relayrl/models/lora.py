"""LoRA adapters with peft: build them from `model.lora`, and read them out as the engines need them.

Three views of one adapted model, under the names each consumer expects:
- `adapter_tensors`: the adapter alone, under peft's saved names (`base_model.model.<module>.lora_A.weight`),
  what `save_pretrained` writes and what vLLM's LoRA loader reads;
- `merged_tensors`: every base weight with its adapter's update added (W + scale * B @ A), under the base
  model's own names, computed without touching the model (no merge/unmerge round trip, no second copy);
- the base alone: `with model.disable_adapter():` (the reference policy of a KL term, at no memory cost).
How the adapter travels to the engines is relayrl/models/adapter_sync.py.
Left out: adapters on embeddings or the LM head (`all-linear` excludes the head, as peft defines it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from peft.tuners.lora import LoraLayer

ADAPTER_DIR = "adapter"  # beside a finished run's merged model: <run>/model/adapter


def peft_config(settings, target_modules=None):
    """A peft `LoraConfig` from the `model.lora` section (`target_modules` overrides, e.g. a resolved list)."""
    from peft import LoraConfig

    targets = settings.target_modules if target_modules is None else target_modules
    return LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=targets if isinstance(targets, str) else list(targets),
        bias="none",
    )


def add_adapter(model: torch.nn.Module, settings, key: str = "model.lora.target_modules"):
    """`model` wrapped by peft with a fresh adapter (B = 0: the adapted model starts equal to the base); on a
    vision-language model, in its language model only. A module name that matches nothing fails naming the key."""
    from peft import get_peft_model

    from relayrl.models.vision import image_side_pattern

    config = peft_config(settings)
    config.exclude_modules = image_side_pattern(model)  # a vision-language model: its language part only
    try:
        return get_peft_model(model, config)
    except ValueError as err:
        from relayrl.errors import ConfigError

        raise ConfigError(f"{key}={settings.target_modules!r}: {err}") from None


def adapter_tensors(model) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapter's tensors under peft's saved names (what vLLM's LoRA loader and `save_pretrained` use)."""
    from peft import get_peft_model_state_dict

    for name, tensor in get_peft_model_state_dict(model).items():
        yield name, tensor.detach()


def base_weights(model) -> Iterator[tuple[str, torch.nn.Parameter, LoraLayer | None]]:
    """(name in the base model, parameter, its `LoraLayer` or None) of every weight of a peft model's base, under
    the base model's own names (peft's `.base_layer.` removed, tied weights once, adapter tensors skipped); the
    layer is given for an adapted layer's `weight` only (its bias, norms and embeddings get None)."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    owners = {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}
    for name, param in base.named_parameters():
        if ".lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        module_name, _, leaf = name.rpartition(".")
        yield name, param, owners.get(module_name) if leaf == "weight" else None


@torch.no_grad()
def merged_tensors(model) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight of the base model, with each adapted layer's update added, under the base model's
    parameter names (tied weights once). One merged tensor exists at a time; the model is left unmerged."""
    for name, param, layer in base_weights(model):
        if layer is None:
            yield name, param.detach()
            continue
        # peft defines get_delta_weight on each LoraLayer kind (Linear, Embedding, ...), not on the base class; an
        # adapted layer has an active adapter, so the sum is a tensor (pyright allows for sum's int start, 0)
        delta = sum(layer.get_delta_weight(adapter) for adapter in layer.active_adapters)  # pyright: ignore[reportAttributeAccessIssue]
        yield name, param.detach() + delta.to(param.dtype)  # pyright: ignore[reportAttributeAccessIssue]


def resolved_config(model) -> dict:
    """The adapter's `adapter_config.json` contents, with `target_modules` resolved to module names."""
    config = model.peft_config["default"].to_dict()
    targets = config.get("target_modules")
    if isinstance(targets, (set, list, tuple)):
        config["target_modules"] = sorted(targets)
    return config


def write_adapter_dir(out_dir: str | Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    """A peft adapter directory (adapter_config.json + adapter_model.safetensors) from a config and tensors
    under peft's saved names: what vLLM's `LoRARequest` and `PeftModel.from_pretrained` load."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps(config, indent=1, default=str))
    return out


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / "adapter_config.json").is_file()


def adapter_layout(model_path: str | Path, settings) -> tuple[dict, dict[str, tuple[int, ...]]]:
    """(resolved adapter config, {saved name: shape}) of the adapter `settings` would put on the model at
    `model_path`, built on the meta device: what an engine checks its module names against before the
    learner's first push, at no memory cost."""
    from transformers import AutoConfig

    from relayrl.models.loading import model_class

    hf_config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):  # the model's own auto class (a vision-language model's is not a causal LM's)
        model = add_adapter(model_class(hf_config).from_config(hf_config), settings)
    shapes = {name: tuple(t.shape) for name, t in adapter_tensors(model)}
    return resolved_config(model), shapes


def save_merged(model, out_dir: str | Path) -> None:
    """The base with the adapter merged in, as a plain `save_pretrained` model (the model is not mutated)."""
    base = model.get_base_model()
    merged = dict(merged_tensors(model))
    base.save_pretrained(out_dir, state_dict=merged)


def load_adapter(model, adapter_dir: str | Path) -> None:
    """Copy a saved adapter's tensors into a peft `model`'s adapter, in place: the optimizer keeps holding the
    model's own parameters (peft's loader may swap the parameter objects). Exact: fp32 safetensors."""
    from safetensors.torch import load_file

    saved = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in saved.items():
            target = params.get(name.replace(".lora_A.", ".lora_A.default.").replace(".lora_B.", ".lora_B.default."))
            if target is None or target.shape != tensor.shape:
                raise ValueError(f"{adapter_dir}: adapter tensor {name} {tuple(tensor.shape)} does not fit this model")
            target.copy_(tensor)
    if len(saved) != sum(p.requires_grad for p in params.values()):
        raise ValueError(f"{adapter_dir}: {len(saved)} adapter tensors, the model's adapter has a different count")
