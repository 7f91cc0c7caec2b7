"""The push guard (relayrl/sync/guard.py) on real runs: the HF engine in process, a tiny random model, a push
broken on purpose. A push that loads nothing, or one that skips a layer's tensors, stops the run within one step
with a SyncError naming the push, its policy version and its tensors; an intact run passes, its probe's gap ~0 in
fp32. On today's main each broken run trains to the end without a word."""

from __future__ import annotations

import json

import pytest

from relayrl.build import train
from relayrl.config import load_config
from relayrl.errors import SyncError
from relayrl.rollout.hf_engine import HFEngine

SKIPPED = "model.layers."  # the tensors a broken push leaves out: every decoder layer (embeddings, norm, head land)


def _config(tmp_path, model_dir, toy_task, *extra):
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            f"data.train={toy_task['train']}",
            "rollout.engine=hf",
            "rollout.n=4",
            "rollout.prompts_per_step=4",
            "rollout.max_tokens=4",
            "rollout.temperature=1.0",
            "reward.fn=tests.unit.reward_fns_for_service:length",  # a signal from a random model: weights change
            "train.steps=4",
            "train.lr=1e-2",  # a tiny random model: one step moves its log-probs well past sync.max_mismatch
            f"log.dir={tmp_path / 'run'}",
            "log.progress=false",
            "log.save_model=false",
            *extra,
        ],
    )


def _rows(tmp_path) -> list[dict]:
    path = tmp_path / "run" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def _break_push(monkeypatch, keep):
    """The engine's load_weights takes every tensor the push sends and copies only those `keep` accepts."""
    real = HFEngine.load_weights

    def load_some(self, named_tensors, version):
        real(self, [(name, tensor) for name, tensor in named_tensors if keep(name)], version)

    monkeypatch.setattr(HFEngine, "load_weights", load_some)


def test_a_push_that_loads_nothing_stops_the_run_at_that_push(tmp_path, random_model_dir, toy_task, monkeypatch):
    _break_push(monkeypatch, keep=lambda name: False)  # an adapter bound to no module: the engine keeps its weights
    with pytest.raises(SyncError) as stopped:
        train(_config(tmp_path, random_model_dir, toy_task))
    message = str(stopped.value)
    assert message.startswith("the push of policy version 1 (inprocess, ")
    assert "tensors: model.embed_tokens.weight, " in message
    assert "changed no log-prob the engine serves, while the learner's moved by up to" in message
    assert _rows(tmp_path) == []  # stopped in step 0, at its push: no step was logged


def test_a_push_that_skips_a_layer_stops_at_the_probe(tmp_path, random_model_dir, toy_task, monkeypatch):
    _break_push(monkeypatch, keep=lambda name: not name.startswith(SKIPPED))  # a skipped bucket
    with pytest.raises(SyncError) as stopped:
        train(_config(tmp_path, random_model_dir, toy_task))
    message = str(stopped.value)
    assert message.startswith("after the push of policy version 1 (inprocess, ")
    assert "differ from the learner's by" in message and "past sync.max_mismatch=0.05" in message
    assert _rows(tmp_path) == []


def test_without_the_probe_the_samples_stop_the_run_one_step_later(tmp_path, random_model_dir, toy_task, monkeypatch):
    """The step's samples of the version being trained carry the same evidence: version 1 was sampled by an engine
    that never got its decoder layers, so step 1 stops after its update (step 0, sampled by version 0, is logged)."""
    _break_push(monkeypatch, keep=lambda name: not name.startswith(SKIPPED))
    with pytest.raises(SyncError) as stopped:
        train(_config(tmp_path, random_model_dir, toy_task, "sync.parity_probe=false"))
    message = str(stopped.value)
    assert message.startswith("step 1: the engine's log-probs of the ")
    assert "tokens it sampled at policy version 1 differ from the learner's by" in message
    assert "the push of policy version 1 (inprocess, " in message and "did not land as sent" in message
    assert [row["step"] for row in _rows(tmp_path)] == [0]


def test_an_intact_run_passes_the_guard(tmp_path, random_model_dir, toy_task):
    train(_config(tmp_path, random_model_dir, toy_task))
    rows = _rows(tmp_path)
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    assert max(row["sync/parity_abs_mean"] for row in rows) < 1e-5  # fp32 on both sides
    assert max(row["mismatch/logprob_abs_mean"] for row in rows) < 1e-5
    assert all(row["time/probe"] > 0 for row in rows)
