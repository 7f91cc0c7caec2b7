"""Image prompts through both engines and the learner: the behaviour log-probs the engine reports are the learner's
on the same tokens within 1e-3, before and after a push that changed every trained weight (the tied LM head
included); `model.freeze_vision` keeps the vision tower as loaded and leaves it out of the push.

A tiny Idefics3 (relayrl/models/tiny_vlm.py) with random weights, on four vision_count pictures.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from relayrl.placement.sections import learner_settings
from relayrl.types import Sampling, Score

ROOT = Path(__file__).resolve().parents[2]


def _prepare_module():
    example = ROOT / "examples/vision_count"
    sys.path.insert(0, str(example))  # prepare.py imports its sibling squares.py
    try:
        spec = importlib.util.spec_from_file_location("vision_count_prepare", example / "prepare.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(example))


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    """(model dir, 32 image prompts)."""
    from relayrl.data.source import load_prompts
    from relayrl.models.loading import load_tokenizer
    from relayrl.models.tiny_vlm import build_tiny_vlm

    prepare = _prepare_module()
    root = tmp_path_factory.mktemp("vision")
    task = prepare.write_task(root / "data", train=32, heldout=1, sft=1, seed=0)
    build_tiny_vlm(prepare.corpus(), root / "model", seed=0)
    prompts, _ = load_prompts(task["train"], load_tokenizer(str(root / "model")), 64)
    return root / "model", prompts


def learner_for(model_dir, freeze_vision=True):
    from relayrl.config import load_config
    from relayrl.learner.role import LearnerRole

    overrides = [f"model.path={model_dir}", "rollout.n=4", "rollout.prompts_per_step=4", "train.lr=1e-2"]
    return LearnerRole(
        learner_settings(load_config(None, [*overrides, f"model.freeze_vision={str(freeze_vision).lower()}"]))
    )


def experience(rollouts):
    from relayrl.algorithms.advantages import grpo, make_inputs
    from relayrl.learner.batching import make_experience

    rewards = [Score(float(r.group_index % 2) + 0.1 * len(r.response_ids)) for r in rollouts]
    exp = make_experience(rollouts, rewards, pad_id=0)
    exp.advantages, _ = grpo(make_inputs(exp.rewards, exp.loss_mask, exp.group_ids))
    return exp


def worst_gap(learner, rollouts) -> float:
    exp = experience(rollouts)
    got = learner.policy.logprobs(exp)
    return float(((got - exp.behaviour_logprobs) * exp.loss_mask).abs().max())


def make_engine(kind, model_dir):
    if kind == "hf":
        from relayrl.rollout.hf_engine import HFEngine

        return HFEngine(str(model_dir))
    from relayrl.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(str(model_dir), max_model_len=128, seed=0)


@pytest.mark.parametrize("kind", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_engine_logprobs_on_image_prompts_are_the_learners_before_and_after_a_push(vlm, kind):
    model_dir, many_prompts = vlm
    prompts = many_prompts[:4]
    engine, learner = make_engine(kind, model_dir), learner_for(model_dir)
    sampling = Sampling(n=4, temperature=1.0, max_tokens=4, seed=7)
    rollouts = engine.generate(prompts, sampling, 0)
    assert len(rollouts) == 16 and all(r.prompt.image_inputs for r in rollouts)
    assert worst_gap(learner, rollouts) < 1e-3
    if kind == "vllm":
        kept_across_sleep(engine, model_dir)
    # seeded requests past one step's 2048-token prefill budget (256 x 40 tokens): vLLM on CPU prefills each whole
    # (a chunked one crashed: "CPU Generator does not use offset", relayrl/rollout/vllm_engine.py)
    many = engine.generate(many_prompts, Sampling(n=8, temperature=1.0, max_tokens=2, seed=3), 0)
    assert sum(len(r.prompt.token_ids) for r in many) > 2048

    exp = experience(rollouts)
    learner.update(0, learner.prepare(exp))
    engine.load_weights(learner.named_weights(), 1)
    after = engine.generate(prompts, sampling, 1)
    assert worst_gap(learner, after) < 1e-3
    # the push did change what the engine serves (lr 1e-2 on every text weight, the tied head among them)
    assert worst_gap(learner_for(model_dir), after) > 1e-2


def kept_across_sleep(engine, model_dir):
    """The tower's vLLM names are what each worker keeps across a level-2 sleep (issue 45: a frozen tower dropped by
    sleep served garbage image features), and vLLM's own retention accepts them: its `_save_sleep_parameters` raises
    on a name that matches no served parameter. vLLM's CPU build cannot sleep, so that step is called by hand."""
    from types import SimpleNamespace

    from vllm.v1.worker.gpu_worker import Worker

    from relayrl.models.loading import load_causal_lm
    from relayrl.rollout.vllm_tower import preserve_tower, tower_parameter_names

    names = preserve_tower(engine.llm)
    worker = engine._worker()
    served = dict(worker.model_runner.get_model().named_parameters())
    hf_tower = tower_parameter_names(load_causal_lm(str(model_dir), "cpu"))
    assert hf_tower and all(".vision_model." in name for name in hf_tower)  # vLLM fuses q/k/v: other names there
    assert names and set(names) == {name for name in served if ".vision_model." in name}
    assert worker.model_config.sleep_preserve_parameter_names == names
    retention = SimpleNamespace(model_config=worker.model_config, _get_sleep_parameters=lambda m: served)
    Worker._save_sleep_parameters(retention, worker.model_runner.get_model())  # type: ignore[arg-type]


def test_freeze_vision_keeps_the_tower_as_loaded_and_out_of_the_push(vlm):
    from relayrl.models.vision import vision_tower

    model_dir, prompts = vlm[0], vlm[1][:4]
    rollouts = make_engine("hf", model_dir).generate(prompts, Sampling(n=4, max_tokens=4, seed=1), 0)
    for freeze in (True, False):
        learner = learner_for(model_dir, freeze)
        tower = vision_tower(learner.policy.model)
        assert tower is not None
        before = {n: p.detach().clone() for n, p in learner.policy.model.named_parameters()}
        learner.update(0, learner.prepare(experience(rollouts)))
        moved = {n for n, p in learner.policy.model.named_parameters() if not torch.equal(p, before[n])}
        pushed = {n for n, _ in learner.named_weights()}
        tower_names = {n for n in before if ".vision_model." in n}
        assert tower_names and {n for n in moved if ".connector." in n} and {n for n in moved if ".text_model." in n}
        if freeze:
            assert not moved & tower_names and not pushed & tower_names
            assert pushed == set(before) - tower_names
        else:
            assert moved & tower_names and pushed == set(before)
