"""`rollout.engine: auto`: HF generate under the CPU crossover, vLLM over it, on a GPU and under Ray; explicit
engines untouched; the resolved config (printed, saved, reloaded) shows the choice and its reason."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml

import relayrl
from relayrl.build import resolve
from relayrl.config import dump_config, load_config
from relayrl.rollout import choice
from relayrl.rollout.choice import HF_BELOW_PARAMS, choose_engine

ROOT = Path(__file__).resolve().parents[2]
SEVEN_B = ROOT / "examples" / "grpo_7b"  # a Qwen2.5-7B-shaped config.json, no weights


def write_model(directory: Path, hidden: int, layers: int = 2, vocab: int = 64) -> Path:
    """A Llama config.json only: the choice must never need weights."""
    directory.mkdir(parents=True, exist_ok=True)
    shape = {"hidden_size": hidden, "intermediate_size": 4 * hidden, "num_hidden_layers": layers}
    heads = {"num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": vocab}
    config = {"model_type": "llama", **shape, **heads, "tie_word_embeddings": True}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(choice, "_cuda_available", lambda: False)


@pytest.fixture
def small(tmp_path) -> Path:
    return write_model(tmp_path / "small", hidden=64)  # 2 x (4 x 64^2 + 3 x 64 x 256) + 64 x 64 + ... = 135,488


def test_the_crossover_is_the_benchmarked_5m():
    assert HF_BELOW_PARAMS == 5_000_000


def test_a_small_model_on_cpu_gets_hf_with_its_size_as_the_reason(small):
    picked = choose_engine(str(small), "local", cuda=lambda: False)
    assert picked.engine == "hf"
    assert "0.135M params" in picked.reason and str(small / "config.json") in picked.reason
    assert "under the 5M-param crossover on CPU" in picked.reason


def test_a_model_over_the_crossover_gets_vllm(tmp_path):
    picked = choose_engine(str(write_model(tmp_path / "big", hidden=512, layers=2, vocab=32000)), "local")
    assert picked.engine == "vllm" and "at or over the 5M-param crossover" in picked.reason
    seven_b = choose_engine(str(SEVEN_B), "local", cuda=lambda: pytest.fail("a large model needs no GPU check"))
    assert seven_b.engine == "vllm" and "7.62B params" in seven_b.reason


def test_a_gpu_or_ray_or_an_unknown_size_gets_vllm(small, tmp_path):
    assert choose_engine(str(small), "local", cuda=lambda: True).engine == "vllm"
    assert "GPU is available" in choose_engine(str(small), "local", cuda=lambda: True).reason
    assert choose_engine(str(small), "ray", cuda=lambda: False).reason == "placement.mode=ray runs vLLM engine actors"
    missing = choose_engine(str(tmp_path / "nowhere"), "local", cuda=lambda: False)
    assert missing.engine == "vllm" and "no config.json" in missing.reason
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 8}))
    assert "model_type='gpt2'" in choose_engine(str(tmp_path / "gpt2"), "local", cuda=lambda: False).reason


def test_resolve_chooses_for_auto_and_leaves_explicit_engines_alone(small, no_gpu):
    assert load_config(None, [f"model.path={small}"]).rollout.engine == "auto"  # loading only validates
    auto = resolve(load_config(None, [f"model.path={small}"]))
    assert auto.rollout.engine == "hf" and "engine" not in auto.rollout.model_fields_set
    pinned = resolve(load_config(None, [f"model.path={small}", "rollout.engine=vllm"]))
    assert pinned.rollout.engine == "vllm" and pinned._engine_choice is None
    big = resolve(load_config(None, [f"model.path={SEVEN_B}", "rollout.engine=hf"]))
    assert big.rollout.engine == "hf" and big._engine_choice is None
    ray = resolve(load_config(None, [f"model.path={small}", "placement.mode=ray"]))
    assert ray.rollout.engine == "vllm"  # auto never picks what placement.mode=ray refuses


def test_the_resolved_config_shows_the_choice_and_reloads_to_the_same(small, no_gpu, tmp_path):
    config = resolve(load_config(None, [f"model.path={small}"]))
    text = dump_config(config)
    line = next(line for line in text.splitlines() if line.startswith("  engine:"))
    assert line.startswith("  engine: auto  # auto chose hf: 0.135M params") and "crossover on CPU" in line
    assert yaml.safe_load(text)["rollout"]["engine"] == "auto"  # a reload chooses again, and says why again
    saved = tmp_path / "config.yaml"
    saved.write_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a full dump sets every key
        again = resolve(load_config(saved))
    assert again == config and again.rollout.engine == "hf" and dump_config(again) == text
    explicit = dump_config(load_config(None, [f"model.path={small}", "rollout.engine=hf"]))
    assert "\n  engine: hf\n" in explicit and "auto chose hf" not in explicit


def test_a_run_prints_and_saves_the_choice(small, no_gpu, tmp_path, monkeypatch, capsys):
    from relayrl.run.directory import claim

    def fake_train(config, resume=None, overwrite=False):  # the loop's first act: claim log.dir, save the config
        assert config.rollout.engine == "hf"
        claim(config.log.dir, dump_config(config), None, overwrite, log=lambda *_: None)
        (Path(config.log.dir) / "metrics.jsonl").write_text(json.dumps({"step": 0}) + "\n")
        return {}

    monkeypatch.setattr("relayrl.build.train", fake_train)
    run = tmp_path / "run"
    rows = [{"prompt": "1+2=", "answer": "3"}]  # in-memory data: relayrl.train reloads the config it was given
    relayrl.train({"model": {"path": str(small)}, "log": {"dir": str(run)}}, "exact_match", train_data=rows)
    assert "engine: auto  # auto chose hf: 0.135M params" in capsys.readouterr().out
    assert "engine: auto  # auto chose hf: 0.135M params" in (run / "config.yaml").read_text()


def test_a_vision_language_model_is_sized_whole_tower_included(tmp_path):
    from relayrl.models.loading import load_causal_lm
    from relayrl.models.tiny_vlm import build_tiny_vlm

    build_tiny_vlm(["How many?", "0123456789"], tmp_path / "vlm")
    whole = sum(p.numel() for p in load_causal_lm(str(tmp_path / "vlm")).parameters())
    picked = choose_engine(str(tmp_path / "vlm"), "local", cuda=lambda: False)
    assert picked.engine == "hf" and f"{whole / 1e6:.3g}M params" in picked.reason
