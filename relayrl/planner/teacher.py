"""The teacher's lines of a plan (on-policy distillation, `teacher.path`): its parameter count, read from its
config.json like the policy's (relayrl/models/shape.py). The estimate counts it like the reference: its weights at
the inference bytes (relayrl/planner/estimate.py), and one forward over the batch per step, scaled from the policy's
forward by the ratio of parameters (relayrl/planner/timing.py).

Where its weights are: resident in the learner beside the policy (`teacher.engine: local`), except a LoRA
self-teacher (`teacher.path` = `model.path` under `model.lora`: the student's base with its adapter off, no second
copy, counted once, as the policy's base); or on the teacher actor's own GPU (`teacher.engine: actor`, where a LoRA
self-teacher is a copy of the base; `vllm`: its engine's weights, the KV cache not counted). Several teachers (`teacher.teachers`): the sum of theirs for memory (all
resident) and the largest one's for time (a step's rows split among them, so the batch's forward costs at most the
largest teacher's over every row: the bound the plan counts).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relayrl.config import ModelConfig, TeacherConfig
    from relayrl.planner.estimate import Workload


def teacher_params(teacher: TeacherConfig, model: ModelConfig) -> int:
    """T: the teachers' parameters resident in the learner (the sum of every teacher's but a LoRA self-teacher's,
    which is the policy's base); 0 without a teacher, or with teacher.engine=actor (they live in its actor)."""
    if apart(teacher):
        return 0
    return sum(params for entry, params in zip(teacher.models(), _params(teacher)) if not _is_base(entry.path, model))


def teacher_apart_params(teacher: TeacherConfig) -> int:
    """The teachers' parameters on the teacher actor's own GPU (teacher.engine=actor; a LoRA self-teacher is a copy
    of the base there); 0 for a teacher in the learner."""
    return sum(_params(teacher)) if apart(teacher) else 0


def teacher_forward_params(teacher: TeacherConfig) -> int:
    """The parameters a step's teacher forward is counted at: the largest teacher's; 0 without a teacher."""
    return max(_params(teacher), default=0)


def apart(teacher: TeacherConfig) -> bool:
    """Whether the teachers live apart from the learner (teacher.engine=actor, or vllm: a vLLM engine's)."""
    return teacher.present and teacher.engine in ("actor", "vllm")


def memory_row(work: Workload, infer_bytes: int) -> tuple[str, str]:
    """(the teacher's label, its formula) in the plan's memory table."""
    if work.teacher_apart_params:
        return (
            "teacher (own GPU)",
            f"T={work.teacher_apart_params:,} x {infer_bytes}, its actor's GPU (teacher.engine=actor)",
        )
    if work.teacher_params:
        return "teacher", f"T={work.teacher_params:,} x {infer_bytes}"
    if work.teacher_forward_params:
        return "teacher", "none (LoRA self-teacher: the policy's base, adapter off)"
    return "teacher", "none (no teacher.path)"


def time_formula(work: Workload, policy_params: int) -> str:
    """The teacher's forward in the plan's time table: the policy's forward x T / P (on its own GPU, for an actor)."""
    if not work.teacher_forward_params:
        return "none (no teacher.path)"
    where = ", on its actor's GPU" if work.teacher_apart_params else ""
    return f"forward x T / P = {work.teacher_forward_params / policy_params:.3g}{where}"


def _is_base(path: str, model: ModelConfig) -> bool:
    return model.lora is not None and Path(path).resolve() == Path(model.path).resolve()


def _params(teacher: TeacherConfig) -> list[int]:
    from relayrl.models.shape import load_shape

    return [load_shape(entry.path).params for entry in teacher.models()]
