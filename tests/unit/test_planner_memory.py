"""`relayrl plan`'s memory side: the parameter count from config arithmetic against real models, the seeds' 7B
memory figures by hand, colocated (max) vs disaggregated (sum) placement and time sharing's push, the workload's
padded and packed widths, and learner ranks dividing the states. Time terms: test_planner_time.py; the CLI and its
advice: test_planner_cli.py."""

from dataclasses import replace

import pytest
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from relayrl.planner import PROFILES, ModelShape, count_params, load_shape, make_plan
from relayrl.planner.estimate import Memory
from relayrl.planner.placement import place
from tests.unit.planner_helpers import EXAMPLE, ROOT, SMALL, plan_7b, planned


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


def test_7b_memory_matches_the_seeds_arithmetic():
    plan = plan_7b()
    assert plan.precision.train_bytes == 4 + 4 + 4 + 4  # fp32 weight (the master), fp32 grad, Adam m, v
    assert plan.memory.actor == 7e9 * 16 == 112e9
    assert plan.memory.reference == plan.memory.engine_weights == 7e9 * 2 == 14e9
    assert plan.memory.kv_bytes_per_token == 28 * 4 * 128 * 2 * 2 == 57_344  # 56 KiB
    assert plan_7b(fp32_master=False).memory.actor == 7e9 * 12
    # one H100 at 0.5 utilisation: 40 GB for the engine, 14 GB of it weights, the rest KV cache
    assert plan.memory.kv_capacity == pytest.approx(0.5 * 80e9 - 14e9)
    assert plan.memory.kv_tokens == int((40e9 - 14e9) // 57_344)
    assert plan.time.sync == pytest.approx(14e9 / 450e9)  # the seeds' 31 ms on-node broadcast


def test_reference_memory_is_zero_without_kl():
    config = planned(EXAMPLE, ["algorithm.kl.coef=0"])
    plan = make_plan(config, plan_7b().shape, PROFILES["H100-80GB"])
    assert plan.memory.reference == 0 and plan.time.ref_logprobs == 0


def made_up_memory(actor: float, reference: float, engine_weights: float, kv_capacity: float, activations: float):
    """A planner Memory of made-up role sizes in GB: one engine device, no critic, no logits, token counts of 1-2
    (what the placement tests add up is the sizes)."""
    gb = 1e9
    return Memory(
        actor=actor * gb,
        critic=0.0,
        reference=reference * gb,
        engine_weights=engine_weights * gb,
        kv_bytes_per_token=1,
        engine_devices=1,
        kv_capacity=kv_capacity * gb,
        kv_tokens=2,
        concurrent=1,
        activations=activations * gb,
        logits=0.0,
    )


def test_colocated_is_a_max_and_disaggregated_a_sum():
    gb = 1e9  # made-up roles on a 10 GB CPU-kind device: engine 1 + 2, actor 4, reference 1, activations 3
    memory = made_up_memory(actor=4, reference=1, engine_weights=1, kv_capacity=2, activations=3)
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
    memory = made_up_memory(actor=50, reference=10, engine_weights=30, kv_capacity=10, activations=5)
    h100 = PROFILES["H100-80GB"]
    placed = place(memory, h100, 0.5, offload=True, sleep=True)
    assert (placed.generate_phase, placed.train_phase, placed.push_phase) == (40 * gb, 65 * gb, 90 * gb)
    assert placed.colocated_peak == 90 * gb and placed.colocated_devices == 2
    assert place(memory, h100, 0.5, offload=True).push_phase == 0  # no sleep: the update already sits beside it
    ranks = place(replace(memory, ranks=2), h100, 0.5, offload=True, sleep=True)
    assert ranks.push_phase == (30 + 60 / 2) * gb and ranks.colocated  # 60 GB per device at W=2
    wider = replace(memory, ranks=2, actor=110 * gb)
    assert place(wider, h100, 0.5, offload=True, sleep=True).colocated is False  # 30 + 120 / 2 > 80 GB


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


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_learner_ranks_divide_the_states_not_the_activations(ranks):
    one, plan = plan_7b(), plan_7b(learner_ranks=ranks)
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


def test_two_ranks_of_7b_do_not_fit_80gb_and_four_do():
    # states 7e9 x 18 = 126 GB; activations + logits of a micro-batch of 4 x 1280 tokens ~ 20.6 GB per rank
    two, four = plan_7b(learner_ranks=2), plan_7b(learner_ranks=4)
    assert not two.placement.rank_fits and "do not fit" in two.placement.recommendation
    assert four.placement.rank_fits and four.placement.colocated and four.placement.colocated_devices == 4
