"""The teacher's lines of a plan (on-policy distillation, `teacher.path`): its parameter count, read from its
config.json like the policy's (relayrl/models/shape.py); with several teachers (`teacher.teachers`), the sum of
theirs for memory (all of them are resident in the learner) and the largest one's for time (a step's rows split
among them, so the batch's forward costs at most the largest teacher's over every row: the bound the plan counts). The estimate counts it like the reference: its weights at
the inference bytes, resident in the learner beside the policy (relayrl/planner/estimate.py), and one forward over
the batch per step, scaled from the policy's forward by the ratio of parameters (relayrl/planner/timing.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relayrl.config import TeacherConfig


def teacher_params(teacher: TeacherConfig) -> int:
    """T: the teachers' parameters resident in the learner (the sum of every teacher's); 0 without a teacher."""
    return sum(_params(teacher))


def teacher_forward_params(teacher: TeacherConfig) -> int:
    """The parameters a step's teacher forward is counted at: the largest teacher's; 0 without a teacher."""
    return max(_params(teacher), default=0)


def _params(teacher: TeacherConfig) -> list[int]:
    from relayrl.models.shape import load_shape

    return [load_shape(entry.path).params for entry in teacher.models()]
