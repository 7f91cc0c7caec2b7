"""The vision tower of a vision-language model: finding it, and freezing it (`model.freeze_vision`).

A frozen tower trains only the language part (the language model and the connector that projects image
features into it, as LLaVA-style recipes train). Its parameters never change, so a push leaves them out: the
engine keeps the ones it loaded from model.path (`PolicyLearner.named_weights`).
"""

from __future__ import annotations

import torch

# the tower's attribute on the model or its inner `model`: Idefics3/SmolVLM, LLaVA/Gemma3, Qwen2-VL/Qwen2.5-VL
TOWER_NAMES = ("vision_model", "vision_tower", "visual")


def vision_tower(model: torch.nn.Module) -> torch.nn.Module | None:
    """The vision encoder module, or None for a text-only model."""
    for holder in (model, getattr(model, "model", None)):
        for name in TOWER_NAMES:
            tower = getattr(holder, name, None) if holder is not None else None
            if isinstance(tower, torch.nn.Module):
                return tower
    return None


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
