"""LoRA in the learner: only the adapter trains, the reference is the base with the adapter disabled (no
second copy), merged weights equal peft's own merge, checkpoints hold the adapter and resume exactly."""

import copy
import warnings

import pytest
import torch

from relayrl.config import load_config
from relayrl.errors import ConfigError, ConfigWarning
from relayrl.learner.critic import Critic
from relayrl.learner.policy import PolicyLearner
from relayrl.models import lora
from relayrl.placement.sections import learner_settings
from tests.reference import trainable_count
from tests.unit.test_learner import _experience

LORA = ["model.lora.rank=4", "model.lora.alpha=8", "train.lr=1e-2"]


def _config(model_dir, extra=()):
    overrides = [f"model.path={model_dir}", "rollout.n=4", "rollout.prompts_per_step=4", "rollout.engine=hf"]
    return load_config(None, overrides + LORA + list(extra))


def _tensor_count(learner) -> int:
    """Elements held by every tensor the learner owns (policy, reference), counting shared storage once."""
    seen, total = set(), 0
    modules = [learner.model] + ([learner.reference] if learner.reference is not None else [])
    for module in modules:
        for t in list(module.parameters()) + list(module.buffers()):
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel()
    return total


def test_reference_for_free_loads_no_second_copy(random_model_dir):
    kl = ["algorithm.kl.coef=0.1"]
    full = PolicyLearner(learner_settings(load_config(None, [f"model.path={random_model_dir}"] + kl)))
    adapted = PolicyLearner(learner_settings(_config(random_model_dir, kl)))
    base = _tensor_count(
        PolicyLearner(learner_settings(load_config(None, [f"model.path={random_model_dir}"])))
    )  # with buffers
    assert full.reference is not None and _tensor_count(full) == 2 * base  # full fine-tuning: a frozen copy
    assert adapted.reference is None and adapted.use_reference
    assert _tensor_count(adapted) == base + trainable_count(adapted.model)  # base + adapter, nothing else
    optimized = sum(p.numel() for group in adapted.optimizer.param_groups for p in group["params"])
    assert optimized == trainable_count(adapted.model) < base // 5


def test_reference_is_the_base_with_the_adapter_disabled(random_model_dir):
    learner = PolicyLearner(learner_settings(_config(random_model_dir, ["algorithm.kl.coef=0.1"])))
    plain = PolicyLearner(learner_settings(load_config(None, [f"model.path={random_model_dir}"])))
    exp = _experience(vocab=12)
    before = plain.logprobs(exp)
    learner.fill_logprobs(exp)
    assert torch.allclose(exp.ref_logprobs, before, atol=1e-6)  # B = 0: the adapted model starts as the base
    stats = learner.update(exp).metrics
    assert stats["actor/kl"] == pytest.approx(0.0, abs=1e-6)
    moved = learner.logprobs(exp)
    assert (moved - before).abs().max() > 1e-3  # the adapter learned something
    assert torch.allclose(learner.reference_logprobs(exp), before, atol=1e-6)  # the reference did not move


def test_merged_weights_match_peft_merge(random_model_dir):
    learner = PolicyLearner(learner_settings(_config(random_model_dir, ["sync.lora=merged"])))
    learner.update(_experience(vocab=12))
    merged = dict(learner.named_weights())
    expected = dict(copy.deepcopy(learner.model).merge_and_unload().named_parameters())
    assert merged.keys() == expected.keys()
    assert max(float((merged[k] - expected[k]).abs().max()) for k in merged) < 1e-6
    assert any(".lora_B" in n for n, _ in learner.model.named_parameters())  # the model was left unmerged


def test_adapter_mode_sends_only_adapter_tensors(random_model_dir):
    learner = PolicyLearner(learner_settings(_config(random_model_dir, ["rollout.engine=vllm", "sync.lora=adapter"])))
    assert learner.sync_mode == "adapter"
    sent = dict(learner.named_weights())
    assert sent and all(".lora_A." in n or ".lora_B." in n for n in sent)
    assert sum(t.numel() for t in sent.values()) == trainable_count(learner.model)


