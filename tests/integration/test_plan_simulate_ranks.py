"""The planner against the simulated learner (relayrl/planner/simulate.py) at W = 2 and 8 fake FSDP2 ranks for the
three shapes of tests/unit/test_plan_simulate.py, and with the options that change what a step keeps. Each
simulation takes tens of seconds on 2 cores (FSDP2's hooks on fake tensors), hence here rather than in the unit suite.
"""

from __future__ import annotations

import pytest

from relayrl.planner.simulate_report import AGREEMENT, agreement
from tests.unit.test_plan_simulate import (
    check_agreement,
    model_dir,
    simulate_config,
    simulated_and_planned,
    step_config,
)

UNTIED_PASSES = pytest.mark.xfail(
    strict=True,
    reason="an untied head's root (examples/grpo_7b) cut to 2 layers: the no-grad passes hold one more [V, h] fp32 "
    "tensor (~2.2 GB) than weight_copies bills, unexplained; at the full 28 layers they agree (docs/gpus.md)",
)
# The 7B shape at W=2 only: its gap showed at W=8 too (a strict xfail there until stop 53), 37 s more to see twice.
CASES = [(s, w) for s in ("0.5B", "1.5B") for w in (2, 8)] + [pytest.param("7B", 2, marks=UNTIED_PASSES)]


@pytest.mark.parametrize(("shape", "ranks"), CASES)
def test_the_planner_agrees_with_sharded_ranks(tmp_path, shape, ranks):
    check_agreement(tmp_path, shape, ranks, "colocated")


def test_checkpointing_and_a_chunked_head_are_simulated(tmp_path):
    """Activation checkpointing (what the update keeps) and a head run 64 positions at a time (train.logits_chunk=64:
    what a pass holds) change the phase they act on; the simulation sees each and the planner still agrees."""
    path, long = model_dir(tmp_path, "0.5B", layers=4), ("data.max_prompt_tokens=256", "rollout.max_tokens=1024")
    plain = simulate_config(step_config(path, 1, "disaggregated", *long), 1).phases
    for extra, phase in (("learner.activation_checkpointing=true", "update"), ("train.logits_chunk=64", "passes")):
        simulated, planned, _ = simulated_and_planned(step_config(path, 1, "disaggregated", *long, extra), 1)
        assert abs(agreement(simulated, planned)[phase] - 1) <= AGREEMENT, extra
        assert simulated.phases[phase] < plain[phase], extra
