"""`relayrl plan` counts a teacher (teacher.path) like the reference: its weights at the inference bytes, resident in
the learner, and its forward over the batch, scaled from the policy's by its share of parameters."""

import io

import pytest
from rich.console import Console

from relayrl.planner import load_shape
from relayrl.planner.report import print_plan
from tests.unit.planner_helpers import KL, SEVEN_B, example_7b


def _plan(*overrides):
    return example_7b(KL, *overrides, shape=SEVEN_B)[1]


def test_a_teacher_costs_its_weights_and_a_forward_like_the_reference(random_model_dir):
    teacher = load_shape(str(random_model_dir)).params
    plain, taught = _plan(), _plan(f"teacher.path={random_model_dir}")
    assert plain.memory.teacher == 0 and plain.time.teacher_logprobs == 0
    assert taught.memory.teacher == teacher * 2  # bf16 on a GPU, as the reference (P x 2)
    assert taught.memory.trainer == pytest.approx(plain.memory.trainer + teacher * 2)
    assert taught.time.teacher_logprobs == pytest.approx(taught.time.ref_logprobs * teacher / SEVEN_B.params)
    assert taught.time.total > plain.time.total
    assert taught.time.old_logprobs == taught.time.ref_logprobs  # the signal needs the pre-update log-probs


def test_the_report_shows_the_teachers_lines(random_model_dir):
    out = io.StringIO()
    print_plan(_plan(f"teacher.path={random_model_dir}"), Console(file=out, width=250))
    text = out.getvalue()
    assert "teacher log-probs" in text and "forward x T / P" in text
    assert f"T={load_shape(str(random_model_dir)).params:,} x 2" in text


def test_a_lora_self_teacher_is_counted_once_as_the_policys_base(random_model_dir):
    lora = (f"model.path={random_model_dir}", "model.lora.rank=8", "model.lora.alpha=16", "train.lr=1e-4")
    plain, taught = _plan(*lora), _plan(*lora, f"teacher.path={random_model_dir}")
    assert taught.memory.teacher == 0 and taught.memory.trainer == plain.memory.trainer  # no second copy
    teacher = load_shape(str(random_model_dir)).params
    assert taught.time.teacher_logprobs == pytest.approx(taught.time.ref_logprobs * teacher / SEVEN_B.params)  # counted
    out = io.StringIO()
    print_plan(taught, Console(file=out, width=250))
    assert "none (LoRA self-teacher: the policy's base, adapter off)" in out.getvalue()


def test_a_teacher_actor_counts_its_weights_on_its_own_gpu(random_model_dir):
    teacher = load_shape(str(random_model_dir)).params
    ray = ("placement.mode=ray", f"teacher.path={random_model_dir}")
    local, actor = _plan(*ray, "teacher.engine=local"), _plan(*ray, "teacher.engine=actor")
    assert actor.memory.teacher == 0 and actor.memory.teacher_apart == teacher * 2  # bf16, apart from the learner
    assert actor.memory.trainer == pytest.approx(local.memory.trainer - teacher * 2)
    assert actor.time.teacher_logprobs == pytest.approx(local.time.teacher_logprobs)
    out = io.StringIO()
    print_plan(actor, Console(file=out, width=250))
    assert "teacher (own actor)" in out.getvalue() and "1 GPU(s) of its own" in out.getvalue()


def test_a_teacher_actor_adds_its_own_gpu_to_every_layouts_device_count(random_model_dir):
    ray = ("placement.mode=ray", f"teacher.path={random_model_dir}")
    local, actor = _plan(*ray, "teacher.engine=local"), _plan(*ray, "teacher.engine=actor")
    assert local.memory.teacher_devices == 0 and local.placement.teacher_devices == 0
    assert actor.memory.teacher_devices == 1 and actor.placement.teacher_devices == 1
    lp, ap = local.placement, actor.placement
    assert ap.disaggregated_devices == ap.trainer_devices + ap.rollout_devices + 1
    assert ap.colocated_devices == lp.colocated_devices + 1  # its bundle's GPU, colocated or not
    assert ap.disaggregated == pytest.approx(lp.disaggregated)  # the same bytes, moved out of the learner
    out = io.StringIO()
    print_plan(actor, Console(file=out, width=250))
    text = out.getvalue()
    assert "teacher devices" in text and "+ teacher" in text
    assert f"{ap.trainer_devices} + {ap.rollout_devices} + 1 = {ap.disaggregated_devices}" in text


