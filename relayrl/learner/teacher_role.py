"""The teacher as a role of its own (`teacher.engine: actor` or `vllm`): the run's teachers loaded apart from the
learner (a Ray actor in its own bundle, and GPU, relayrl/placement/build.py; `vllm` under placement.mode=local: in
the driver). `actor` scores each step's batch with the same pass as the `local` engine (relayrl/learner/teacher.py:
the policy's micro-batches, packing, logits chunks and sampling temperature), so its log-probs are the local
engine's; `vllm` through a vLLM engine's prompt log-probs (relayrl/learner/teacher_vllm.py). The controller calls `score_teacher` on
it as on the learner; a handle gives each call `placement.call_timeout_s`, and an actor that dies or hangs is
restarted as an engine is and scores its batch again (relayrl/placement/teacher_actor.py), or stops the run with a
`RoleFailure` naming the teacher when restarts are off or spent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from relayrl.learner.teacher import Teachers

if TYPE_CHECKING:
    from relayrl.learner.settings import TeacherSettings
    from relayrl.learner.teacher_vllm import VLLMTeacher
    from relayrl.types import Experience


class TeacherRole:
    """The teachers, alone in this process; `threads`: torch's CPU threads (the actor's bundle's); `max_model_len`:
    the longest row a vLLM teacher scores."""

    def __init__(self, settings: TeacherSettings, threads: int = 0, max_model_len: int = 0):
        if threads:
            torch.set_num_threads(threads)
        self.teachers: Teachers | VLLMTeacher
        if settings.teacher.engine == "vllm":
            from relayrl.learner.teacher_vllm import VLLMTeacher

            self.teachers = VLLMTeacher.start(settings, max_model_len)
        else:
            self.teachers = Teachers.alone(settings)

    def ping(self) -> int:
        return torch.get_num_threads()

    def score_teacher(self, exp: Experience, teacher_rows: Experience | None = None) -> Experience:
        """`exp` with the teacher's log-probs of its response tokens (`teacher_rows`: with `teacher.prompt`, the same
        responses after the teacher's prompt, aligned back to `exp`), as `LearnerRole.score_teacher`."""
        return self.teachers.score(exp, teacher_rows)
