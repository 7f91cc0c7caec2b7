"""`relayrl plan`'s step-time side, by hand: decode bound by memory or compute, FLOPs per token, the real models'
matmul shapes, engine fixed costs and reload fitted from timings, the update's forwards and optimizer bytes, the
sync's gather, and the measuring probes (matmul, learner pass, CPU) returning positive rates. Memory:
test_planner_memory.py; the CLI and its advice: test_planner_cli.py."""

from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from relayrl.planner import PROFILES, ModelShape, load_shape, make_plan
from relayrl.planner.hardware import measure_cpu
from relayrl.planner.pass_probe import measure_pass_rates, whole_model
from relayrl.planner.probe import EngineOverhead, fit_engine_overhead, linear_shapes, measure_matmul_rates, split_reload
from relayrl.planner.timing import Rates, decode_step_time, engine_overhead_time, forward_flops_per_token, sync_time
from tests.unit.planner_helpers import EXAMPLE, SEVEN_B, SMALL, load_shape_from, planned


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


def test_broadcast_gathers_once_with_or_without_checksums():
    """A broadcast's checksums follow their buckets (relayrl/sync/gather.py): one all-gather pass per push."""
    broadcast = ["placement.mode=ray", "placement.learner_ranks=4", "sync.transport=broadcast"]
    gathers = []
    for checksum in ("true", "false"):
        config = planned(EXAMPLE, [*broadcast, f"sync.checksum={checksum}"])
        gathers.append(make_plan(config, SEVEN_B, PROFILES["H100-80GB"]).time.gather)  # W from the config
    assert gathers[0] == pytest.approx(gathers[1]) and gathers[0] > 0
