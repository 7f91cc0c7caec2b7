"""`learner.compile`: torch.compile on each decoder layer of the policy, the unit torchtitan compiles.

A layer, not the whole model: every layer has the same code, so one compiled graph serves them all, and the
model's own Python around them (HF's mask building, relayrl's packed layouts and chunked head) stays eager, where
a whole-model graph would break on it. Dynamic shapes, so a new sequence length is not a recompile. Applied after
activation checkpointing (the layer's own checkpoint call is traced with it) and before FSDP2 wraps the layers.
The compiled layer computes the eager layer's values (tests/integration/test_learner_compile.py); on CPU the compile
itself costs ~95 s for a 2-layer toy, so it is opt-in.
"""

from __future__ import annotations

import torch

BACKEND = "inductor"  # torch's default: Triton kernels on a GPU, C++ on CPU


def compile_decoder_layers(model: torch.nn.Module) -> int:
    """Compile every decoder layer of `model` (an HF PreTrainedModel) in place; returns how many."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ValueError(f"learner.compile: {type(model).__name__} has no decoder layers to compile")
    for layer in layers:
        layer.compile(backend=BACKEND, dynamic=True)
    return len(layers)
