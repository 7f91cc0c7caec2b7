"""`relayrl plan`: parameter count from config arithmetic, the seeds' 7B memory figures by hand, max vs sum,
and the step-time terms (FLOPs per token, decode bytes, engine fixed costs, optimizer bytes) by hand."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from relayrl.build import resolve
from relayrl.cli import main
from relayrl.config import load_config
from relayrl.planner import PROFILES, ModelShape, count_params, load_shape, make_plan
from relayrl.planner.estimate import Memory
from relayrl.planner.hardware import measure_cpu
from relayrl.planner.pass_probe import measure_pass_rates, whole_model
from relayrl.planner.placement import place
from relayrl.planner.probe import EngineOverhead, fit_engine_overhead, linear_shapes, measure_matmul_rates, split_reload
from relayrl.planner.timing import Rates, decode_step_time, engine_overhead_time, forward_flops_per_token, sync_time

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/grpo_7b/config.yaml"
SMALL = dict(
    vocab_size=101,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)  # GQA: 2 KV heads for 4 query heads


def planned(*args, **kwargs):
    """The config `relayrl plan` plans: loaded, then its `auto` choices made on this machine."""
    return resolve(load_config(*args, **kwargs))


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("attention_bias", [False, True])
def test_param_count_matches_a_real_llama(tied, attention_bias):
    config = LlamaConfig(**SMALL, tie_word_embeddings=tied, attention_bias=attention_bias)
    model = LlamaForCausalLM(config)
    assert count_params(config) == sum(p.numel() for p in model.parameters())


def test_param_count_matches_a_real_qwen2_with_qkv_bias():
    config = Qwen2Config(**SMALL, tie_word_embeddings=False)
    assert count_params(config) == sum(p.numel() for p in Qwen2ForCausalLM(config).parameters())


def test_example_7b_shape_is_qwen2_5_7b():
    shape = load_shape(str(ROOT / "examples/grpo_7b"))
    assert shape == ModelShape(
        params=7_615_616_512,
        layers=28,
        hidden=3584,
        kv_heads=4,
        head_dim=128,
        vocab=152064,
        heads=28,
        intermediate=18944,
        tied=False,
    )


def _plan_7b(hardware="H100-80GB", **kwargs):
    config = planned(EXAMPLE, ["algorithm.kl.coef=0.001", "learner.activation_checkpointing=false"])  # all kept
    shape = ModelShape(params=int(7e9), layers=28, hidden=3584, kv_heads=4, head_dim=128, vocab=152064)
    return make_plan(config, shape, PROFILES[hardware], **kwargs)


def test_7b_memory_matches_the_seeds_arithmetic():
    plan = _plan_7b()
    assert plan.precision.train_bytes == 4 + 4 + 4 + 4  # fp32 weight (the master), fp32 grad, Adam m, v
    assert plan.memory.actor == 7e9 * 16 == 112e9
    assert plan.memory.reference == plan.memory.engine_weights == 7e9 * 2 == 14e9
    assert plan.memory.kv_bytes_per_token == 28 * 4 * 128 * 2 * 2 == 57_344  # 56 KiB
    assert _plan_7b(fp32_master=False).memory.actor == 7e9 * 12
    # one H100 at 0.5 utilisation: 40 GB for the engine, 14 GB of it weights, the rest KV cache
    assert plan.memory.kv_capacity == pytest.approx(0.5 * 80e9 - 14e9)
    assert plan.memory.kv_tokens == int((40e9 - 14e9) // 57_344)
    assert plan.time.sync == pytest.approx(14e9 / 450e9)  # the seeds' 31 ms on-node broadcast


def test_reference_memory_is_zero_without_kl():
    config = planned(EXAMPLE, ["algorithm.kl.coef=0"])
    plan = make_plan(config, _plan_7b().shape, PROFILES["H100-80GB"])
    assert plan.memory.reference == 0 and plan.time.ref_logprobs == 0


def test_colocated_is_a_max_and_disaggregated_a_sum():
    gb = 1e9  # made-up roles on a 10 GB CPU-kind device: engine 1 + 2, actor 4, reference 1, activations 3
    memory = Memory(
        actor=4 * gb,
        critic=0.0,
        reference=1 * gb,
        engine_weights=1 * gb,
        kv_bytes_per_token=1,
        engine_devices=1,
        kv_capacity=2 * gb,
        kv_tokens=2,
        concurrent=1,
        activations=3 * gb,
        logits=0.0,
    )
    device = PROFILES["cpu"].__class__(**{**PROFILES["cpu"].__dict__, "memory_gb": 10})
    placement = place(memory, device, gpu_memory_utilization=0.5)
    assert placement.generate_phase == (1 + 2 + 4 + 1) * gb  # engine + resident actor and reference
    assert placement.train_phase == (4 + 1 + 3) * gb
    assert placement.colocated_peak == max(8, 8) * gb
    assert placement.disaggregated == (3 + 8) * gb
    assert (placement.colocated_devices, placement.trainer_devices, placement.rollout_devices) == (1, 1, 1)
    assert place(memory, device, 0.5, offload=True).generate_phase == 3 * gb


def test_time_sharing_bills_the_engines_weights_beside_the_learners_states_at_the_push():
    """rollout.sleep pushes before the learner offloads (relayrl/placement/time_sharing.py): an 80 GB GPU that
    holds each phase alone (generate 40 GB, update 65 GB) cannot hold the push's 30 + 60 GB."""
    gb = 1e9
    memory = Memory(
        actor=50 * gb,
        critic=0.0,
        reference=10 * gb,
        engine_weights=30 * gb,
        kv_bytes_per_token=1,
        engine_devices=1,
        kv_capacity=10 * gb,
        kv_tokens=2,
        concurrent=1,
        activations=5 * gb,
        logits=0.0,
    )
    h100 = PROFILES["H100-80GB"]
    placed = place(memory, h100, 0.5, offload=True, sleep=True)
    assert (placed.generate_phase, placed.train_phase, placed.push_phase) == (40 * gb, 65 * gb, 90 * gb)
    assert placed.colocated_peak == 90 * gb and placed.colocated_devices == 2
    assert place(memory, h100, 0.5, offload=True).push_phase == 0  # no sleep: the update already sits beside it
    ranks = place(replace(memory, ranks=2), h100, 0.5, offload=True, sleep=True)
    assert ranks.push_phase == (30 + 60 / 2) * gb and ranks.colocated  # 60 GB per device at W=2
    wider = replace(memory, ranks=2, actor=110 * gb)
    assert place(wider, h100, 0.5, offload=True, sleep=True).colocated is False  # 30 + 120 / 2 > 80 GB


