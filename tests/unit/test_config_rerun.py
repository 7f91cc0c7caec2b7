"""A resolved config re-runs: load -> dump -> load gives an equal config, from any directory.

Covers every shipped config and a set of configs that use the sections most likely to break a dump
(reward components, a critic, DAPO, Ray placement, async schedules).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml

from relayrl.config import dump_config, load_config

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(ROOT.glob("examples/*/config.yaml")) + sorted(ROOT.glob("relayrl/configs/*.yaml"))

TEST_CONFIGS = {
    "components": [
        "reward.components=[{fn: math, name: correct}, {fn: regex, name: format, weight: 0.1, "
        "kwargs: {pattern: '\\d+'}}]",
        "reward.workers=2",
        "reward.on_error=skip",
    ],
    "critic": [
        "algorithm.advantage=gae",
        "algorithm.lam=0.9",
        "critic.lr=2e-5",
        "critic.warmup_steps=2",
        "algorithm.kl.coef=0.01",
        "algorithm.kl.placement=reward",
    ],
    "dapo": [
        "algorithm.dapo.dynamic_sampling=true",
        "algorithm.dapo.max_rounds=3",
        "algorithm.dapo.overlong_buffer=8",
        "algorithm.dapo.overlong_filter=true",
        "algorithm.clip_eps_high=0.28",
        "algorithm.loss_agg=seq_mean_token_mean",
    ],
    "ray": [
        "placement.mode=ray",
        "placement.layout=colocated",
        "placement.engines=2",
        "placement.engine_cpus=0.5",
        "sync.transport=disk",
        "sync.directory=/tmp/relayrl-sync",
        "sync.wire_dtype=bf16",
        "sync.parity_probe=true",
    ],
    "async": [
        "placement.mode=ray",
        "train.schedule=async",
        "train.max_staleness=2",
        "train.on_stale=drop",
        "train.partial_rollouts=1.5",
        "algorithm.correction.mode=tis_token",
        "algorithm.correction.threshold=3",
    ],
    "one_step_off": [
        "placement.mode=ray",
        "train.schedule=one_step_off",
        "algorithm.correction.mode=mask_seq",
        "checkpoint.every=2",
    ],
    "adaptive_kl": [
        "algorithm.kl.coef=0.05",
        "algorithm.kl.controller=adaptive",
        "algorithm.kl.estimator=k1",
        "train.lr_schedule=cosine",
        "train.warmup_steps=3",
        "train.betas=[0.8, 0.95]",
    ],
    "paths": [
        "model.path=examples/grpo_7b",
        "data.train=examples/own_task/train.jsonl",
        "data.eval=examples/own_task/eval.jsonl",
        "reward.fn=examples/own_task/reward.py:score",
        "reward.kwargs={}",
        "log.dir=runs/x",
    ],
}


def quiet_load(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a full dump sets every key, so "has no effect" warnings fire
        return load_config(*args, **kwargs)


def rerun_elsewhere(config, tmp_path, monkeypatch):
    """Save the resolved config as a run does, then load it from another directory."""
    saved = tmp_path / "run" / "config.yaml"
    saved.parent.mkdir()
    saved.write_text(dump_config(config))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return quiet_load(saved)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_config_reruns_from_its_dump(path, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = quiet_load(path)
    again = rerun_elsewhere(config, tmp_path, monkeypatch)
    assert again == config
    assert dump_config(again) == dump_config(config)


@pytest.mark.parametrize("name", sorted(TEST_CONFIGS))
def test_configs_of_every_section_rerun_from_their_dump(name, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = quiet_load(None, TEST_CONFIGS[name])
    again = rerun_elsewhere(config, tmp_path, monkeypatch)
    assert again == config
    assert dump_config(again) == dump_config(config)


def test_the_shipped_configs_include_one_with_reward_components():
    # the case that broke: a dump wrote the default reward.fn beside reward.components
    assert any("components" in (yaml.safe_load(p.read_text()).get("reward") or {}) for p in SHIPPED)


def test_dump_with_components_leaves_out_fn_and_kwargs():
    config = quiet_load(None, TEST_CONFIGS["components"])
    reward = yaml.safe_load(dump_config(config))["reward"]
    assert "fn" not in reward and "kwargs" not in reward
    assert [c["name"] for c in reward["components"]] == ["correct", "format"]


def test_dump_without_components_keeps_fn_and_kwargs():
    reward = yaml.safe_load(dump_config(quiet_load(None, ["reward.fn=math", "reward.kwargs={a: 1}"])))["reward"]
    assert reward["fn"] == "math" and reward["kwargs"] == {"a": 1} and reward["components"] == []


def test_rerunning_a_saved_config_warns_only_about_what_it_changed(tmp_path):
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(load_config()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every key is set, none by choice: nothing to warn about
        assert load_config(saved) == load_config()
    with pytest.warns(UserWarning, match="placement.engines has no effect"):
        saved.write_text(dump_config(quiet_load(None, ["placement.engines=2"])))
        load_config(saved)
