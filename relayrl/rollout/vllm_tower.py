"""A vision-language model's tower across vLLM's level-2 sleep: kept, not dropped.

Level 2 (`rollout.sleep`, colocated on a GPU) discards every weight of the engine; the next push brings them back.
A frozen tower (`model.freeze_vision`) is never pushed, so after the first sleep the engine would serve images
through whatever the freed memory then held, silently. vLLM keeps named parameters across a level-2 sleep
(`sleep_preserve_parameter_names`: copied to CPU at sleep, restored at wake, before the push): each worker is told
its tower's parameter names as its own served model names them (`preserve_tower`), after the model is loaded,
because vLLM's names are not the checkpoint's and a name that matches nothing is an error at the first sleep.
A tower that is trained too is kept as well: the wake restores it, then the push overwrites it.
"""

from __future__ import annotations

import torch

from relayrl.models.vision import vision_tower


def preserve_tower(llm) -> list[str]:
    """Tell every worker of `llm` to keep its vision tower across a level-2 sleep; the names (one rank's), empty for
    a text-only model."""
    return llm.collective_rpc(_preserve_tower)[0]


def tower_parameter_names(model: torch.nn.Module) -> list[str]:
    """The names of the tower's parameters in `model` (vLLM's served model, or an HF one), in model order."""
    tower = vision_tower(model)
    if tower is None:
        return []
    inside = {id(p) for p in tower.parameters()}
    return [name for name, param in model.named_parameters() if id(param) in inside]


def _preserve_tower(worker) -> list[str]:
    names = tower_parameter_names(worker.model_runner.get_model())
    worker.model_config.sleep_preserve_parameter_names = names  # read by the worker at each sleep
    return names
