"""LoRA through vLLM's CPU backend: the adapter a learner trains reaches the engine and changes what it
serves, as the same numbers a merged push gives; each version is a new adapter; a request started on one
version finishes on it while the next loads. One engine (serving adapters) for the module."""

import pytest
import torch

from relayrl.config import load_config
from relayrl.errors import SyncError
from relayrl.learner.policy import PolicyLearner
from relayrl.models import lora
from relayrl.models.adapter_sync import map_adapter_keys
from relayrl.models.loading import load_causal_lm
from relayrl.placement.sections import engine_settings, learner_settings
from tests.unit.test_learner import _experience

pytestmark = pytest.mark.vllm

PROBE = [3, 4, 5, 6, 7, 8, 9, 10, 11, 5, 6, 7, 12, 4]  # token ids of the tiny vocabulary


def _config(model_dir, extra=()):
    overrides = [f"model.path={model_dir}", "rollout.engine=vllm", "rollout.n=4", "rollout.prompts_per_step=4"]
    overrides += ["model.lora.rank=4", "model.lora.alpha=8", "train.lr=1e-2", "train.packing=none", "sync.lora=adapter"]
    return load_config(None, overrides + list(extra))


@pytest.fixture(scope="module")
def config(random_model_dir):
    return _config(random_model_dir)


@pytest.fixture(scope="module")
def engine(config):
    from relayrl.rollout.vllm_engine import VLLMEngine

    # the start itself runs the checks: key mapping and "a non-zero adapter changes the log-probs"
    return VLLMEngine(str(config.model.path), max_model_len=64, seed=0, adapter=engine_settings(config).adapter())


@pytest.fixture(scope="module")
def learner(config):
    learner = PolicyLearner(learner_settings(config))
    learner.update(_experience(vocab=12))  # a trained, non-zero adapter
    return learner


def _learner_logprobs(learner, ids):
    with torch.no_grad():
        logits = learner.model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


def test_adapter_keys_map_onto_the_engines_fused_modules(engine, config):
    from vllm.lora.layers import BaseLayerWithLoRA

    model = engine._worker().model_runner.get_model()
    served = {n for n, m in model.named_modules() if isinstance(m, BaseLayerWithLoRA)}
    assert "model.layers.0.self_attn.qkv_proj" in served and "model.layers.0.mlp.gate_up_proj" in served
    mapped = map_adapter_keys(engine_settings(config).adapter().shapes, served, model.packed_modules_mapping)
    prefix = "base_model.model.model.layers.1."
    assert mapped[prefix + "self_attn.k_proj.lora_B.weight"] == "model.layers.1.self_attn.qkv_proj"
    assert mapped[prefix + "mlp.up_proj.lora_A.weight"] == "model.layers.1.mlp.gate_up_proj"
    assert mapped[prefix + "mlp.down_proj.lora_A.weight"] == "model.layers.1.mlp.down_proj"
    stray = "base_model.model.model.layers.1.self_attn.rotary.lora_A.weight"
    with pytest.raises(SyncError, match="rotary"):
        map_adapter_keys([stray], served, model.packed_modules_mapping)


def test_an_adapter_the_engine_ignores_stops_the_start(engine):
    model = engine._worker().model_runner.get_model()
    ignores_adapter = lambda ids, adapter=None: engine.prompt_logprobs(ids)  # noqa: E731 - a broken engine
    with pytest.raises(SyncError, match="changed no log-prob"):
        engine.adapters.check(model, ignores_adapter)


def test_trained_adapter_matches_the_learner_and_a_merged_push(engine, learner):
    base = torch.tensor(engine.prompt_logprobs(PROBE))
    engine.load_weights(learner.named_weights(), version=1)
    served = torch.tensor(engine.prompt_logprobs(PROBE))
    assert (served - base).abs().max() > 1e-3  # the non-zero adapter changes the engine's output
    assert (served - _learner_logprobs(learner, PROBE)).abs().max() <= 1e-3
    # the merged path: the same update as full weights, served without an adapter
    current, engine.adapters.current = engine.adapters.current, None
    try:
        engine.load_base_weights(lora.merged_tensors(learner.model))
        merged = torch.tensor(engine.prompt_logprobs(PROBE))
        base_model = load_causal_lm(learner.settings.model.path)  # put the base back for the other tests
        engine.load_base_weights((n, p.detach()) for n, p in base_model.named_parameters())
    finally:
        engine.adapters.current = current
    assert (merged - served).abs().max() <= 1e-4


def test_each_version_is_a_new_adapter_and_old_ones_are_evicted(engine, learner):
    keep = engine.adapters.spec.keep
    names = []
    for version in (2, 3, 3, 4):  # 3 twice: a re-push (engine restart, resume) still gets a new name
        engine.load_weights(learner.named_weights(), version)
        names.append((engine.adapters.current.lora_name, engine.adapters.current.lora_int_id))
    assert len(set(names)) == 4 and names[-1][0].startswith("relayrl-v4-")
    loaded = engine.llm.llm_engine.list_loras()
    assert loaded == {r.lora_int_id for r in engine.adapters.loaded} and len(loaded) == keep
    assert engine.version == 4


def test_a_request_started_on_v_finishes_on_v_while_v_plus_1_loads(engine, learner):
    from vllm import SamplingParams

    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompt = {"prompt_token_ids": PROBE[:6]}
    engine.load_weights(learner.named_weights(), version=5)
    on_v = engine.llm.generate([prompt], greedy, use_tqdm=False, lora_request=engine.adapters.current)
    started = engine.adapters.current
    core = engine.llm.llm_engine
    core.add_request("inflight", prompt, greedy, lora_request=started)
    outputs = core.step() + core.step()  # the request is running on v
    moved = {k: v.clone() for k, v in lora.adapter_tensors(learner.model)}
    moved = {k: v + 0.5 * torch.randn_like(v) if ".lora_B." in k else v for k, v in moved.items()}
    engine.load_weights(moved.items(), version=6)  # v+1 loads mid-flight
    while core.has_unfinished_requests():
        outputs += core.step()
    finished = [o for o in outputs if o.request_id == "inflight" and o.finished][0]
    assert list(finished.outputs[0].token_ids) == list(on_v[0].outputs[0].token_ids)
    on_next = engine.llm.generate([prompt], greedy, use_tqdm=False, lora_request=engine.adapters.current)
    assert on_next[0].outputs[0].token_ids != on_v[0].outputs[0].token_ids  # v+1 really differs