def test_teacher_engine_auto_is_chosen_for_the_plans_hardware(random_model_dir):
    ray = ("placement.mode=ray", f"teacher.path={random_model_dir}")  # auto: local on this CPU machine
    on_gpu, on_cpu = _plan(*ray), example_7b(KL, *ray, hardware="cpu", shape=SEVEN_B)[1]
    assert on_gpu.workload.teacher_engine == "actor" and on_gpu.placement.teacher_devices == 1
    assert on_cpu.workload.teacher_engine == "local" and on_cpu.memory.teacher_apart == 0


def test_a_vllm_teacher_counts_its_kv_cache_on_its_own_gpu(random_model_dir):
    from relayrl.learner.teacher_vllm import OWN_GPU_SHARE

    ray = ("placement.mode=ray", f"teacher.path={random_model_dir}", "rollout.temperature=1")
    actor, vllm = _plan(*ray, "teacher.engine=actor"), _plan(*ray, "teacher.engine=vllm")
    weights = load_shape(str(random_model_dir)).params * 2
    assert actor.memory.teacher_kv == 0
    assert vllm.memory.teacher_apart == weights and vllm.memory.teacher_devices == 1
    assert vllm.memory.teacher_kv == pytest.approx(OWN_GPU_SHARE * 80e9 - weights)  # H100-80GB: its engine's share
    assert vllm.placement.disaggregated == pytest.approx(actor.placement.disaggregated + vllm.memory.teacher_kv)
    assert vllm.placement.disaggregated_devices == actor.placement.disaggregated_devices
    out = io.StringIO()
    print_plan(vllm, Console(file=out, width=250))
    assert (
        "teacher (own actor, vLLM)" in out.getvalue()
        and f"KV cache ({OWN_GPU_SHARE:g} x M - weights)" in out.getvalue()
    )


def test_a_vllm_teacher_on_a_cpu_shares_the_hosts_memory_with_every_phase(random_model_dir):
    ray = ("placement.mode=ray", f"teacher.path={random_model_dir}", "rollout.temperature=1")
    plan = lambda engine: example_7b(KL, *ray, f"teacher.engine={engine}", hardware="cpu", shape=SEVEN_B)[1]  # noqa: E731
    local, vllm = plan("local"), plan("vllm")
    own = vllm.memory.teacher_apart + vllm.memory.teacher_kv
    assert vllm.memory.teacher_devices == 0 and vllm.memory.teacher_kv == vllm.workload.kv_cache_gib * 2**30
    moved = local.memory.teacher - own  # out of the learner's states, into the teacher's actor on the same host
    assert vllm.placement.generate_phase == pytest.approx(local.placement.generate_phase - moved)
    assert vllm.placement.train_phase == pytest.approx(local.placement.train_phase - moved)


def test_the_advice_shards_the_learner_beside_a_teacher_actor_not_beside_a_local_one(random_model_dir):
    ray, teacher = "placement.mode=ray", (f"teacher.path={random_model_dir}", "teacher.engine=actor")
    assert "placement.learner_ranks=4" in _plan(ray).advice.overrides  # the 7B example alone: W=4, disaggregated
    apart = _plan(ray, *teacher).advice  # the teacher in its own actor: the same W=4, and the actor's GPU
    assert "placement.learner_ranks=4" in apart.overrides and "the teacher's actor's 1" in apart.text, apart.line
    local = _plan(ray, f"teacher.path={random_model_dir}", "teacher.engine=local").advice  # W=1 only: too small
    assert local.overrides == () and "teacher.engine=actor gives it an actor of its own" in local.text, local.line
    tiny = example_7b(ray, *teacher, shape=load_shape(str(random_model_dir)))[1]  # fits one GPU beside its engine
    assert tiny.advice.text.startswith("colocated on 2 devices"), tiny.advice.line
    assert "the teacher's actor has 1 of its own" in tiny.advice.text
    assert "placement.learner_ranks=1" in tiny.advice.overrides
