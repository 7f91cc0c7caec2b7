"""The planner's learner memory (counted against what torch really saves), its token-budget and long-response
sizing, the prompt lengths it reads from data.train, and the engine reload in the sync (issue 18)."""

import json

import pytest
import torch

from relayrl.config import load_config
from relayrl.planner import PROFILES, ModelShape, load_shape, make_plan
from relayrl.planner.estimate import workload_from_config
from relayrl.planner.learner_memory import layer_values, learner_peak
from relayrl.planner.probe import EngineOverhead
from relayrl.planner.prompts import sample_prompt_lengths
from relayrl.planner.report import print_plan
from relayrl.planner.timing import Rates, estimate_time


def saved_bytes_per_token(model_dir, positions: int, checkpointing: bool) -> float:
    """Bytes the forward of `model_dir`'s model saves for its backward, per position (distinct storages)."""
    from relayrl.learner.activation_checkpointing import enable_activation_checkpointing
    from relayrl.models.loading import load_causal_lm

    model = load_causal_lm(model_dir, "cpu").eval()
    if checkpointing:
        enable_activation_checkpointing(model)
    storages = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    ids = torch.randint(3, model.config.vocab_size, (2, positions // 2))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model.model(input_ids=ids, attention_mask=torch.ones_like(ids))
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in storages.items() if ptr not in parameters) / positions


@pytest.mark.parametrize("checkpointing", [False, True])
def test_counted_activations_match_what_torch_saves(random_model_dir, checkpointing):
    shape = load_shape(str(random_model_dir))
    measured = saved_bytes_per_token(random_model_dir, 256, checkpointing)
    peak = learner_peak(shape, 256, 0, 4, checkpointing)
    assert peak.kept / 256 == pytest.approx(measured, rel=0.1)
    per_layer = 4 * 64 + 4 * 64 + 4 * 64 + 4 * 128 + 2  # h=q=kv=64, I=128, 2 heads
    assert layer_values(shape) == per_layer
    assert peak.kept == 256 * 4 * (2 * (64 if checkpointing else per_layer) + 2 * 64)
    assert peak.backward == 256 * 4 * (per_layer + 64 if checkpointing else 3 * 64)


SHAPE = ModelShape(params=100_000, layers=2, hidden=64, kv_heads=2, head_dim=32, vocab=100, heads=2, intermediate=128)


def _memory(overrides: list[str], response: int):
    base = ["rollout.n=8", "rollout.prompts_per_step=1", "data.max_prompt_tokens=8", "train.packing=none"]
    config = load_config(None, base + [f"rollout.max_tokens={response}", *overrides])
    return make_plan(config, SHAPE, PROFILES["cpu"], read_prompts=False).memory


def test_long_responses_grow_count_micro_batches_linearly_and_a_token_budget_not_at_all():
    count = [_memory(["train.micro_batch=8"], n).learner for n in (1024, 4096, 16384)]
    assert [p.positions for p in count] == [8 * 1032, 8 * 4104, 8 * 16392]
    slope = [(b.activations - a.activations) / (b.positions - a.positions) for a, b in zip(count, count[1:])]
    assert slope[0] == pytest.approx(slope[1])  # a line in the response length
    budget = [_memory(["train.micro_batch_tokens=8256"], n).learner for n in (1024, 4096, 16384)]
    assert [p.positions for p in budget] == [8 * 1032, 2 * 4104, 16392]  # one sample over it: alone
    checkpointed = _memory(["train.micro_batch=8", "learner.activation_checkpointing=true"], 16384)
    assert checkpointed.activations < 0.75 * count[-1].activations


def test_logits_chunk_bounds_the_logits_and_zero_takes_every_position():
    chunked = _memory(["train.micro_batch=8", "train.logits_chunk=1024"], 4096).learner
    assert chunked.logits == 5 * 1024 * 100 * 4
    whole = _memory(["train.micro_batch=8", "train.logits_chunk=0"], 4096).learner
    assert whole.logits == (8 * 4104 + 5 * 8 * 4096) * 100 * 4


def test_prompt_lengths_are_read_through_the_tokenizer_and_shown(random_model_dir, tmp_path, capsys):
    rows = [{"prompt": "1+2=" * (1 + i % 4), "answer": "3"} for i in range(40)]  # 4, 8, 12, 16 characters
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    overrides = [f"model.path={random_model_dir}", f"data.train={data}", "rollout.prompts_per_step=4"]
    config = load_config(None, overrides + ["train.micro_batch_tokens=256"])
    lengths = sample_prompt_lengths(config.data, config.model.path, config.rollout.prompts_per_step)
    bos = len(__import__("transformers").AutoTokenizer.from_pretrained(random_model_dir)("1")["input_ids"]) - 1
    assert (lengths.sampled, lengths.longest) == (40, 16 + bos) and lengths.mean == pytest.approx(10 + bos)
    plan = make_plan(config, load_shape(str(random_model_dir)), PROFILES["cpu"])
    assert plan.workload.prompt == lengths.batch_longest and plan.workload.prompt_mean == lengths.mean
    print_plan(plan)
    out = capsys.readouterr().out
    assert "40 of 40 rows" in out and "train.micro_batch_tokens 256" in out and "x seq" not in out
    bare = load_config(None, overrides[:1])
    assert isinstance(
        sample_prompt_lengths(bare.data, bare.model.path, bare.rollout.prompts_per_step), str
    )  # no data.train: says so


def test_a_measured_engine_reload_is_part_of_the_sync():
    config = load_config(None, ["rollout.n=4", "rollout.prompts_per_step=2", "rollout.max_tokens=6"])
    plan = make_plan(config, SHAPE, PROFILES["cpu"], read_prompts=False)
    engine = EngineOverhead(0.0, 0.0, 0.0, 0.0, "vllm", reload=0.013)
    rates = Rates(plan.rates.update, plan.rates.forward, plan.rates.decode, plan.rates.prefill, engine, "test")
    timed = estimate_time(SHAPE, plan.workload, plan.memory, plan.placement, plan.hardware, plan.precision, rates)
    assert timed.sync == pytest.approx(plan.time.sync + 0.013)
    assert workload_from_config(config).prompt_mean == 256  # nothing read: the limit