SEVEN_B = ModelShape(params=int(7e9), layers=28, hidden=3584, kv_heads=4, head_dim=128, vocab=152064)


def test_decode_is_memory_bound_at_batch_1_and_compute_bound_for_a_huge_batch():
    h100 = PROFILES["H100-80GB"]
    bw, peak = 3350e9, 989e12
    seconds, bound = decode_step_time(SEVEN_B, 2, 1, 0, 57_344, bw, peak)
    assert bound == "memory" and seconds == pytest.approx(14e9 / 3350e9)  # the seeds' ~4.2 ms per token
    # batch 8 at 1000 tokens of context: the KV caches add 8 x 1000 x 56 KiB to the weights' 14 GB
    seconds, _ = decode_step_time(SEVEN_B, 2, 8, 1000, 57_344, bw, peak)
    assert seconds == pytest.approx((14e9 + 8 * 1000 * 57_344) / 3350e9)
    seconds, bound = decode_step_time(SEVEN_B, 2, 100_000, 0, 57_344, bw, peak)
    assert bound == "compute" and seconds == pytest.approx(2 * 7e9 * 100_000 / 989e12)
    assert h100.mem_bw_gbs * 1e9 == bw and h100.peak_tflops * 1e12 == peak


def test_a_shorter_mean_response_thins_a_compute_bound_decode_and_not_a_memory_bound_one():
    config = planned(
        None, ["rollout.n=8", "rollout.prompts_per_step=8", "rollout.max_tokens=16", "data.max_prompt_tokens=8"]
    )
    shape = ModelShape(params=10_000_000, layers=2, hidden=64, kv_heads=2, head_dim=32, vocab=100)  # weights >> KV
    slow_compute, slow_memory = replace(PROFILES["cpu"], peak_tflops=1e-4), replace(PROFILES["cpu"], mem_bw_gbs=0.01)
    for hardware, thinned in ((slow_compute, True), (slow_memory, False)):
        longest = make_plan(config, shape, hardware, longest_response_tokens=16, read_prompts=False).time
        mean = make_plan(
            config, shape, hardware, longest_response_tokens=16, mean_response_tokens=8, read_prompts=False
        ).time
        assert longest.decode_bound == ("compute" if thinned else "memory")
        # half the tokens: a compute-bound decode halves (the context is shorter too); a memory-bound one still
        # streams the weights every step
        assert mean.decode < (0.5 if thinned else 1.0) * longest.decode * 1.001
        assert mean.decode >= (0.4 if thinned else 0.95) * longest.decode  # memory: fewer KV caches read
        assert mean.decode_steps == longest.decode_steps == 16


