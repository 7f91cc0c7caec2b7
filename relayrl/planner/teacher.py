"""The teacher's lines of a plan (on-policy distillation, `teacher.path`): its parameter count, read from its
config.json like the policy's (relayrl/models/shape.py). The estimate counts it like the reference: its weights at
the inference bytes, resident in the learner beside the policy (relayrl/planner/estimate.py), and one forward over
the batch per step, scaled from the policy's forward by the ratio of parameters (relayrl/planner/timing.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relayrl.config import TeacherConfig


def teacher_params(teacher: TeacherConfig) -> int:
    """T: the teacher's parameters; 0 without a teacher."""
    if not teacher.path:
        return 0
    from relayrl.models.shape import load_shape

    return load_shape(teacher.path).params
