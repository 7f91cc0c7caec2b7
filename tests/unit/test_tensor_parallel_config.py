"""`rollout.tensor_parallel`: the config rule (vLLM only, heads split as vLLM splits them, a core per rank) and the
per-rank core lists a T-rank engine binds to (relayrl/rollout/vllm_tp.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from relayrl.build import resolve
from relayrl.config import dump_config, load_config
from relayrl.errors import ConfigError
from relayrl.rollout import choice, vllm_tp
from relayrl.rollout.vllm_tp import engine_args, rank_binding


def write_model(directory: Path, heads: int, kv_heads: int) -> Path:
    """A small Llama config.json (under the CPU crossover: `auto` alone would choose HF)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "llama",
        "hidden_size": 32 * heads,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": 64,
        "tie_word_embeddings": True,
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch):
    monkeypatch.setattr(choice, "_cuda_available", lambda: False)
    monkeypatch.setattr(vllm_tp, "_on_gpu", lambda: False)
    monkeypatch.setattr(vllm_tp.os, "cpu_count", lambda: 4)


def load(model: Path, *overrides: str):
    """The config a run on `model` gets: validated, then its choices made (the rule is checked there)."""
    return resolve(load_config(None, [f"model.path={model}", *overrides]))


def test_auto_chooses_vllm_for_ranks_and_an_explicit_hf_is_refused(tmp_path):
    model = write_model(tmp_path / "m", heads=4, kv_heads=2)
    assert load(model).rollout.engine == "hf"  # the small model's own choice on CPU
    config = load(model, "rollout.tensor_parallel=2")
    assert config.rollout.engine == "vllm"
    assert "auto chose vllm: rollout.tensor_parallel=2 runs vLLM ranks" in dump_config(config)
    with pytest.raises(ConfigError, match=r"rollout.tensor_parallel=2 .*rollout.engine=hf"):
        load(model, "rollout.tensor_parallel=2", "rollout.engine=hf")


@pytest.mark.parametrize(
    ("heads", "kv_heads", "tp", "ok"),
    [(4, 4, 2, True), (4, 2, 4, True), (4, 1, 2, True), (6, 6, 4, False), (4, 3, 2, False), (8, 4, 3, False)],
)
def test_ranks_must_split_the_heads_as_vllm_does(tmp_path, heads, kv_heads, tp, ok):
    model = write_model(tmp_path / "m", heads=heads, kv_heads=kv_heads)
    if ok:
        assert load(model, f"rollout.tensor_parallel={tp}").rollout.tensor_parallel == tp
        return
    with pytest.raises(ConfigError) as err:
        load(model, f"rollout.tensor_parallel={tp}")
    text = str(err.value)
    assert f"rollout.tensor_parallel={tp}" in text
    assert f"num_attention_heads={heads}" in text and f"num_key_value_heads={kv_heads}" in text


def test_each_rank_needs_a_core(tmp_path):
    model = write_model(tmp_path / "m", heads=8, kv_heads=8)
    ray = ["rollout.tensor_parallel=2", "placement.mode=ray"]
    assert load(model, *ray).placement.engine_cpus == 2  # unset: each engine bundle reserves a core per rank
    assert load(model, *ray, "placement.engine_cpus=3").placement.engine_cpus == 3
    for setting in ("placement.engine_cpus=1", "placement.engine_threads=1"):
        with pytest.raises(ConfigError, match=r"needs 2 cores per engine .*placement.engine_cpus=.*engine_threads="):
            load(model, *ray, setting)
    with pytest.raises(ConfigError, match=r"rollout.tensor_parallel=8 needs one core per rank, this machine has 4"):
        load(model, "rollout.tensor_parallel=8")


def test_on_gpu_each_engine_bundle_reserves_a_gpu_per_rank(tmp_path, monkeypatch):
    from relayrl.placement.cluster import plan_slots

    monkeypatch.setattr(vllm_tp, "_on_gpu", lambda: True)
    monkeypatch.setattr(choice, "_cuda_available", lambda: True)
    monkeypatch.setattr(vllm_tp.torch.cuda, "is_available", lambda: True)  # sync.lora: auto asks torch
    monkeypatch.setattr(vllm_tp.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(vllm_tp.torch.cuda, "is_bf16_supported", lambda: True)  # sync.wire_dtype: auto asks it
    gpu = SimpleNamespace(name="H100", total_memory=80e9)  # learner.activation_checkpointing: auto asks its memory
    monkeypatch.setattr(vllm_tp.torch.cuda, "get_device_properties", lambda index: gpu)
    model = write_model(tmp_path / "m", heads=8, kv_heads=8)
    config = load(model, "rollout.tensor_parallel=2", "placement.mode=ray")
    assert config.sync.wire_dtype == "bf16"  # the engine serves bf16 on this (pretended) GPU
    bundles, slots = plan_slots(config.placement, 4, gpus=True, tensor_parallel=2)
    assert config.placement.engine_resources == {} and bundles[1]["GPU"] == 2.0 and slots[1].gpus == 2.0
    with pytest.raises(ConfigError, match=r"needs 2 GPUs per engine bundle, placement.engine_resources gives GPU: 1"):
        load(model, "rollout.tensor_parallel=2", "placement.mode=ray", "placement.engine_resources={GPU: 1}")
    with pytest.raises(ConfigError, match=r"rollout.tensor_parallel=4 needs 4 GPUs per engine, this machine has 2"):
        load(model, "rollout.tensor_parallel=4")
    lora = ["model.lora.rank=8", "train.lr=1e-4"]
    assert load(model, "rollout.tensor_parallel=2", *lora).sync.lora == "adapter"  # ranks serve adapters too


def test_cores_are_dealt_to_ranks():
    assert rank_binding("1,0", 2) == "1|0"  # a Ray engine's slot: learner on 0, engine on 1 then 0
    assert rank_binding("0-3", 2) == "0,1|2,3"
    assert rank_binding("0-4", 2) == "0,1,2|3,4"
    assert rank_binding(None, 4) == "0|1|2|3"  # the machine's (patched) 4 cores
    with pytest.raises(ConfigError, match=r"rollout.tensor_parallel=2 needs one core per rank.*\(3\).*only 1"):
        rank_binding("3", 2)
    assert engine_args(1) == {}
    assert engine_args(2)["tensor_parallel_size"] == 2 and engine_args(2)["distributed_executor_backend"] == "mp"