def test_forward_flops_count_matmul_weights_and_attention():
    tied = ModelShape(params=1000, layers=2, hidden=8, kv_heads=2, head_dim=4, vocab=10, heads=2, tied=True)
    untied = ModelShape(params=1080, layers=2, hidden=8, kv_heads=2, head_dim=4, vocab=10, heads=2, tied=False)
    assert tied.matmul_params == 1000  # the tied embedding is the LM head: multiplied once
    assert untied.matmul_params == 1080 - 10 * 8  # the embedding lookup is a gather, not a matmul
    # 2 per weight + QK^T and AV: 2 x 2 x 2 layers x q_width 8 x 5 positions
    assert forward_flops_per_token(tied, context=5) == 2 * 1000 + 4 * 2 * 8 * 5 == 2320


def test_linear_shapes_are_the_real_models_matmul_weights():
    config = LlamaConfig(**SMALL, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    shape = load_shape_from(config)
    assert sum(fan_in * fan_out * count for fan_in, fan_out, count in linear_shapes(shape)) == linear
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    assert shape.matmul_params == linear + norms  # tied: the head is the embedding; norms are noise here


def load_shape_from(config):
    from relayrl.models.shape import shape_from_config

    return shape_from_config(config)


def test_engine_fixed_costs_are_recovered_from_exact_timings():
    per_call, per_step, per_token, per_sequence = 0.010, 0.002, 3e-5, 4e-4
    counts = [
        [1, steps, tokens, seqs]
        for steps, tokens, seqs in [(2, 16, 8), (24, 190, 8), (2, 512, 256), (24, 6000, 256), (12, 700, 64)]
    ]
    seconds = [per_call + per_step * s + per_token * t + per_sequence * q for _, s, t, q in counts]
    fitted = fit_engine_overhead(counts, seconds, "vllm")
    assert (fitted.per_call, fitted.per_step, fitted.per_token, fitted.per_sequence) == pytest.approx(
        (per_call, per_step, per_token, per_sequence)
    )
    assert engine_overhead_time(fitted, steps=6, tokens=1536, sequences=256) == pytest.approx(
        0.010 + 6 * 0.002 + 1536 * 3e-5 + 256 * 4e-4
    )
    assert engine_overhead_time(None, 6, 1536, 256) == 0.0


def test_update_is_three_forwards_per_epoch_plus_the_optimizer_bytes():
    config = planned(
        None,
        [
            "rollout.n=4",
            "rollout.prompts_per_step=2",
            "rollout.max_tokens=6",
            "data.max_prompt_tokens=10",
            "train.epochs=2",
            "train.mini_batch=4",
        ],
    )
    shape = ModelShape(params=1000, layers=2, hidden=8, kv_heads=2, head_dim=4, vocab=10, heads=2, tied=True)
    cpu = PROFILES["cpu"]
    plan = make_plan(config, shape, cpu)
    rate = cpu.peak_tflops * 1e12 * cpu.mfu
    tokens = 8 * (10 + 6)  # rollout batch x padded width
    forward = forward_flops_per_token(shape, context=16 / 2) * tokens
    assert plan.time.update == pytest.approx(3 * forward * 2 / rate)
    assert plan.time.old_logprobs == pytest.approx(forward / rate)  # 4 optimizer steps: a separate pass
    assert plan.time.optimizer == pytest.approx(4 * 2 * 16 * 1000 / (cpu.mem_bw_gbs * 1e9))  # 2 mini x 2 epochs
    assert plan.time.update_phase == plan.time.update + plan.time.optimizer
    assert plan.time.engine_overhead == 0.0  # a profile: no engine costs measured


def test_measured_engine_costs_enter_generate():
    config = planned(None, ["rollout.n=4", "rollout.prompts_per_step=2", "rollout.max_tokens=6"])
    shape = ModelShape(params=1000, layers=2, hidden=8, kv_heads=2, head_dim=4, vocab=10)
    plan = make_plan(config, shape, PROFILES["cpu"], longest_response_tokens=5)
    from relayrl.planner.timing import estimate_time

    engine = EngineOverhead(per_call=0.01, per_step=0.002, per_token=1e-5, per_sequence=1e-4, engine="vllm")
    rates = Rates(*[plan.rates.update, plan.rates.forward, plan.rates.decode, plan.rates.prefill], engine, "test")
    timed = estimate_time(shape, plan.workload, plan.memory, plan.placement, plan.hardware, plan.precision, rates)
    assert timed.engine_overhead == pytest.approx(0.01 + 5 * 0.002 + 8 * 5 * 1e-5 + 8 * 1e-4)
    assert timed.generate == pytest.approx(timed.prefill + timed.decode + timed.engine_overhead)
    assert timed.decode_steps == 5


def test_matmul_rates_at_the_models_shapes_are_positive():
    shape = load_shape_from(LlamaConfig(**SMALL))
    rates = measure_matmul_rates(shape, prefill_rows=64, decode_rows=4, repeats=1)
    assert rates.prefill > 0 and rates.decode > 0


def test_learner_pass_rates_run_the_models_own_layers(tmp_path):
    LlamaConfig(**SMALL).save_pretrained(tmp_path)
    rates = measure_pass_rates(str(tmp_path), load_shape(str(tmp_path)), rows=32, width=8, repeats=1)
    assert rates.update > 0 and rates.forward > 0 and rates.rows == 32


def test_a_pass_is_the_head_plus_every_layer():
    # one layer 5 s (head 2 + layer 3), two layers 8 s: a 10-layer pass is 2 + 10 x 3
    assert whole_model(5.0, 8.0, 10) == pytest.approx(32.0)
    assert whole_model(5.0, 4.0, 10) == pytest.approx(5.0)  # noise made the second layer free: the head alone


def test_engine_reload_splits_into_a_fixed_cost_and_a_cost_per_byte():
    fixed, per_byte = split_reload((0.015 + 1e6 * 2e-10, 1_000_000), (0.015 + 1e8 * 2e-10, 100_000_000))
    assert fixed == pytest.approx(0.015) and per_byte == pytest.approx(2e-10)
    engine = EngineOverhead(0.0, 0.0, 0.0, 0.0, "vllm", reload=fixed, reload_per_byte=per_byte)
    link = PROFILES["cpu"].link_gbs * 1e9
    assert sync_time(4e8, PROFILES["cpu"], engine) == pytest.approx(4e8 / link + 0.015 + 4e8 * 2e-10)
    assert sync_time(4e8, PROFILES["cpu"], None) == pytest.approx(4e8 / link)


def test_measure_cpu_reports_positive_rates():
    measured = measure_cpu(PROFILES["cpu"], copy_mb=8, matmul_n=128, repeats=1)
    assert measured.mem_bw_gbs > 0 and measured.peak_tflops > 0 and "measured" in measured.source


def test_cli_plan_prints_the_memory_lines(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the example's model.path is relative to the repository root
    assert main(["plan", "examples/grpo_7b/config.yaml", "plan.hardware=H100-80GB"]) == 0
    out = capsys.readouterr().out
    for line in (
        "actor",
        "reference",
        "KV bytes/token",
        "57,344 B",
        "colocated peak",
        "disaggregated",
        "recommendation",
    ):
        assert line in out


def test_cli_plan_with_shape_flags_and_no_model(capsys, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("rollout: {n: 4, prompts_per_step: 2, max_tokens: 8}\n")
    keys = ["plan.params=7e9", "plan.layers=28", "plan.hidden=3584", "plan.kv_heads=4", "plan.head_dim=128"]
    assert main(["plan", str(config), "plan.hardware=A100-80GB", *keys, "plan.vocab=152064"]) == 0
    assert "112.00 GB" in capsys.readouterr().out
    assert main(["plan", str(config)]) == 2  # no model.path and no flags: one line naming model.path
    assert "model.path" in capsys.readouterr().err


@pytest.mark.parametrize(
    "lengths, message",
    [
        (["plan.response_tokens=-3"], "plan.response_tokens=-3: a number of tokens, more than 0"),
        (["plan.mean_response_tokens=0"], "plan.mean_response_tokens=0: a number of tokens, more than 0"),
        (
            ["plan.mean_response_tokens=9"],
            "plan.mean_response_tokens=9 is over the longest response (rollout.max_tokens=8)",
        ),
        (
            ["plan.response_tokens=4", "plan.mean_response_tokens=5"],
            "plan.mean_response_tokens=5 is over the longest response (plan.response_tokens=4)",
        ),
    ],
)
def test_cli_plan_refuses_impossible_lengths_naming_the_key(capsys, tmp_path, lengths, message):
    config = tmp_path / "c.yaml"
    config.write_text("rollout: {n: 4, prompts_per_step: 2, max_tokens: 8}\n")
    shape = ["plan.params=7e9", "plan.layers=28", "plan.hidden=3584", "plan.kv_heads=4", "plan.head_dim=128"]
    assert main(["plan", str(config), *shape, "plan.vocab=152064", *lengths]) == 2
    assert message in capsys.readouterr().err


def test_expected_longest_prompt_and_response_set_the_padded_width_but_not_memory():
    from relayrl.planner.estimate import workload_from_config

    config = planned(
        None,
        [
            "rollout.max_tokens=64",
            "data.max_prompt_tokens=16",
            "rollout.n=4",
            "rollout.prompts_per_step=16",
            "train.packing=none",
        ],
    )
    full = workload_from_config(config)
    short = workload_from_config(config, longest_prompt_tokens=6, longest_response_tokens=32)
    # 64 sequences x (16 prompt + 64 response tokens), or x (6 + 32) when the batches are expected shorter
    assert full.tokens == 64 * 80 and short.tokens == 64 * 38
    assert short.seq_len == full.seq_len == 80  # memory still sized for the longest sequence


def test_packed_groups_set_the_tokens_per_pass_when_they_save_positions():
    from relayrl.planner.estimate import workload_from_config

    short = [
        "data.max_prompt_tokens=100",
        "rollout.max_tokens=8",
        "rollout.n=8",
        "rollout.prompts_per_step=4",
        "train.micro_batch=32",
    ]
    packed = workload_from_config(planned(None, short))
    # 4 groups x (100 + 8 x 8) instead of 32 rows x (100 + 8): the prompt is computed once per group
    assert packed.packed and packed.tokens == 4 * 164
    long = [
        "data.max_prompt_tokens=8",
        "rollout.max_tokens=100",
        "rollout.n=8",
        "rollout.prompts_per_step=4",
        "train.micro_batch=32",
    ]
    assert not workload_from_config(planned(None, long)).packed  # 4 x 808 is no saving over 32 x 108
    assert workload_from_config(planned(None, long + ["train.packing=groups"])).tokens == 4 * 808
    assert not workload_from_config(planned(None, short[:-1] + ["train.micro_batch=8"])).packed  # split groups


def test_plan_advises_the_hf_engine_for_a_tiny_model_on_cpu_only():
    from relayrl.planner.report import engine_advice

    tiny = ModelShape(params=600_000, layers=3, hidden=128, kv_heads=4, head_dim=32, vocab=16)
    config = planned(None, ["rollout.n=8", "rollout.prompts_per_step=32", "rollout.max_tokens=6"])
    assert "rollout.engine=hf is faster here" in engine_advice(make_plan(config, tiny, PROFILES["cpu"]))
    assert engine_advice(make_plan(config, tiny, PROFILES["H100-80GB"])) is None
    hf = planned(None, ["rollout.engine=hf"])
    assert engine_advice(make_plan(hf, tiny, PROFILES["cpu"])) is None
    big = ModelShape(params=27e6, layers=8, hidden=512, kv_heads=8, head_dim=64, vocab=16)
    assert engine_advice(make_plan(config, big, PROFILES["cpu"])) is None


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_learner_ranks_divide_the_states_not_the_activations(ranks):
    one, plan = _plan_7b(), _plan_7b(learner_ranks=ranks)
    m = plan.memory
    assert one.memory.states == 7e9 * (16 + 2)  # actor + a bf16 reference, whole
    assert m.states == 7e9 * (16 + 2)  # the reference's bf16 shards (estimate.reference_bytes)
    assert m.resident == m.states - 7e9 * 4  # between updates: no gradients
    assert m.rank_trainer - m.activations - m.logits - m.copies == pytest.approx(m.states / ranks)
    root = 152064 * 3584  # a tied head: FSDP2's root unit, gathered with its gradients in bf16, and one layer
    assert plan.shape.tied is None and m.copies == pytest.approx((root + (7e9 - root) / 28) * 2 * 2)
    assert one.memory.copies == 7e9 * 2  # one process: autocast's bf16 copy of every weight
    assert (m.activations, m.logits) == (one.memory.activations, one.memory.logits)  # micro-batches are per rank
    assert plan.placement.trainer_devices == plan.time.train_devices == ranks
    assert plan.time.update == pytest.approx(one.time.update * one.time.train_devices / ranks)
    # the sync first all-gathers the fp32 shards: each rank receives (W - 1)/W of P x 4 B over the link
    assert plan.time.gather == pytest.approx(7e9 * 4 * (ranks - 1) / ranks / 450e9)
    assert plan.time.total == pytest.approx(
        plan.time.generate
        + plan.time.old_logprobs
        + plan.time.ref_logprobs
        + plan.time.update_phase
        + plan.time.sync
        + plan.time.gather
    )
    assert one.time.gather == 0


def test_broadcast_gathers_once_with_or_without_checksums():
    """A broadcast's checksums follow their buckets (relayrl/sync/gather.py): one all-gather pass per push."""
    broadcast = ["placement.mode=ray", "placement.learner_ranks=4", "sync.transport=broadcast"]
    gathers = []
    for checksum in ("true", "false"):
        config = planned(EXAMPLE, [*broadcast, f"sync.checksum={checksum}"])
        gathers.append(make_plan(config, SEVEN_B, PROFILES["H100-80GB"]).time.gather)  # W from the config
    assert gathers[0] == pytest.approx(gathers[1]) and gathers[0] > 0


def test_two_ranks_of_7b_do_not_fit_80gb_and_four_do():
    # states 7e9 x 18 = 126 GB; activations + logits of a micro-batch of 4 x 1280 tokens ~ 20.6 GB per rank
    two, four = _plan_7b(learner_ranks=2), _plan_7b(learner_ranks=4)
    assert not two.placement.rank_fits and "do not fit" in two.placement.recommendation
    assert four.placement.rank_fits and four.placement.colocated and four.placement.colocated_devices == 4


def test_cli_plan_prints_the_smallest_learner_ranks_per_profile(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    whole = "learner.activation_checkpointing=false"  # every layer's activations kept (auto checkpoints on a GPU)
    assert main(["plan", "examples/grpo_7b/config.yaml", whole, "plan.hardware=H100-80GB", "plan.learner_ranks=1"]) == 0
    out = capsys.readouterr().out
    assert "smallest W that fits" in out
    rows = {line.split("│")[1].strip(): line.split("│")[3].strip() for line in out.splitlines() if "least W" in line}
    assert rows["H100-80GB"].startswith("W=4 (") and rows["A100-80GB"].startswith("W=4 (")
    assert rows["H200"].startswith("W=2 (")
    assert rows["cpu"].startswith("none")  # fp32 activations of one micro-batch alone exceed 24 GB
    small = ["algorithm.kl.coef=0", "train.micro_batch=1"]  # 122 GB of states + 5 GB: one H200 holds it
    assert main(["plan", "examples/grpo_7b/config.yaml", *small, "plan.hardware=H200", "plan.learner_ranks=2"]) == 0
    out = capsys.readouterr().out
    assert "gather per sync" in out and "smallest W" not in out


def test_the_recommendation_is_a_placement_the_code_expresses_with_its_overrides():
    """7B on H100s: colocated time-sharing (rollout.sleep auto on a GPU) fits 4 colocated pairs; with the engine
    awake while training it does not, and the advice is disaggregated. Either set of overrides loads."""
    from relayrl.planner import get_profile, load_shape, make_plan

    example = "examples/grpo_7b/config.yaml"
    kept = ["learner.activation_checkpointing=false"]  # awake, a checkpointed update fits beside it on 8 pairs
    config = planned(example, kept)
    hardware = get_profile("H100-80GB")
    shared = make_plan(config, load_shape(config.model.path), hardware, read_prompts=False)
    assert shared.sleep and shared.advice.overrides == (
        "placement.mode=ray", "placement.layout=colocated", "placement.learner_ranks=4", "placement.engines=4"
    )  # fmt: skip
    awake = planned(example, [*kept, "rollout.sleep=off"])
    apart = make_plan(awake, load_shape(awake.model.path), hardware, read_prompts=False).advice
    assert apart.text.startswith("disaggregated") and "placement.layout=disaggregated" in apart.overrides
    for overrides in (shared.advice.overrides, apart.overrides):
        placed = planned(example, [*kept, *overrides]).placement
        assert placed.mode == "ray" and placed.learner_ranks in (4, 5, 8)


def test_a_measurement_on_a_busy_machine_is_said_in_the_plan(monkeypatch, capsys):
    import relayrl.planner as planner
    from relayrl.planner import get_profile, load_shape, make_plan
    from relayrl.planner.report import print_plan

    config = planned("examples/grpo_7b/config.yaml")
    cpu = get_profile("cpu")
    monkeypatch.setattr(planner, "_measured_rates", lambda *args: planner.profile_rates(cpu))
    monkeypatch.setattr(planner.os, "getloadavg", lambda: (64.0, 1.0, 1.0))
    plan = make_plan(config, load_shape(config.model.path), cpu, read_prompts=False, measure=True)
    assert plan.busy.startswith("measured at load average 64.0 on ")
    print_plan(plan)
    assert "note: measured at load average 64.0" in " ".join(capsys.readouterr().out.split())
    monkeypatch.setattr(planner.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    assert make_plan(config, load_shape(config.model.path), cpu, read_prompts=False, measure=True).busy == ""


def test_cli_plan_old_flags_still_work_with_one_deprecation_line(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = ["plan", "examples/grpo_7b/config.yaml", "--hardware", "H100-80GB", "--learner-ranks", "1", "--no-master"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "smallest W that fits" in captured.out
    lines = [line for line in captured.err.splitlines() if "deprecated" in line]
    assert len(lines) == 1, captured.err
    for key in ("plan.hardware=H100-80GB", "plan.learner_ranks=1", "plan.fp32_master=false"):
        assert key in lines[0]


@pytest.mark.parametrize(
    "override, named",
    [
        ("plan.hardwre=H200", "'plan.hardwre' (in the overrides); did you mean 'plan.hardware'"),
        ("rollout.nn=4", "'rollout.nn'"),
    ],
)
def test_cli_plan_an_unknown_key_is_one_error_naming_it(capsys, override, named):
    assert main(["plan", str(ROOT / "examples/grpo_7b/config.yaml"), override]) == 2
    err = capsys.readouterr().err
    assert named in err and err.count("\n") == 1


def test_cli_plan_without_a_config_plans_the_defaults_and_the_keys(capsys, random_model_dir):
    assert main(["plan", f"model.path={random_model_dir}", "plan.hardware=cpu", "rollout.n=4"]) == 0
    out, err = capsys.readouterr()
    assert "actor" in out and "deprecated" not in err
