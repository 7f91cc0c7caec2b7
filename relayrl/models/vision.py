"""The vision tower of a vision-language model: finding it, and freezing it (`model.freeze_vision`).

A frozen tower trains only the language part (the language model and the connector that projects image
features into it, as LLaVA-style recipes train). Its parameters never change, so a push leaves them out: the
engine keeps the ones it loaded from model.path (`PolicyLearner.named_weights`).
"""

from __future__ import annotations

import re

import torch

# the tower's attribute on the model or its inner `model`: Idefics3/SmolVLM, LLaVA/Gemma3, Qwen2-VL/Qwen2.5-VL
TOWER_NAMES = ("vision_model", "vision_tower", "visual")
# the connector projecting image features into the language model: Idefics3, LLaVA/Gemma3 (Qwen2-VL's merger
# is inside `visual`)
CONNECTOR_NAMES = ("connector", "multi_modal_projector")


def vision_tower(model: torch.nn.Module) -> torch.nn.Module | None:
    """The vision encoder module, or None for a text-only model."""
    towers = _attributes(model, TOWER_NAMES)
    return towers[0] if towers else None


def freeze_vision(model: torch.nn.Module) -> set[str]:
    """Stop gradients into the vision tower; the frozen parameters' names (as `model.named_parameters` gives
    them), empty for a text-only model."""
    tower = vision_tower(model)
    if tower is None:
        return set()
    frozen = {id(p) for p in tower.parameters()}
    for param in tower.parameters():
        param.requires_grad_(False)
    return {name for name, param in model.named_parameters() if id(param) in frozen}


def image_side_pattern(model: torch.nn.Module) -> str | None:
    """A regex (full match, as peft's `exclude_modules` reads a string) of every module name inside the vision
    tower or the connector of `model`, so LoRA adapts only the language model; None for a text-only model.
    vLLM applies a LoRA adapter to the language model alone, so adapter tensors elsewhere could not be served."""
    if vision_tower(model) is None:
        return None
    image_side = {id(m) for m in _attributes(model, TOWER_NAMES + CONNECTOR_NAMES)}
    prefixes = [name for name, module in model.named_modules() if id(module) in image_side]
    return "|".join(f"{re.escape(prefix)}(\\..*)?" for prefix in prefixes)


def _attributes(model: torch.nn.Module, names: tuple[str, ...]) -> list[torch.nn.Module]:
    """The modules under `names` on the model or its inner `model`, in that order."""
    holders = [h for h in (model, getattr(model, "model", None)) if h is not None]
    return [m for h in holders for name in names if isinstance(m := getattr(h, name, None), torch.nn.Module)]
