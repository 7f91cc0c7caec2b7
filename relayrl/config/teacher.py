"""The `teacher` section (on-policy distillation: a frozen model that scores every token the student samples) and
`algorithm.distill` (how its signal enters the objective), with the rules that tie them to the rest of the tree.

Pure pydantic. The teacher is loaded and run by relayrl/learner/teacher.py; its signal is
relayrl/algorithms/distill.py; docs/distillation.md explains both.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from relayrl.config.section import INPUT_PATH_RULE, Section
from relayrl.config.warn import warn

if TYPE_CHECKING:
    from relayrl.config.algorithm import AlgorithmConfig

STUDENT_PROMPT = "prompt"  # teacher.prompt's placeholder for the student's prompt text


class RoutedTeacher(Section):
    """One of several teachers (`teacher.teachers`): the rows whose `teacher.route_by` column holds `route`."""

    route: str = Field(description="The value of the teacher.route_by column whose rows this teacher scores.")
    path: str = Field(description="This teacher's HF causal-LM directory (the student's vocabulary), as given.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(default="auto", description="As teacher.dtype.")


class TeacherConfig(Section):
    """`teacher`: the model the student is distilled from (absent path = no teacher, no distillation), or several
    (`teachers`), each scoring the rows whose `route_by` column names it."""

    path: str = Field(
        default="",
        description="The teacher: an HF causal-LM directory whose tokenizer has the student's vocabulary; empty = "
        "no teacher. Setting it turns distillation on (algorithm.advantage=distill, or beside a reward at "
        "algorithm.distill.coef). " + INPUT_PATH_RULE,
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto", description="The teacher's weights: auto = bf16 on GPU, fp32 on CPU (as the reference)."
    )
    engine: Literal["auto", "local", "actor", "vllm"] = Field(
        default="auto",
        description="Where the teacher scores the samples: local = a batched forward pass in the learner's "
        "process, like the reference's; actor = the same pass in a Ray actor of its own, in its own bundle "
        "(and GPU) under placement.mode=ray; vllm = a vLLM engine's prompt log-probs (one teacher, "
        "rollout.temperature=1; its own actor under Ray, in the driver under placement.mode=local on a CPU); "
        "auto = actor under placement.mode=ray with a GPU or with placement.learner_ranks > 1 (local is refused "
        "beside sharded ranks), else local (the config dump says which and why).",
    )
    cpus: float = Field(
        default=1.0,
        gt=0,
        description="teacher.engine=actor or vllm under placement.mode=ray: the CPUs of the teacher's own bundle "
        "(its threads); on a cluster with GPUs the bundle also holds one GPU.",
    )
    prompt: str = Field(
        default="",
        description="A template of the prompt the teacher sees instead of the student's (context distillation): "
        "{prompt} is the student's prompt text, {name} a column of the row; the teacher scores the student's "
        "response tokens after it. Empty = the student's prompt.",
    )
    route_by: str = Field(
        default="",
        description="With teacher.teachers: the dataset column whose value in a row names the teacher that scores "
        "its samples (a value no teacher answers stops the step before it trains, naming value, column and row).",
    )
    teachers: list[RoutedTeacher] = Field(
        default_factory=list,
        description="Several teachers, instead of teacher.path: [{route, path, dtype}], one per value of the "
        "teacher.route_by column (multi-domain distillation; distill/reverse_kl/<route> per teacher).",
    )

    @property
    def present(self) -> bool:
        """Whether the run distills: one teacher (`path`) or several (`teachers`)."""
        return bool(self.path or self.teachers)

    def models(self) -> list[RoutedTeacher]:
        """Each teacher to load, in route order: the one `path` (route "") or the `teachers`."""
        if self.teachers:
            return list(self.teachers)
        return [RoutedTeacher(route="", path=self.path, dtype=self.dtype)] if self.path else []


class DistillConfig(Section):
    """`algorithm.distill`: how the teacher's per-token signal, log pi_teacher - log pi_student, trains the student."""

    coef: float = Field(
        default=1.0,
        gt=0,
        description="Weight of the distillation signal: advantage = reward advantage + coef x (log teacher - "
        "log student) per token (with algorithm.advantage=distill, coef x that alone).",
    )
    mode: Literal["advantage", "reward"] = Field(
        default="advantage",
        description="advantage: the per-token signal is added to the advantages (undiscounted); reward: "
        "-coef x (log student - log teacher) per token enters the token rewards, as kl.placement=reward does "
        "for the reference, and the reward estimator turns it into advantages.",
    )


