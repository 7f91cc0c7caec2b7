"""The `teacher` section (on-policy distillation: a frozen model that scores every token the student samples) and
`algorithm.distill` (how its signal enters the objective), with the rules that tie them to the rest of the tree.

Pure pydantic. The teacher is loaded and run by relayrl/learner/teacher.py; its signal is
relayrl/algorithms/distill.py; docs/distillation.md explains both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from relayrl.config.section import INPUT_PATH_RULE, Section
from relayrl.config.warn import warn

if TYPE_CHECKING:
    from relayrl.config.algorithm import AlgorithmConfig


class TeacherConfig(Section):
    """`teacher`: the model the student is distilled from (absent path = no teacher, no distillation)."""

    path: str = Field(
        default="",
        description="The teacher: an HF causal-LM directory whose tokenizer has the student's vocabulary; empty = "
        "no teacher. Setting it turns distillation on (algorithm.advantage=distill, or beside a reward at "
        "algorithm.distill.coef). " + INPUT_PATH_RULE,
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto", description="The teacher's weights: auto = bf16 on GPU, fp32 on CPU (as the reference)."
    )
    engine: Literal["auto", "local"] = Field(
        default="auto",
        description="Where the teacher scores the samples: local = a batched forward pass in the learner's "
        "process, like the reference's; auto = local (the only engine so far).",
    )


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


def check_teacher(teacher: TeacherConfig, algo: AlgorithmConfig, learner_ranks: int) -> None:
    """The rules across sections a teacher brings (called by `Config`'s validator); a ValueError names the keys.
    `learner_ranks`: placement.learner_ranks."""
    path = teacher.path
    if algo.advantage == "distill" and not path:
        raise ValueError("algorithm.advantage=distill needs a teacher: set teacher.path")
    if not path:
        return
    if algo.advantage == "distill" and algo.distill.mode == "reward":
        raise ValueError(
            "algorithm.distill.mode=reward puts the teacher's signal in the rewards of a reward estimator; "
            "algorithm.advantage=distill has none: use algorithm.distill.mode=advantage, or a reward estimator "
            "(grpo, rloo, ...)"
        )
    if algo.advantage == "gae":
        raise ValueError("teacher.path with algorithm.advantage=gae is not supported yet (no critic for the signal)")
    if learner_ranks > 1:
        raise ValueError(
            f"teacher.path with placement.learner_ranks={learner_ranks}: the teacher runs on one "
            "learner process only so far; set placement.learner_ranks=1"
        )


def warn_teacher(teacher: TeacherConfig, distill: DistillConfig) -> None:
    """Name the distillation settings that cannot take effect without a teacher (a `ConfigWarning` each)."""
    if teacher.path:
        return
    if idle := sorted(teacher.model_fields_set - {"path"}):
        warn(f"teacher.{', teacher.'.join(idle)} has no effect without teacher.path")
    if idle := sorted(distill.model_fields_set):
        warn(f"algorithm.distill.{', algorithm.distill.'.join(idle)} has no effect without teacher.path")
