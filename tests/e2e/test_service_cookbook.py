"""tinker-cookbook's supervised recipe (`tinker_cookbook.supervised.train`, what `recipes/sl_basic.py` runs), unchanged,
against `relayrl serve` on the tiny random model and a local conversation file (the cookbook's
`FromConversationFileBuilder`, `role_colon` renderer): it trains 3 epochs, lowers its own train NLL, and saves its
final state and sampler checkpoints through the service. Its math RL recipe (`recipes/math_rl/train.py
env=arithmetic`, as a user runs it) completes its steps through the service with `loss_fn=importance_sampling`
(its default, `stable_reinforce`, is not served). Its accuracy gain on a warm start (15-19 points in 8 runs at
32 groups x 8, 10 steps) is measured by benchmarks/service_math_rl.py, figures in docs/tinker.md: that setting
costs ~90 s here, past one test's budget, so this test checks the run's steps, not the gain."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def write_conversations(path, n: int = 64) -> None:
    rng = random.Random(0)
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randrange(10), rng.randrange(10)
            messages = [{"role": "user", "content": f"{a}+{b}="}, {"role": "assistant", "content": str(a + b)}]
            f.write(json.dumps({"messages": messages}) + "\n")


def test_the_cookbooks_supervised_loop_lowers_its_loss_through_the_service(random_model_dir, tmp_path, monkeypatch):
    from tinker_cookbook.renderers import TrainOnWhat
    from tinker_cookbook.supervised import train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    from relayrl.service import server

    model = str(random_model_dir)  # the base's name is its path: the cookbook loads its tokenizer from it
    running = server.start({model: model}, tmp_path / "state")
    monkeypatch.setenv("TINKER_API_KEY", running.api_key)
    write_conversations(tmp_path / "conversations.jsonl")
    common = ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer=model,
        renderer_name="role_colon",
        max_length=64,
        batch_size=16,
        train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES,
    )
    config = train.Config(
        log_path=str(tmp_path / "run"),
        model_name=model,
        recipe_name="relayrl_service_test",
        renderer_name="role_colon",
        dataset_builder=FromConversationFileBuilder(
            common_config=common, file_path=str(tmp_path / "conversations.jsonl")
        ),
        learning_rate=3e-3,
        num_epochs=3,
        lora_rank=8,
        base_url=running.url,
        eval_every=0,
        save_every=0,
    )
    try:
        asyncio.run(train.main(config))
    finally:
        running.stop()
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    nll = [r["train_mean_nll"] for r in rows if "train_mean_nll" in r]
    assert len(nll) == 12 and nll[-1] < 0.9 * nll[0], nll
    saved = [json.loads(line) for line in (tmp_path / "run/checkpoints.jsonl").read_text().splitlines()]
    assert saved[-1]["state_path"].endswith("/weights/final")
    assert saved[-1]["sampler_path"].endswith("/sampler_weights/final")


def test_the_cookbooks_math_rl_recipe_runs_its_steps_through_the_service(random_model_dir, tmp_path):
    from relayrl.service import server

    model = str(random_model_dir)
    running = server.start({model: model}, tmp_path / "state")
    flags = [
        f"model_name={model}",
        "renderer_name=role_colon",
        f"base_url={running.url}",
        f"log_path={tmp_path / 'run'}",
    ]
    flags += ["env=arithmetic", "group_size=4", "groups_per_batch=8", "max_steps=3", "loss_fn=importance_sampling"]
    flags += ["learning_rate=1e-3", "eval_every=0", "save_every=0", "lora_rank=8", "behavior_if_log_dir_exists=delete"]
    env = {**os.environ, "TINKER_API_KEY": running.api_key}
    try:
        command = [sys.executable, "-m", "tinker_cookbook.recipes.math_rl.train", *flags]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    finally:
        running.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert sum("time/train_step" in r for r in rows) == 3
    assert all(r["tokens/sampled"] > 0 for r in rows if "tokens/sampled" in r)
