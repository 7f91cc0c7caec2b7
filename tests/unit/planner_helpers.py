"""What the planner's tests share (test_planner_memory.py, test_planner_time.py, test_planner_cli.py,
test_planner_teacher.py, test_colocated_memory.py): the 7B example planned (`example_7b`, the one builder of it), its
round shape (SEVEN_B, and as `relayrl plan`'s shape keys), a small Llama/Qwen2 config, and the config `relayrl plan`
plans."""

from pathlib import Path

from relayrl.build import resolve
from relayrl.config import load_config
from relayrl.planner import PROFILES, ModelShape, load_shape, make_plan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/grpo_7b/config.yaml"
SMALL = dict(
    vocab_size=101,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)  # GQA: 2 KV heads for 4 query heads
SEVEN_B = ModelShape(params=int(7e9), layers=28, hidden=3584, kv_heads=4, head_dim=128, vocab=152064)
# SEVEN_B as `relayrl plan`'s shape keys, for a config without model.path
SEVEN_B_KEYS = [
    f"plan.{k}={getattr(SEVEN_B, k)}" for k in ("params", "layers", "hidden", "kv_heads", "head_dim", "vocab")
]
KL = "algorithm.kl.coef=0.001"  # the example with a reference to plan


def planned(*args, **kwargs):
    """The config `relayrl plan` plans: loaded, then its `auto` choices made on this machine."""
    return resolve(load_config(*args, **kwargs))


def example_7b(*overrides: str, hardware: str = "H100-80GB", shape: ModelShape | None = None, **kwargs):
    """(config, plan): examples/grpo_7b with `overrides`, resolved as `relayrl plan` resolves it, planned on
    `hardware` for `shape` (default its config.json's: Qwen2.5-7B's, 7.6B) with make_plan's `kwargs`."""
    config = planned(EXAMPLE, list(overrides))
    return config, make_plan(config, shape or load_shape(config.model.path), PROFILES[hardware], **kwargs)


def plan_7b(hardware="H100-80GB", **kwargs):
    """The 7B example planned on `hardware` for SEVEN_B with a KL reference and every layer's activations kept."""
    return example_7b(KL, "learner.activation_checkpointing=false", hardware=hardware, shape=SEVEN_B, **kwargs)[1]


def load_shape_from(config):
    """The planner's ModelShape of a transformers config object."""
    from relayrl.models.shape import shape_from_config

    return shape_from_config(config)
