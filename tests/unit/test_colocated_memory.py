"""The colocated learner's memory choreography (issue 45 item 2): what a learner sharing its GPU with an engine gives
back, and when (relayrl/learner/offload.py, relayrl/learner/role.py)."""

from __future__ import annotations

import pytest
import torch

from relayrl.config import load_config
from relayrl.learner import offload
from relayrl.placement.sections import learner_settings
from tests.unit.planner_helpers import example_7b
from tests.unit.test_sharded_scenarios import experience


def test_cached_blocks_go_back_on_cuda_only(monkeypatch):
    emptied: list[bool] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    offload.return_cached_blocks("cpu")
    assert emptied == []
    offload.return_cached_blocks("cuda")
    offload.return_cached_blocks("cuda:0")
    assert emptied == [True, True]


@pytest.mark.parametrize(
    ("placement", "frees"), [((), True), (("placement.mode=ray", "placement.layout=disaggregated"), False)]
)
def test_a_colocated_learner_returns_its_cache_after_attach_and_each_update(
    monkeypatch, random_model_dir, placement, frees
):
    """After the models are built (the load's peak) and after every update (its activations and gradients): the
    engine beside it starts and wakes into that room. A learner with a GPU of its own keeps its cache."""
    from relayrl.learner import role

    calls: list[str] = []
    monkeypatch.setattr(role, "return_cached_blocks", calls.append)
    settings = learner_settings(load_config(None, [f"model.path={random_model_dir}", "rollout.n=4", *placement]))
    assert settings.colocated == frees
    learner = role.LearnerRole(settings)
    assert calls == (["cpu"] if frees else [])
    exp = learner.prepare(experience())
    assert calls == (["cpu"] if frees else [])  # the passes keep theirs: the update follows at once
    learner.update(0, exp)
    learner.update(1, learner.prepare(experience(seed=1)))
    assert calls == (["cpu"] * 3 if frees else [])


COLOCATED_8 = ("placement.mode=ray", "placement.layout=colocated", "placement.learner_ranks=8", "placement.engines=8")


def test_8_colocated_h100s_leave_the_engine_its_share_at_every_boundary_of_a_7b_step():
    """The planner's phases (within 15% of the simulation, tests/unit/test_plan_simulate.py; the full-size simulated
    figures are in docs/gpus.md): the engine's 0.5 x 80 GB fits beside rank 0 when it starts (after the ranks
    load and return their cache), when it wakes its weights for the push and when it wakes its KV cache; with room
    to spare for the planner's 15%."""
    from relayrl.planner.simulate_report import engine_boundaries, engine_fits, planned_phases

    config, plan = example_7b(*COLOCATED_8, read_prompts=False)
    assert config.algorithm.kl.coef > 0 and plan.sleep and not plan.offload  # sharded ranks keep their shards
    phases = planned_phases(plan, plan.offload)
    assert engine_fits(plan, phases, engine_first=False) == []
    boundaries = engine_boundaries(plan, phases, engine_first=False)
    assert [b.phase for b in boundaries] == ["after_load", "after_update", "after_offload"]
    assert all(b.free(80e9) > 0.15 * b.learner for b in boundaries)
    assert boundaries[0].engine == boundaries[2].engine == 40e9


def test_a_boundary_the_engine_cannot_take_is_named():
    """One H100 (placement.mode=local): the engine is built first and the 7B learner loads beside it (fp32 policy and
    reference, 62 GB): the engine's 40 GB do not fit there. With the engine awake (rollout.sleep=off, set where
    this CPU cannot resolve it) the learner's passes and update are boundaries too."""
    from dataclasses import replace

    from relayrl.planner.simulate_report import engine_boundaries, engine_fits, planned_phases

    _, plan = example_7b(read_prompts=False)
    over = engine_fits(plan, planned_phases(plan, plan.offload), engine_first=True)
    assert over and over[0].startswith("engine starts (load: learner 6") and "over 80 GB" in over[0]
    awake = replace(plan, sleep=False)
    phases = [b.phase for b in engine_boundaries(awake, planned_phases(awake, awake.offload), engine_first=True)]
    assert phases == ["load", "first_pass", "passes", "update", "after_offload"]
