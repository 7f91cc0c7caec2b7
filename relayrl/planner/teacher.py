"""The teacher's lines of a plan (on-policy distillation, `teacher.path`): its parameter count, read from its
config.json like the policy's (relayrl/models/shape.py). The estimate counts it like the reference: its weights at
the inference bytes (relayrl/planner/estimate.py), and one forward over the batch per step, scaled from the policy's
forward by the ratio of parameters (relayrl/planner/timing.py).

Where its weights are: resident in the learner beside the policy (`teacher.engine: local`), except a LoRA
self-teacher (`teacher.path` = `model.path` under `model.lora`: the student's base with its adapter off, no second
copy, counted once, as the policy's base); or on the teacher actor's own GPU (`teacher.engine: actor`, where a LoRA
self-teacher is a copy of the base; `vllm`: its engine's weights and KV cache, `OWN_GPU_SHARE` of that GPU as
relayrl/learner/teacher_vllm.py takes it, or `rollout.kv_cache_gib` on a CPU). A teacher apart holds a device of its
own in every Ray layout (its bundle's GPU, relayrl/placement/cluster.py): the plan adds it to the colocated and the
disaggregated device counts (relayrl/planner/placement.py); on a CPU its bytes share the host with every phase.
`teacher.engine: auto` is chosen for the plan's hardware, as the run would choose it there (actor under
placement.mode=ray with a GPU). Several teachers (`teacher.teachers`): the sum of theirs for memory (all
resident) and the largest one's for time (a step's rows split among them, so the batch's forward costs at most the
largest teacher's over every row: the bound the plan counts).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relayrl.config import ModelConfig, TeacherConfig
    from relayrl.planner.estimate import Memory, Workload
    from relayrl.planner.hardware import Hardware

GIB = 2**30


def teacher_workload(
    teacher: TeacherConfig, model: ModelConfig, mode: str, gpu: bool | None, auto: bool, learner_ranks: int = 1
) -> dict:
    """The Workload's teacher fields, with `teacher.engine: auto` (`auto`: the config asked for it, whatever its
    load chose) chosen under placement.mode `mode` for the plan's hardware (`gpu`) as the run would choose it there
    (relayrl/learner/teacher.py), not for the machine that loaded the config (None: this machine's, as the run's own
    `auto` choices see it)."""
    from relayrl.learner.teacher import choose_teacher_engine

    if not teacher.present:
        return {}
    engine = choose_teacher_engine("auto" if auto else teacher.engine, mode, gpu, learner_ranks)[0]
    teacher = teacher.model_copy(update={"engine": engine})
    return {
        "teacher_engine": engine,
        "teacher_params": teacher_params(teacher, model),
        "teacher_apart_params": teacher_apart_params(teacher),
        "teacher_forward_params": teacher_forward_params(teacher),
    }


def apart_memory(work: Workload, hardware: Hardware, weights: float) -> tuple[float, int]:
    """(a vLLM teacher's KV cache, the devices the teacher's own actor holds) for a teacher apart whose weights are
    `weights` bytes; (0, 0) for one in the learner. On a GPU the actor's bundle holds a GPU of its own (one; more if
    its weights outgrow it: the plan then says so, relayrl gives it one); a vLLM teacher takes `OWN_GPU_SHARE` of
    it (weights + KV). On a CPU: no device of its own (0), a vLLM teacher's KV cache is `rollout.kv_cache_gib`."""
    from relayrl.learner.teacher_vllm import OWN_GPU_SHARE

    if not work.teacher_apart_params:
        return 0.0, 0
    vllm = work.teacher_engine == "vllm"
    if hardware.kind == "cpu":
        return (work.kv_cache_gib * GIB if vllm else 0.0), 0
    budget = hardware.memory_gb * 1e9 * (OWN_GPU_SHARE if vllm else 1.0)
    devices = max(1, math.ceil(weights / budget))
    return (devices * budget - weights if vllm else 0.0), devices


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


def placement_row(memory: Memory, placed_devices: int) -> list[tuple[str, str, str]]:
    """The plan's placement row for a teacher in its own actor: the device(s) it adds to every layout's count."""
    if not memory.teacher_devices:
        return []
    size = f"weights + KV {(memory.teacher_apart + memory.teacher_kv) / 1e9:.1f} GB"
    return [("teacher devices", f"its actor's own GPU(s), added to each layout ({size})", f"{placed_devices}")]


def apart(teacher: TeacherConfig) -> bool:
    """Whether the teachers live apart from the learner (teacher.engine=actor, or vllm: a vLLM engine's)."""
    return teacher.present and teacher.engine in ("actor", "vllm")


def memory_row(work: Workload, infer_bytes: int, memory: Memory) -> tuple[str, str]:
    """(the teacher's label, its formula) in the plan's memory table."""
    if work.teacher_apart_params:
        where = f"{memory.teacher_devices} GPU(s) of its own" if memory.teacher_devices else "the host's memory"
        weights = f"T={work.teacher_apart_params:,} x {infer_bytes}"
        if work.teacher_engine == "vllm":
            from relayrl.learner.teacher_vllm import OWN_GPU_SHARE

            kv = f"{OWN_GPU_SHARE:g} x M - weights" if memory.teacher_devices else f"kv_cache_gib {work.kv_cache_gib:g}"
            return "teacher (own actor, vLLM)", f"{weights} + KV cache ({kv}), {where} (teacher.engine=vllm)"
        return "teacher (own actor)", f"{weights}, {where} (teacher.engine=actor)"
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
