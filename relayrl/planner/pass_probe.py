"""`relayrl plan plan.measure=true`: the learner's passes timed on the model's own layers, not only its matmuls.

A tiny model's update spends a third of its time outside the matmuls (measured on the demo's shapes with the
torch profiler: matmuls 47 ms of 75 ms; elementwise products of RMSNorm, rotary embeddings and SwiGLU 7 ms,
attention 6 ms, SiLU and its backward 2 ms), and that share grows with the width the matmul probe
(relayrl/planner/probe.py) does not see. So the model itself, rebuilt from its config.json with random
weights, runs a forward (and backward, through its own cross-entropy over the vocabulary) at the rows of one
micro-batch: once with one layer, once with two. The difference is one layer, the rest the embedding, final
norm, LM head and loss; a pass of the run's model takes head + layers x layer. The rate the planner uses is
the pass's FLOPs (relayrl/planner/timing.py `forward_flops_per_token`) over that time, so every formula that
divides FLOPs by a rate stays as it is. Prefill and decode keep the matmul rates: the engine's kernels are
not transformers'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from relayrl.models.shape import ModelShape
from relayrl.planner.hardware import best_time


@dataclass(frozen=True)
class PassRates:
    """FLOP/s of the learner's passes through the model's own layers at one micro-batch's rows (measured)."""

    update: float  # forward + backward
    forward: float  # forward alone: log-prob passes
    rows: int


def measure_pass_rates(model_path: str, shape: ModelShape, rows: int, width: int, repeats: int = 5) -> PassRates:
    """`PassRates` of the model at `rows` positions in rows of `width`."""
    from relayrl.planner.timing import forward_flops_per_token

    width = max(1, min(width, rows))
    batch = max(1, math.ceil(rows / width))
    one = _best_passes(model_path, 1, batch, width, repeats)
    two = _best_passes(model_path, 2, batch, width, repeats)
    update, forward = (whole_model(a, b, shape.layers) for a, b in zip(one, two))
    flops = forward_flops_per_token(shape, width / 2) * batch * width
    return PassRates(3 * flops / update, flops / forward, batch * width)


def whole_model(one_layer: float, two_layers: float, layers: int) -> float:
    """Seconds of a `layers`-layer pass from the one- and two-layer copies': head + layers x layer."""
    layer = max(0.0, two_layers - one_layer)
    return max(0.0, one_layer - layer) + layers * layer


def _best_passes(model_path: str, layers: int, batch: int, width: int, repeats: int) -> tuple[float, float]:
    """Best seconds of (forward + backward, forward) of a `layers`-layer copy of the model, random weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path).get_text_config()  # a vision-language model's language model
    config.num_hidden_layers = layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    ids = torch.randint(0, config.vocab_size, (batch, width))

    def update():
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    def forward():
        with torch.no_grad():
            model(input_ids=ids, labels=ids)

    return best_time(update, repeats), best_time(forward, repeats)
