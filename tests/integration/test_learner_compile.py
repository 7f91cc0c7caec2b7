"""`learner.compile`: every decoder layer compiled, and the update's loss and gradients the eager ones (1e-5).

The compile runs through Dynamo's tracing and AOTAutograd's joint graph (backend `aot_eager`), the parts that
break on a model's Python; inductor's kernels (95 s to build for this toy on 2 CPU cores) are left to
benchmarks/gpu_check.sh on a GPU."""

import pytest
import torch
from transformers.modeling_layers import GradientCheckpointingLayer

import relayrl.learner.compile as compile_module
from relayrl.learner.policy import PolicyLearner
from relayrl.placement.sections import learner_settings
from tests.unit.test_learner import _config, _experience, _grads_of_first_step


def test_compiled_layers_give_the_eager_loss_and_gradients(random_model_dir, monkeypatch):
    """With activation checkpointing, as a long-context GPU run uses it: the layer's own checkpoint call is traced
    inside the compiled layer (the harder case; the plain layer is the same graph without it)."""
    monkeypatch.setattr(compile_module, "BACKEND", "aot_eager")
    torch._dynamo.reset()
    extra = ["learner.activation_checkpointing=true"]
    results = {}
    for compiled in (False, True):
        learner = PolicyLearner(
            learner_settings(_config(random_model_dir, [*extra, f"learner.compile={str(compiled).lower()}"]))
        )
        layers = [m for m in learner.network.modules() if isinstance(m, GradientCheckpointingLayer)]
        assert len(layers) == 2 and all((m._compiled_call_impl is not None) == compiled for m in layers)
        grads, result = _grads_of_first_step(learner, _experience())
        results[compiled] = grads, result.metrics["loss/policy"]
    for eager, compiled in zip(results[False][0], results[True][0]):
        torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
    assert results[True][1] == pytest.approx(results[False][1], abs=1e-5)


def test_a_model_without_decoder_layers_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match="learner.compile: Linear has no decoder layers"):
        compile_module.compile_decoder_layers(torch.nn.Linear(2, 2))
