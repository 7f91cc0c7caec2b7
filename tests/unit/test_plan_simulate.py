"""The planner's learner memory per phase against relayrl's own learner run on fake tensors (relayrl/planner/simulate.py).

The shapes are Qwen2.5-0.5B's and 1.5B's and examples/grpo_7b's config.json, cut to 2 decoder layers and short
sequences so that the suite stays fast: the fake tensors cost time per operation, not per byte, and the planner
reads the same cut config.json, so every term of both (embeddings, a layer's values, the head's logits, the states
and their shards) is compared at the sizes it has there. The full-size figures are in docs/gpus.md.
At W > 1 colocated and disaggregated ranks hold the same learner (sharded ranks offload only when
learner.offload=between_phases is set); at W = 1 colocated offloads its states between phases and disaggregated does
not. Here: W = 1 for every shape and W = 2 for one, its shards offloaded; the W = 2 and 8 matrix of all three shapes (tens of seconds each on 2 cores) is
tests/integration/test_plan_simulate_ranks.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relayrl.build import resolve
from relayrl.config import load_config
from relayrl.placement.sections import colocation, learner_settings
from relayrl.planner import PROFILES, load_shape, make_plan
from relayrl.planner.estimate import workload_from_config
from relayrl.planner.simulate import simulate
from relayrl.planner.simulate_report import AGREEMENT, agreement, planned_phases
from relayrl.rollout.sleep import time_sharing_on

QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "max_position_embeddings": 32768}
SHAPES = {  # Qwen2.5-0.5B and 1.5B's config.json; 7B: examples/grpo_7b/config.json
    "0.5B": {"hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14, "num_key_value_heads": 2,
             "vocab_size": 151936, "tie_word_embeddings": True},
    "1.5B": {"hidden_size": 1536, "intermediate_size": 8960, "num_attention_heads": 12, "num_key_value_heads": 2,
             "vocab_size": 151936, "tie_word_embeddings": True},
    "7B": json.loads(Path("examples/grpo_7b/config.json").read_text()),
}  # fmt: skip
STEP = ["rollout.engine=vllm", "algorithm.kl.coef=0.001", "rollout.n=4", "rollout.prompts_per_step=8",
        "train.mini_batch=16", "train.micro_batch=2", "data.max_prompt_tokens=32", "rollout.max_tokens=96"]  # fmt: skip
LAYOUTS = {
    "colocated": ["placement.layout=colocated"],
    "disaggregated": ["placement.layout=disaggregated", "placement.engines=1"],
}


def model_dir(tmp_path: Path, shape: str, layers: int = 2) -> Path:
    config = {**QWEN2, **SHAPES[shape], "num_hidden_layers": layers}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def step_config(path: Path, ranks: int, layout: str, *extra: str):
    placement = ["placement.mode=local"] if ranks == 1 and layout == "colocated" else ["placement.mode=ray"]
    if placement == ["placement.mode=ray"]:
        placement += [f"placement.learner_ranks={ranks}", *LAYOUTS[layout]]
    return resolve(load_config(None, [f"model.path={path}", *STEP, *placement, *extra]))


def offloads(config, ranks: int) -> bool:
    """learner.offload=between_phases as the run resolves it on a GPU (Plan.offload)."""
    return time_sharing_on(colocation(config, as_asked=True), True)[1]


def simulate_config(config, ranks: int, offload: bool = False, checkpointing: bool | None = None):
    """`checkpointing`: learner.activation_checkpointing as the plan chose it for its GPU (None: as the config
    resolved it here, where auto is off)."""
    work = workload_from_config(config, learner_ranks=ranks, checkpointing=checkpointing)
    return simulate(learner_settings(config), work, offload or offloads(config, ranks))


def simulated_and_planned(config, ranks: int, offload: bool = False):
    """`offload`: the states leave between phases (plan.offload=true; learner.offload=between_phases, which this
    CPU machine refuses to resolve), else as the config resolves on a GPU."""
    plan = make_plan(config, load_shape(config.model.path), PROFILES["H100-80GB"], learner_ranks=ranks,
                     read_prompts=False, offload=offload)  # fmt: skip
    simulated = simulate_config(config, ranks, offload, plan.workload.checkpointing)
    return simulated, planned_phases(plan, plan.offload), plan


def check_agreement(tmp_path: Path, shape: str, ranks: int, layout: str, offload: bool = False) -> None:
    """The planner within AGREEMENT of the simulation at every phase, and the simulation's states as the learner
    holds them."""
    config = step_config(model_dir(tmp_path, shape), ranks, layout)
    simulated, planned, plan = simulated_and_planned(config, ranks, offload)
    ratios = agreement(simulated, planned)
    off = {phase: f"{simulated.phases[phase] / 1e9:.3f} vs {planned[phase] / 1e9:.3f} GB" for phase in planned
           if abs(ratios[phase] - 1) > AGREEMENT}  # fmt: skip
    assert not off, f"{shape} W={ranks} {layout}: simulated vs planned {off}"
    # the learner the simulation ran: W shards of fp32 weights and AdamW's m and v, and the reference cast to bf16
    # (before it is sharded), nothing else between updates
    params = plan.shape.params
    assert simulated.phases["after_update"] == pytest.approx(params * (12 + 2) / ranks, rel=0.01)
    assert (simulated.phases["after_offload"] < 2**26) == plan.offload  # the states left the GPU: buffers remain


@pytest.mark.parametrize(
    ("shape", "ranks", "layout", "offload"),
    [(s, 1, layout, False) for s in SHAPES for layout in LAYOUTS] + [("0.5B", 2, "colocated", True)],
)
def test_the_planner_agrees_with_the_simulated_learner(tmp_path, shape, ranks, layout, offload):
    """The W = 2 case offloads its shards between phases (learner.offload=between_phases on learner ranks)."""
    check_agreement(tmp_path, shape, ranks, layout, offload)


def test_colocated_and_disaggregated_sharded_ranks_hold_the_same_learner(tmp_path):
    path = model_dir(tmp_path, "0.5B")
    assert not offloads(step_config(path, 2, "colocated"), 2)
    assert not offloads(step_config(path, 2, "disaggregated"), 2)
    assert offloads(step_config(path, 1, "colocated"), 1) and not offloads(step_config(path, 1, "disaggregated"), 1)


def test_plan_simulate_prints_the_phases(tmp_path, capsys):
    from relayrl.cli import main

    assert main(["plan", f"model.path={model_dir(tmp_path, '0.5B')}", *STEP, "--simulate"]) == 0
    out = capsys.readouterr().out
    assert "learner memory per GPU, simulated" in out
    for phase in ("load", "after_load", "first_pass", "passes", "update", "after_update", "after_offload"):
        assert phase in out
    # one process colocated (placement.mode=local): the engine is built first, the learner loads beside it
    assert "the engine beside the learner (simulated; its share 0.5 x 80 GB)" in out
    assert "engine starts" in out and "engine wakes KV" in out and "weights (push)" in out


@pytest.mark.parametrize(
    ("words", "message"),
    [(["plan.hardware=cpu"], "plan.hardware=cpu is not a GPU"), (["plan.layers=4"], "plan.layers cannot reshape it")],
)
def test_plan_simulate_refuses_what_it_cannot_simulate(tmp_path, capsys, words, message):
    from relayrl.cli import main

    assert main(["plan", f"model.path={model_dir(tmp_path, '0.5B')}", *STEP, "plan.simulate=true", *words]) == 2
    assert message in capsys.readouterr().err