def test_adapter_sync_needs_an_engine_that_serves_adapters(random_model_dir):
    with pytest.raises(ConfigError, match="sync.lora=adapter"):
        PolicyLearner(learner_settings(_config(random_model_dir, ["sync.lora=adapter"])))


def test_unknown_target_module_names_the_key(random_model_dir):
    with pytest.raises(ConfigError, match="model.lora.target_modules"):
        PolicyLearner(learner_settings(_config(random_model_dir, ["model.lora.target_modules=[qkv_nowhere]"])))


def test_checkpoint_holds_the_adapter_and_resumes_exactly(random_model_dir, tmp_path):
    config = _config(random_model_dir, ["train.packing=none"])  # one forward layout on both sides
    first = PolicyLearner(learner_settings(config))
    first.update(_experience(seed=1, vocab=12))
    first.model.save_pretrained(tmp_path / "model")  # what save_checkpoint writes
    # a copy, as torch.save makes one: load_state_dict would otherwise share first's moment tensors
    state = copy.deepcopy({"optimizer": first.optimizer.state_dict(), "scheduler": first.scheduler.state_dict()})
    saved = {p.name for p in (tmp_path / "model").iterdir()}
    assert saved == {"adapter_config.json", "adapter_model.safetensors", "README.md"}
    resumed = PolicyLearner(learner_settings(config))
    resumed.load_model(tmp_path / "model")
    resumed.optimizer.load_state_dict(state["optimizer"])
    resumed.scheduler.load_state_dict(state["scheduler"])
    resumed.generator.set_state(first.generator.get_state())
    exp = _experience(seed=2, vocab=12)
    first.update(exp)
    resumed.update(exp)
    for (name, a), (_, b) in zip(first.named_weights(), resumed.named_weights()):
        assert torch.equal(a, b), name


def test_final_save_is_a_merged_model_with_the_adapter_beside_it(random_model_dir, tmp_path):
    from relayrl.models.loading import load_causal_lm

    learner = PolicyLearner(learner_settings(_config(random_model_dir)))
    learner.update(_experience(vocab=12))
    learner.save(tmp_path / "model")
    loaded = dict(load_causal_lm(tmp_path / "model").named_parameters())
    merged = dict(lora.merged_tensors(learner.model))
    assert all(torch.equal(loaded[k], merged[k]) for k in merged)
    assert lora.is_adapter_dir(tmp_path / "model" / lora.ADAPTER_DIR)


def test_critic_trains_its_own_adapter(random_model_dir):
    config = _config(random_model_dir, ["algorithm.advantage=gae", "critic.lr=1e-2"])
    critic = Critic(learner_settings(config), "cpu")
    exp = _experience(vocab=12)
    exp.values = critic.values(exp)
    exp.returns = exp.rewards[:, None].expand_as(exp.loss_mask) * exp.loss_mask
    before = critic.values(exp)
    critic.update(exp)
    assert (critic.values(exp) - before).abs().max() > 1e-4
    state = critic.trainable_state()
    assert state and all("lora_" in k or k.startswith("head.") for k in state)


def test_lora_at_a_full_fine_tuning_rate_warns():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config(None, ["model.lora.rank=8"])
        load_config(None, ["model.lora.rank=8", "train.lr=2e-4"])
    found = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    assert len(found) == 1 and "train.lr=1e-05, a full fine-tuning rate" in found[0]


