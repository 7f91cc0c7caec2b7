"""The PPO critic and LoRA on a vision-language model (a tiny Idefics3 with random weights, image rows of
test_vision_sharded.py).

The critic's value head sits on the language model's hidden size (Idefics3's config nests it in text_config),
its values depend on the pictures (the body reads the rows' pixel values), and `model.freeze_vision` leaves its
tower as loaded through an update. LoRA adapts the language model only: no adapter in the vision tower or the
connector, where vLLM could not serve it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from relayrl.placement.sections import learner_settings
from relayrl.types import ImageBatch
from tests.unit.test_sharded_scenarios import config
from tests.unit.test_vision_sharded import image_experience, write_task


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vision_critic")
    write_task(root)
    return root


def critic_of(task: Path):
    from relayrl.learner.critic import Critic

    critic = Critic(
        learner_settings(config(task / "model", ["algorithm.advantage=gae", "model.freeze_vision=true"])), "cpu"
    )
    torch.nn.init.normal_(critic.model.head.weight, generator=torch.Generator().manual_seed(0))
    return critic


def test_critic_values_read_the_pictures(task):
    critic = critic_of(task)
    exp = image_experience(task)
    assert exp.images is not None
    values = critic.values(exp)
    reversed_rows = ImageBatch(exp.images.rows[::-1])  # same tokens, each row another prompt's picture
    other = critic.values(dataclasses.replace(exp, images=reversed_rows))
    mask = exp.loss_mask.bool()
    assert values[mask].abs().max() > 0 and (values - other)[mask].abs().max() > 1e-4


def test_critic_update_leaves_a_frozen_tower_and_moves_the_rest(task):
    critic = critic_of(task)
    exp = image_experience(task)
    exp.values = critic.values(exp)
    exp.returns = exp.values + exp.loss_mask  # regress every response position one higher
    before = {n: p.detach().clone() for n, p in critic.model.named_parameters()}
    stats = critic.update(exp)
    after = dict(critic.model.named_parameters())
    tower = [n for n in before if ".vision_model." in n]
    assert tower and {f"body.{n}" for n in critic.model.frozen} == set(tower)
    assert all(torch.equal(after[n], before[n]) for n in tower)
    moved = [n for n in before if n not in tower and not torch.equal(after[n], before[n])]
    assert "head.weight" in moved and any(".text_model." in n for n in moved)
    assert stats["critic/value_loss"] > 0


def test_lora_adapts_the_language_model_only(task):
    from transformers import AutoModelForImageTextToText

    from relayrl.config import load_config
    from relayrl.models.lora import adapter_layout, add_adapter

    settings = load_config(None, [f"model.path={task / 'model'}", "model.lora.rank=4", "train.lr=1e-4"]).model.lora
    model = add_adapter(AutoModelForImageTextToText.from_pretrained(task / "model"), settings)
    adapted = [n for n, p in model.named_parameters() if p.requires_grad]
    assert adapted and all(".text_model.layers." in n and ".lora_" in n for n in adapted)
    _, shapes = adapter_layout(task / "model", settings)  # what a vLLM engine checks before the first push
    assert len(shapes) == len(adapted) and all(".text_model." in name for name in shapes)
