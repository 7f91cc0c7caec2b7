"""What the planner's tests share (test_planner_memory.py, test_planner_time.py, test_planner_cli.py): the 7B
example's config and shape, a small Llama/Qwen2 config, and the config `relayrl plan` plans."""

from pathlib import Path

from relayrl.build import resolve
from relayrl.config import load_config
from relayrl.planner import PROFILES, ModelShape, make_plan

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


def planned(*args, **kwargs):
    """The config `relayrl plan` plans: loaded, then its `auto` choices made on this machine."""
    return resolve(load_config(*args, **kwargs))


def plan_7b(hardware="H100-80GB", **kwargs):
    """The 7B example planned on `hardware` with a KL reference and every layer's activations kept."""
    config = planned(EXAMPLE, ["algorithm.kl.coef=0.001", "learner.activation_checkpointing=false"])  # all kept
    return make_plan(config, SEVEN_B, PROFILES[hardware], **kwargs)


def load_shape_from(config):
    """The planner's ModelShape of a transformers config object."""
    from relayrl.models.shape import shape_from_config

    return shape_from_config(config)