def check_teacher(
    teacher: TeacherConfig, algo: AlgorithmConfig, learner_ranks: int, mode: str = "local", temperature: float = 1.0
) -> None:
    """The rules across sections a teacher brings (called by `Config`'s validator); a ValueError names the keys.
    `learner_ranks`: placement.learner_ranks; `mode`: placement.mode; `temperature`: rollout.temperature."""
    check_routes(teacher)
    if teacher.prompt:
        check_template(teacher.prompt)
    if algo.advantage == "distill" and not teacher.present:
        raise ValueError("algorithm.advantage=distill needs a teacher: set teacher.path (or teacher.teachers)")
    if not teacher.present:
        return
    if algo.advantage == "distill" and algo.distill.mode == "reward":
        raise ValueError(
            "algorithm.distill.mode=reward puts the teacher's signal in the rewards of a reward estimator; "
            "algorithm.advantage=distill has none: use algorithm.distill.mode=advantage, or a reward estimator "
            "(grpo, rloo, ...)"
        )
    if learner_ranks > 1 and teacher.engine == "local":
        raise ValueError(
            f"teacher.engine=local with placement.learner_ranks={learner_ranks}: the teacher in the learner's process "
            "is not sharded; use teacher.engine=actor (or auto: an actor of its own beside sharded ranks)"
        )
    if teacher.engine == "actor" and mode != "ray":
        raise ValueError(
            f"teacher.engine=actor puts the teacher in a Ray actor of its own: it needs placement.mode=ray (got "
            f"{mode}); use placement.mode=ray, or teacher.engine=local (the teacher in the learner's process)"
        )
    if teacher.engine == "vllm":
        check_vllm_teacher(teacher, temperature)


def check_vllm_teacher(teacher: TeacherConfig, temperature: float) -> None:
    """teacher.engine=vllm: one teacher, and the samples drawn at temperature 1 (vLLM's prompt log-probs skip the
    sampling temperature, so they would score another distribution than the student's)."""
    if teacher.teachers:
        raise ValueError(
            "teacher.engine=vllm serves one teacher (teacher.path); with teacher.teachers use teacher.engine=local "
            "or actor"
        )
    if temperature != 1.0:
        raise ValueError(
            f"teacher.engine=vllm with rollout.temperature={temperature:g}: vLLM's prompt log-probs are at "
            "temperature 1 (they skip the sampling processors); use rollout.temperature=1, or teacher.engine=local "
            "or actor"
        )


def check_routes(teacher: TeacherConfig) -> None:
    """Several teachers: no teacher.path beside them, a route_by column, distinct non-empty routes."""
    if not teacher.teachers:
        if teacher.route_by:
            raise ValueError("teacher.route_by without teacher.teachers: list the teachers, [{route, path}]")
        return
    if teacher.path:
        raise ValueError("teacher.path and teacher.teachers both set: keep one (teachers for several)")
    if not teacher.route_by:
        raise ValueError("teacher.teachers needs teacher.route_by: the dataset column whose value names the teacher")
    routes = [entry.route for entry in teacher.teachers]
    if "" in routes or len(set(routes)) < len(routes):
        raise ValueError(f"teacher.teachers: each route must be non-empty and distinct, got {routes}")


def warn_teacher(teacher: TeacherConfig, distill: DistillConfig) -> None:
    """Name the distillation settings that cannot take effect without a teacher (a `ConfigWarning` each)."""
    if teacher.present:
        if "cpus" in teacher.model_fields_set and teacher.engine == "local":
            warn("teacher.cpus has no effect with teacher.engine=local (the teacher runs in the learner's process)")
        return
    if idle := sorted(teacher.model_fields_set - {"path"}):
        warn(f"teacher.{', teacher.'.join(idle)} has no effect without teacher.path")
    if idle := sorted(distill.model_fields_set):
        warn(f"algorithm.distill.{', algorithm.distill.'.join(idle)} has no effect without teacher.path")


def template_fields(template: str) -> list[str]:
    """The placeholders of a `teacher.prompt` template, in order; a ValueError names what is wrong."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ValueError(f"teacher.prompt={template!r} is not a valid template: {err}") from None
    fields = [name for _, name, _, _ in parsed if name is not None]
    for name in fields:
        if not name.isidentifier():
            raise ValueError(
                f"teacher.prompt={template!r}: placeholder {{{name}}} is not a name; use {{prompt}} (the student's "
                "prompt) or {column} (a column of the data row)"
            )
    return fields


def check_template(template: str) -> None:
    """Config load: the template parses and its placeholders are plain names (their columns are checked at data
    load, `TeacherPrompt.check_prompts`)."""
    template_fields(template)
