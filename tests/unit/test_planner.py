"""`relayrl plan`: parameter count from config arithmetic, the seeds' 7B memory figures by hand, max vs sum."""

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from relayrl.cli import main
from relayrl.config import load_config
from relayrl.planner import PROFILES, ModelShape, count_params, load_shape, make_plan
from relayrl.planner.estimate import Memory, decode_step_time, place
from relayrl.planner.hardware import measure_cpu

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/grpo_7b/config.yaml"
SMALL = dict(vocab_size=101, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)  # GQA: 2 KV heads for 4 query heads


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
    assert shape == ModelShape(params=7_615_616_512, layers=28, hidden=3584, kv_heads=4, head_dim=128, vocab=152064)


def _plan_7b(hardware="H100-80GB", **kwargs):
    config = load_config(EXAMPLE, ["algorithm.kl.coef=0.001"])
    shape = ModelShape(params=int(7e9), layers=28, hidden=3584, kv_heads=4, head_dim=128, vocab=152064)
    return make_plan(config, shape, PROFILES[hardware], **kwargs)


def test_7b_memory_matches_the_seeds_arithmetic():
    plan = _plan_7b()
    assert plan.precision.train_bytes == 2 + 2 + 4 + 4 + 4  # bf16 w, bf16 g, fp32 master, Adam m, v
    assert plan.memory.actor == 7e9 * 16 == 112e9
    assert plan.memory.reference == plan.memory.engine_weights == 7e9 * 2 == 14e9
    assert plan.memory.kv_bytes_per_token == 28 * 4 * 128 * 2 * 2 == 57_344  # 56 KiB
    assert _plan_7b(fp32_master=False).memory.actor == 7e9 * 12
    # one H100 at 0.5 utilisation: 40 GB for the engine, 14 GB of it weights, the rest KV cache
    assert plan.memory.kv_capacity == pytest.approx(0.5 * 80e9 - 14e9)
    assert plan.memory.kv_tokens == int((40e9 - 14e9) // 57_344)
    assert plan.time.sync == pytest.approx(14e9 / 450e9)  # the seeds' 31 ms on-node broadcast


def test_reference_memory_is_zero_without_kl():
    config = load_config(EXAMPLE, ["algorithm.kl.coef=0"])
    plan = make_plan(config, _plan_7b().shape, PROFILES["H100-80GB"])
    assert plan.memory.reference == 0 and plan.time.ref_logprobs == 0


def test_colocated_is_a_max_and_disaggregated_a_sum():
    gb = 1e9  # made-up roles on a 10 GB CPU-kind device: engine 1 + 2, actor 4, reference 1, activations 3
    memory = Memory(actor=4 * gb, critic=0.0, reference=1 * gb, engine_weights=1 * gb, kv_bytes_per_token=1,
                    engine_devices=1, kv_capacity=2 * gb, kv_tokens=2, concurrent=1, activations=3 * gb, logits=0.0)
    device = PROFILES["cpu"].__class__(**{**PROFILES["cpu"].__dict__, "memory_gb": 10})
    placement = place(memory, device, gpu_memory_utilization=0.5)
    assert placement.generate_phase == (1 + 2 + 4 + 1) * gb  # engine + resident actor and reference
    assert placement.train_phase == (4 + 1 + 3) * gb
    assert placement.colocated_peak == max(8, 8) * gb
    assert placement.disaggregated == (3 + 8) * gb
    assert (placement.colocated_devices, placement.trainer_devices, placement.rollout_devices) == (1, 1, 1)
    assert place(memory, device, 0.5, offload=True).generate_phase == 3 * gb


def test_decode_is_memory_bound_at_batch_1_and_compute_bound_for_a_huge_batch():
    h100 = PROFILES["H100-80GB"]
    seconds, bound = decode_step_time(int(7e9), 2, 1, h100)
    assert bound == "memory" and seconds == pytest.approx(14e9 / 3350e9)  # the seeds' ~4.2 ms per token
    seconds, bound = decode_step_time(int(7e9), 2, 100_000, h100)
    assert bound == "compute" and seconds == pytest.approx(2 * 7e9 * 100_000 / 989e12)


def test_measure_cpu_reports_positive_rates():
    measured = measure_cpu(PROFILES["cpu"], copy_mb=8, matmul_n=128, repeats=1)
    assert measured.mem_bw_gbs > 0 and measured.peak_tflops > 0 and "measured" in measured.source


def test_cli_plan_prints_the_memory_lines(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the example's model.path is relative to the repository root
    assert main(["plan", "examples/grpo_7b/config.yaml", "--hardware", "H100-80GB"]) == 0
    out = capsys.readouterr().out
    for line in ("actor", "reference", "KV bytes/token", "57,344 B", "colocated peak", "disaggregated",
                 "recommendation"):
        assert line in out


def test_cli_plan_with_shape_flags_and_no_model(capsys, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("rollout: {n: 4, prompts_per_step: 2, max_tokens: 8}\n")
    flags = ["--params", "7e9", "--layers", "28", "--hidden", "3584", "--kv-heads", "4", "--head-dim", "128",
             "--vocab", "152064"]
    assert main(["plan", str(config), "--hardware", "A100-80GB", *flags]) == 0
    assert "112.00 GB" in capsys.readouterr().out
    assert main(["plan", str(config)]) == 2  # no model.path and no flags: one line naming model.path
    assert "model.path" in capsys.readouterr().err


def test_expected_response_length_scales_the_passes_but_not_decoding():
    from relayrl.planner.estimate import workload_from_config

    config = load_config(None, ["rollout.max_tokens=64", "data.max_prompt_tokens=16", "rollout.n=4",
                                "rollout.prompts_per_step=16"])
    full, short = workload_from_config(config), workload_from_config(config, mean_response_tokens=32)
    # 64 sequences x (16 prompt + 64 or 32 response tokens)
    assert full.tokens == 64 * 80 and short.tokens == 64 * 48
    assert short.seq_len == full.seq_len == 80  # memory still sized for the longest sequence
