"""One construction path for rollout engines: a local run (`placement.build_roles`) and a Ray engine actor
(`EngineWorker`) hand the builder the same `rollout.*` settings, so none can be dropped by placement."""

import os

import torch

import relayrl.placement.local as local_placement
import relayrl.rollout.build as rollout_base
from relayrl.config import Config
from relayrl.placement import build_roles
from relayrl.placement.engine_worker import EngineWorker
from relayrl.placement.sections import engine_settings

ROLLOUT = {
    "engine": "vllm",
    "kv_cache_gib": 3.0,
    "gpu_memory_utilization": 0.35,
    "prefix_caching": "off",
    "model_runner": "v1",
}


def capture(monkeypatch) -> list[dict]:
    calls = []

    def fake_build_engine(kind, model_path, max_model_len, seed, **settings):
        calls.append({"kind": kind, "model_path": model_path, "max_model_len": max_model_len, "seed": seed, **settings})
        return object()

    monkeypatch.setattr(rollout_base, "build_engine", fake_build_engine)
    return calls


def test_local_and_ray_engines_get_every_rollout_setting(monkeypatch):
    calls = capture(monkeypatch)
    monkeypatch.setattr(local_placement, "LearnerRole", lambda config: object())
    config = Config.model_validate({"model": {"path": "/models/tiny"}, "rollout": ROLLOUT, "train": {"seed": 11}})
    build_roles(config, 77)
    threads = torch.get_num_threads()
    EngineWorker(engine_settings(config), 77, threads, "1")  # what build_ray_roles starts in each engine actor
    local, ray = calls
    assert ray.pop("cores") == "1" and local.pop("cores") is None  # only where the actor may run differs
    assert local == ray
    assert local == {
        "kind": "vllm",
        "model_path": "/models/tiny",
        "max_model_len": 77,
        "seed": 11,
        "kv_cache_gib": 3.0,
        "gpu_memory_utilization": 0.35,
        "prefix_caching": "off",
        "adapter": None,  # sync.lora=adapter only
        "tensor_parallel": 1,
        "device": rollout_base.EngineDevice("float32", eager=True, sleep=False, model_runner="v1"),  # auto on this CPU
    }


def test_the_engine_pins_its_threads_to_the_cores_it_was_given(monkeypatch):
    from relayrl.rollout.vllm_engine import _configure_environment

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1")  # inherited from the driver's environment
    _configure_environment(1.0, cores="1")
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "1"


def test_the_engines_device_settings_are_resolved_where_it_is_built(monkeypatch):
    from relayrl.rollout.build import EngineDevice

    assert EngineDevice.resolve() == EngineDevice("float32", eager=True, sleep=False)  # this CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert EngineDevice.resolve() == EngineDevice("float16", eager=False, sleep=False)  # an older GPU: fp16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert EngineDevice.resolve("auto", "on", 2) == EngineDevice("bfloat16", eager=True, sleep=True)
    assert EngineDevice.resolve("float32", "off", "off") == EngineDevice("float32", eager=False, sleep=False)


def test_the_model_runner_is_vllms_choice_unless_named_and_v2_without_triton_is_refused(monkeypatch):
    import pytest

    from relayrl.errors import ConfigError
    from relayrl.rollout.vllm_engine import _choose_model_runner

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")  # a user's export
    _choose_model_runner("auto")
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "1"  # auto: vLLM's own choice, and the user's export, stand
    _choose_model_runner("v1")  # a first GPU run's fallback to the runner the CPU suite tests
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    with pytest.raises(ConfigError, match=r"rollout.model_runner=v2: .*needs Triton"):
        _choose_model_runner("v2")  # vLLM's CPU build has no Triton
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"  # nothing changed by the refusal
