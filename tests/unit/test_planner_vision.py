"""`relayrl plan` on a vision-language model: its parameters counted part by part as the real model holds them,
a frozen tower's memory (exactly its gradients and optimizer state saved) and sync (left out), the vision
encoder's FLOPs in the step time, image rows' tokens in the prompt lengths, and the vision line the plan prints.
One tiny Idefics3 (relayrl/models/tiny_vlm.py) built once for the module."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from PIL import Image

from relayrl.cli import main
from relayrl.config import load_config
from relayrl.planner import PROFILES, count_params, load_shape, make_plan
from relayrl.planner.estimate import sync_params
from relayrl.planner.prompts import sample_prompt_lengths
from relayrl.planner.timing import estimate_time, gathered_bytes
from relayrl.planner.vision import encoder_time

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "How many red squares?"
IMAGE_TOKENS, PATCHES = 16, 64  # a 32x32 image in 4x4 patches, pixel-shuffled by 2: (32 / 4)^2 / 2^2 tokens


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    """(model, its directory) of a tiny Idefics3: a 2-layer SigLIP-shaped tower and a 3-layer Llama."""
    from relayrl.models.tiny_vlm import build_tiny_vlm

    out = tmp_path_factory.mktemp("tiny_vlm")
    model, _ = build_tiny_vlm([PROMPT, "0123456789"], out)
    return model, out


@pytest.fixture(scope="module")
def image_rows(tmp_path_factory) -> Path:
    """Four rows of one image and four of two: 1.5 images per prompt."""
    out = tmp_path_factory.mktemp("image_rows")
    rows = []
    for i in range(8):
        names = [f"{i}-{j}.png" for j in range(1 + i % 2)]
        for name in names:
            Image.new("RGB", (32, 32), (40 * i % 255, 0, 0)).save(out / name)
        content = [{"type": "image"} for _ in names] + [{"type": "text", "text": PROMPT}]
        rows.append({"messages": [{"role": "user", "content": content}], "images": names, "answer": "1"})
    (out / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return out / "train.jsonl"


def _numel(parameters) -> int:
    return sum(p.numel() for p in {id(p): p for p in parameters}.values())  # a shared (tied) tensor once


def test_the_counts_are_the_real_models_part_by_part(vlm):
    from transformers import AutoConfig

    from relayrl.models.vision import vision_tower

    model, path = vlm
    shape = load_shape(str(path))
    tower = vision_tower(model)
    assert tower is not None
    text = [*model.model.text_model.parameters(), *model.lm_head.parameters()]
    assert shape.vision_params == _numel(tower.parameters())
    assert shape.connector_params == _numel(model.model.connector.parameters())
    assert shape.text_params == _numel(text) == count_params(AutoConfig.from_pretrained(path).text_config)
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert shape.vision_params + shape.connector_params + shape.text_params == shape.params
    assert (shape.image_tokens, shape.image_patches, shape.tied) == (IMAGE_TOKENS, PATCHES, True)
    assert shape.matmul_params == shape.text_params  # per token: the language model only (tied head)


def _plan(path, *overrides: str, hardware: str = "cpu"):
    config = load_config(None, [f"model.path={path}", "rollout.n=4", "rollout.prompts_per_step=2", *overrides])
    return make_plan(config, load_shape(str(path)), PROFILES[hardware], read_prompts=False)


@pytest.mark.parametrize("hardware", ["cpu", "H100-80GB"])
def test_a_frozen_tower_saves_exactly_its_grads_and_optimizer_state(vlm, hardware):
    frozen, trained = (_plan(vlm[1], f"model.freeze_vision={on}", hardware=hardware) for on in ("true", "false"))
    tower, precision = frozen.shape.vision_params, frozen.precision
    state = sum(b for name, b in precision.train_terms if "grad" in name or "Adam" in name)
    assert trained.memory.actor - frozen.memory.actor == tower * state
    assert trained.memory.actor == frozen.shape.params * precision.train_bytes
    for plan in (frozen, trained):  # the engine holds the tower whatever the learner does with it
        assert plan.memory.engine_weights == plan.shape.params * precision.infer_bytes


def test_a_push_leaves_the_frozen_tower_out_as_the_learner_does(vlm):
    from relayrl.models.vision import freeze_vision

    model, path = vlm
    frozen, trained = (_plan(path, f"model.freeze_vision={on}") for on in ("true", "false"))
    names = freeze_vision(model)  # what PolicyLearner.named_weights leaves out
    pushed = _numel(p for name, p in model.named_parameters() if name not in names)
    assert sync_params(frozen.shape, frozen.workload) == pushed == frozen.shape.params - frozen.shape.vision_params
    assert sync_params(trained.shape, trained.workload) == trained.shape.params
    assert frozen.time.sync / trained.time.sync == pytest.approx(pushed / trained.shape.params)
    two = replace(frozen.workload, learner_ranks=2)  # a sharded learner gathers only what it pushes
    assert gathered_bytes(frozen.shape, two) == pushed * 4 / 2


def test_the_encoder_flops_join_prefill_log_probs_and_the_update(vlm):
    overrides = ("train.epochs=2", "train.packing=none")  # two optimizer steps: an old log-prob pass too
    frozen, trained = (_plan(vlm[1], f"model.freeze_vision={on}", *overrides) for on in ("true", "false"))
    s, w = frozen.shape, frozen.workload
    assert (w.images_per_prompt, w.image_tokens_per_image) == (1.0, IMAGE_TOKENS)  # data not read: one assumed
    tower, connector = 2 * s.vision_params * PATCHES, 2 * s.connector_params * IMAGE_TOKENS
    images = w.rollout_batch
    encoder = encoder_time(s, w, 1.0, 1.0, 1.0)  # at 1 FLOP/s: FLOPs
    assert encoder.prefill == encoder.forward == (tower + connector) * images
    assert encoder.update == 2 * (tower + 3 * connector) * images  # 2 epochs; the frozen tower: forward only
    assert encoder_time(s, trained.workload, 1.0, 1.0, 1.0).update == 2 * 3 * (tower + connector) * images
    no_images = replace(w, images_per_prompt=0.0)
    assert encoder_time(s, no_images, 1.0, 1.0, 1.0).prefill == 0.0
    t, r = frozen.time, frozen.rates  # one engine replica, one learner device
    bare = estimate_time(s, no_images, frozen.memory, frozen.placement, frozen.hardware, frozen.precision, r)
    assert t.prefill - bare.prefill == pytest.approx(encoder.prefill / r.prefill)
    assert t.old_logprobs - bare.old_logprobs == pytest.approx(encoder.forward / r.forward)
    assert t.update - bare.update == pytest.approx(encoder.update / r.update)
    assert t.vision == pytest.approx(t.total - bare.total) and bare.vision == 0.0


def test_prompt_lengths_count_the_image_tokens_and_the_images_of_each_row(vlm, image_rows):
    config = load_config(None, [f"model.path={vlm[1]}", f"data.train={image_rows}", "data.max_prompt_tokens=64"])
    lengths = sample_prompt_lengths(config.data, config.model.path, config.rollout.prompts_per_step)
    assert not isinstance(lengths, str), lengths
    assert (lengths.sampled, lengths.images, lengths.image_tokens) == (8, 1.5, 1.5 * IMAGE_TOKENS)
    assert lengths.mean > lengths.image_tokens + len(PROMPT)  # the expanded ids, as the learner trains on them
    plan = make_plan(config, load_shape(str(vlm[1])), PROFILES["cpu"])
    assert (plan.workload.images_per_prompt, plan.workload.image_tokens_per_image) == (1.5, IMAGE_TOKENS)
    assert not plan.workload.packed  # the learner pads image batches


def test_relayrl_plan_prints_the_vision_part(vlm, image_rows, capsys):
    config = str(ROOT / "examples/vision_count/config.yaml")
    data = [f"data.train={image_rows}", f"data.eval={image_rows}"]  # the example's own data is made by prepare.py
    assert main(["plan", config, f"model.path={vlm[1]}", *data, "plan.hardware=cpu"]) == 0
    out = capsys.readouterr().out
    line = " ".join(out.split("vision:", 1)[1].split())
    assert "vision tower 0.11M params (frozen: no grads, no optimizer state, not synced)" in line
    assert f"{IMAGE_TOKENS} image tokens per image, 1.5 image(s) per prompt" in line
    for row in ("vision tower", "connector", "images per prompt", "in prompt tokens", "vision encoder"):
        assert f"│ {row} " in out, row
    assert "(P - T) x 16 + T x 4" in out  # the actor: the frozen tower at its fp32 weights only
