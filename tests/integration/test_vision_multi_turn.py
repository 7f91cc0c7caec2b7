"""Multi-turn RL with images in the observations, through `relayrl train` with each engine.

examples/vision_count/recount_env.py answers a wrong count with a second picture (the red squares alone) and the
question again. The tiny Idefics3 here has random weights, so most first answers are wrong and most trajectories
see two pictures: the second turn's tokens are sampled after an image the environment sent. The engine's
behaviour log-probs must be the learner's on every trained token (`mismatch/logprob_abs_max` < 1e-3: the learner
reads both pictures, in order, and vLLM's expansion of the observation's placeholder is the processor's), and the
report's samples keep both pictures.
"""

from __future__ import annotations

import json

import pytest

from benchmarks.learning_cases import run_cli
from tests.integration.test_vision_rollout import ROOT, _prepare_module

EXAMPLE = ROOT / "examples/vision_count"


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    from relayrl.models.tiny_vlm import build_tiny_vlm

    prepare = _prepare_module()
    root = tmp_path_factory.mktemp("vision_multi_turn")
    prepare.write_task(root / "data", train=16, heldout=1, sft=1, seed=0)
    build_tiny_vlm(prepare.corpus(), root / "model", seed=0)
    return root


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_observation_pictures_reach_engine_and_learner_alike(task, tmp_path, engine):
    run_dir = tmp_path / "run"
    overrides = [
        f"model.path={task / 'model'}",
        f"data.train={task / 'data/train.jsonl'}",
        "data.eval=null",
        f"rollout.engine={engine}",
        "rollout.n=4",
        "rollout.prompts_per_step=4",
        "train.steps=2",
        f"env.fn={EXAMPLE / 'recount_env.py'}:Recount",
        f"env.kwargs.data_dir={task / 'data'}",
        "env.max_turns=2",
        "env.max_total_tokens=96",
        f"log.dir={run_dir}",
        "log.progress=false",
    ]
    result = run_cli("train", str(EXAMPLE / "config.yaml"), *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert row["mismatch/logprob_abs_max"] < 1e-3, row
        assert row["env/turns_mean"] > 1.5, row  # most trajectories saw the environment's picture
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert any(len(sample.get("images", [])) == 2 for sample in samples), "a two-turn sample shows both pictures"
