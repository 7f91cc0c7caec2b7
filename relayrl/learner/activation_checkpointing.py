"""`learner.activation_checkpointing`: every decoder layer's activations recomputed in the backward instead of kept.

HF's `gradient_checkpointing_enable` (non-reentrant `torch.utils.checkpoint`) for the policy and the critic; it
changes neither the loss nor the gradients. It touches the model it is given, nothing else.
"""

from __future__ import annotations


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
