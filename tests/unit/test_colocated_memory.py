"""The colocated learner's memory choreography (issue 45 item 2): what a learner sharing its GPU with an engine gives
back, and when (relayrl/learner/offload.py, relayrl/learner/role.py)."""

from __future__ import annotations

import pytest
import torch

from relayrl.config import load_config
from relayrl.learner import offload
from relayrl.placement.sections import learner_settings
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