def test_planner_counts_the_adapter_and_no_reference(random_model_dir):
    from dataclasses import replace

    from relayrl.models.shape import load_shape
    from relayrl.planner.estimate import (
        adapter_params,
        estimate_memory,
        precision_for,
        sync_params,
        workload_from_config,
    )
    from relayrl.planner.hardware import Hardware

    config = _config(random_model_dir, ["algorithm.kl.coef=0.1", "rollout.engine=vllm", "sync.lora=adapter"])
    shape, hardware = load_shape(str(random_model_dir)), Hardware("cpu", "cpu", 24, 10.0, 1.0, 10.0, 0.3, 1, "test")
    learner = PolicyLearner(learner_settings(config))
    assert adapter_params(shape, 4) == trainable_count(learner.model)  # counted as peft builds it
    shape_only = replace(shape, intermediate=None)  # the MLP width inferred from the parameter count
    assert adapter_params(shape_only, 4) == adapter_params(shape, 4)
    work, precision = workload_from_config(config), precision_for(hardware)
    memory = estimate_memory(shape, work, hardware, precision)
    assert memory.reference == 0 and memory.actor == shape.params * 4 + adapter_params(shape, 4) * 16
    assert sync_params(shape, work) == adapter_params(shape, 4)
    assert sync_params(shape, replace(work, lora_sync="merged")) == shape.params


def test_merged_push_reaches_the_hf_engine(random_model_dir):
    from relayrl.rollout.hf_engine import HFEngine
    from relayrl.rollout.local_group import LocalEngineGroup
    from relayrl.sync.inprocess import InProcessSync

    learner = PolicyLearner(learner_settings(_config(random_model_dir)))  # rollout.engine=hf: sync.lora=auto is merged
    assert learner.sync_mode == "merged"
    learner.update(_experience(vocab=12))
    engine, ids = HFEngine(str(random_model_dir)), [3, 4, 5, 6, 7, 8, 9]
    before = torch.tensor(engine.prompt_logprobs(ids))
    InProcessSync().push(learner, LocalEngineGroup(engine))
    with torch.no_grad():
        logits = learner.model(input_ids=torch.tensor([ids])).logits[0, :-1]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
    after = torch.tensor(engine.prompt_logprobs(ids))
    assert (after - before).abs().max() > 1e-3 and (after - expected).abs().max() < 1e-5


def test_adapter_keys_map_onto_fused_projections():
    from relayrl.errors import SyncError
    from relayrl.models.adapter_sync import map_adapter_keys

    served = {f"model.layers.0.{m}" for m in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj")}
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    key = "base_model.model.model.layers.0.{}.lora_{}.weight"
    mapped = map_adapter_keys([key.format("self_attn.v_proj", "B"), key.format("mlp.up_proj", "A")], served, packed)
    assert list(mapped.values()) == ["model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.gate_up_proj"]
    with pytest.raises(SyncError, match=r"mlp\.down_proj.*mlp\.gate_up_proj"):  # names the key and what exists
        map_adapter_keys([key.format("mlp.down_proj", "A")], served, packed)


def test_lora_on_sharded_learner_ranks_is_accepted():  # trained and pushed there: tests/unit/test_sharded_init.py
    overrides = ["model.lora.rank=4", "train.lr=1e-4", "placement.mode=ray", "placement.learner_ranks=2"]
    config = load_config(None, overrides)
    assert (config.model.lora.rank, config.placement.learner_ranks) == (4, 2)


def test_sync_lora_auto_is_decided_once_adapter_on_a_gpu_merged_on_cpu():
    """vLLM's CPU LoRA kernels made generation slower than the push they save (relayrl/sync/lora.py), so `auto`
    serves the adapter only on a GPU; the decision is written into the config the roles receive."""
    from types import SimpleNamespace

    from relayrl.sync.lora import resolve_lora_auto

    def config(engine):
        sync = SimpleNamespace(lora="auto")
        return SimpleNamespace(rollout=SimpleNamespace(engine=engine), sync=sync)

    for engine, cuda, expected in (("vllm", True, "adapter"), ("vllm", False, "merged"), ("hf", True, "merged")):
        c = config(engine)
        c.sync.lora = resolve_lora_auto(c.rollout.engine, cuda=lambda cuda=cuda: cuda)
        assert c.sync.lora == expected, (engine, cuda)
