"""`learner.activation_checkpointing`: every decoder layer's activations recomputed in the backward instead of kept,
and whether a learner turns it on (`checkpointing_on`).

HF's `gradient_checkpointing_enable` (non-reentrant `torch.utils.checkpoint`) for the policy and the critic; it
changes neither the loss nor the gradients. It touches the model it is given, nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from relayrl.errors import ConfigError

if TYPE_CHECKING:
    from relayrl.config import LearnerConfig


def checkpointing_on(learner: LearnerConfig, device: str) -> bool:
    """learner.activation_checkpointing for a learner on `device`: true/false as set; `auto` is chosen when the
    config is resolved (relayrl/planner/checkpointing.py), and is off on CPU without asking (a learner built from an
    unresolved config there, as the tests do); on a GPU an unresolved auto is refused."""
    value = learner.activation_checkpointing
    if value != "auto":
        return bool(value)
    if device == "cpu":
        return False
    raise ConfigError(f"learner.activation_checkpointing is still auto where the {device} learner is built: resolve "
                      "the config first (relayrl.build.resolve chooses it from the plan)")  # fmt: skip


def enable_activation_checkpointing(model) -> None:
    """HF gradient checkpointing on `model` (a PreTrainedModel; with LoRA the base inside peft, whose layers then
    hold the adapters), non-reentrant: no input needs requires_grad, which a LoRA run's frozen embeddings lack.

    HF recomputes only in layers whose `training` flag is set, and the learner runs in eval mode (no dropout, an
    on-policy ratio of exactly 1). So the flag is set on the decoder layers themselves, not on their children:
    every dropout and attention module inside stays in eval mode. The forward computes the same values."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no checkpointable decoder layers")
    for layer in layers:
        layer.training = True  # the layer's own flag only (nn.Module.train would recurse into dropout)
