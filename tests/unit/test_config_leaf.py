"""The config is a leaf: loading and checking one imports no torch, vLLM or Ray, and leaves its `auto` settings as
`auto`; the builder's `resolve` makes the choices, once, and every run resolves before it prints or builds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import relayrl
from relayrl.build import build_trainer, resolve
from relayrl.config import dump_config, load_config
from relayrl.errors import RelayError

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "vllm", "ray")
# A tree that asks for every choice resolve makes and for the rules checked against the machine (tensor-parallel
# ranks, a LoRA sync, an offload): loading it must still import none of the runtime.
ASKS_EVERYTHING = {
    "model": {"path": "nowhere", "lora": {"rank": 4}},
    "rollout": {"tensor_parallel": 2},
    "placement": {"mode": "ray", "learner_ranks": 2},
    "learner": {"offload": "params"},
    "train": {"lr": 1e-4},
}
PROBE = f"""
import sys
import relayrl
relayrl.load_config("examples/own_task/config.yaml")
relayrl.load_config({ASKS_EVERYTHING!r}, ["rollout.n=4"])
print(sorted({{name.split(".")[0] for name in sys.modules}} & {set(HEAVY)!r}))
"""


def test_loading_and_checking_a_config_imports_no_torch_vllm_or_ray():
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", PROBE], capture_output=True, text=True, cwd=ROOT, check=True
    )
    # -X importtime: one stderr line per module imported, "import time: self | cumulative | name"
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert "relayrl.config.load" in imported  # the probe did import what it checks
    heavy = [name for name in imported if name.split(".")[0] in HEAVY]
    assert heavy == [], f"loading a config imported {heavy[:5]}"
    assert done.stdout.strip() == "[]"  # sys.modules agrees


def test_a_loaded_config_leaves_auto_to_resolve_which_chooses_once():
    loaded = relayrl.load_config(None, ["model.lora.rank=4", "train.lr=1e-4"])
    auto = {
        "rollout.engine": loaded.rollout.engine,
        "sync.lora": loaded.sync.lora,
        "rollout.sleep": loaded.rollout.sleep,
        "learner.offload": loaded.learner.offload,
        "sync.wire_dtype": loaded.sync.wire_dtype,
    }
    assert set(auto.values()) == {"auto"} and "# auto chose" not in dump_config(loaded)
    config = resolve(loaded)
    assert config is loaded  # in place
    chosen = [config.rollout.engine, config.sync.lora, config.rollout.sleep, config.learner.offload]
    assert "auto" not in chosen + [config.sync.wire_dtype]
    text = dump_config(config)
    for key in ("sleep", "offload", "wire_dtype"):  # written back as `auto`, with the choice and why beside it
        assert f"  {key}: auto  # auto chose " in text
    assert resolve(config) is config and dump_config(config) == text  # a second resolve changes nothing


def test_a_choice_that_cannot_hold_fails_when_resolved_not_when_loaded():
    loaded = load_config(None, ["learner.offload=optimizer"])
    with pytest.raises(RelayError, match="learner.offload=optimizer is not available"):
        resolve(loaded)


def test_building_a_run_resolves_its_config_first(tmp_path):
    config = load_config(None, [f"model.path={tmp_path / 'no_model'}", f"log.dir={tmp_path / 'run'}"])
    with pytest.raises(RelayError):  # the missing model stops the build, after the choices are made
        build_trainer(config)
    assert config._resolved and config.rollout.engine in ("hf", "vllm")
    assert not (tmp_path / "run").exists()
