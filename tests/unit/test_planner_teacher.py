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
    assert "teacher (own GPU)" in out.getvalue() and "on its actor's GPU" in out.getvalue()
