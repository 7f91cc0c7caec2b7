"""Shared fixtures: tiny models and tokenizers built locally (nothing is downloaded), once per session."""

from __future__ import annotations

import os

# vLLM reads these at import time: a small KV cache, both cores, the engine in this process.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def toy_task(tmp_path_factory):
    from relayrl.data.toy import write_toy_task

    return write_toy_task(tmp_path_factory.mktemp("toy"), seed=0)


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory, toy_task):
    """A randomly initialised tiny Llama (head_dim 32) with a character tokenizer for the toy task."""
    from relayrl.models.tiny import build_tiny

    texts = [f"{a}+{b}={a + b}" for a in range(10) for b in range(10)] + [" "]
    out = tmp_path_factory.mktemp("random_model")
    build_tiny(texts, out, seed=0, hidden=64, layers=2, heads=2, intermediate=128)
    return out


@pytest.fixture(scope="session")
def warm_model_dir(tmp_path_factory, toy_task):
    """The demo's sloppy-teacher warm start, trained briefly (a few epochs of the toy SFT set)."""
    from relayrl.learner.sft import SFTSettings, run_sft

    out = tmp_path_factory.mktemp("warm_model")
    return run_sft(
        toy_task["sft"], out, init="tiny", settings=SFTSettings(epochs=4.0, batch_size=128), log=lambda *_: None
    )
