"""Which teacher scores each sample of a step (`teacher.teachers` routed by the `teacher.route_by` column), and the
per-teacher metrics (`distill/reverse_kl/<route>`).

The route of a sample is its prompt row's column value (`Prompt.columns`, the row's fields other than the prompt).
`TeacherRoutes.check_prompts` refuses, at data load, a row whose value no teacher answers (data.train read whole; a
large file read lazily meets the same check at the step). `TeacherRoutes.rows` turns a step's rollouts into one teacher index per row of its `Experience`
(`Experience.teacher_routes`), which the learner's teachers (relayrl/learner/teacher.py) split the batch by; a value
no teacher answers stops the step there, before the teacher or the update runs, naming value, column and sample.
One teacher (`teacher.path`) is the one route "": every row is 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from relayrl.algorithms.distill import reverse_kl
from relayrl.errors import DataError

if TYPE_CHECKING:
    from relayrl.config import TeacherConfig
    from relayrl.types import Experience, Prompt, Rollout


@dataclass(frozen=True)
class TeacherRoutes:
    """The teachers' routes in load order (index = the teacher's), and the column that picks one."""

    names: tuple[str, ...]
    column: str = ""  # "" = one teacher, every row its own

    @classmethod
    def of(cls, teacher: TeacherConfig) -> TeacherRoutes | None:
        """The routes of the `teacher` section; None without a teacher."""
        if not teacher.present:
            return None
        return cls(tuple(entry.route for entry in teacher.models()), teacher.route_by)

    def rows(self, rollouts: list[Rollout]) -> torch.Tensor:
        """[B] long: the index of the teacher that scores each rollout (the `Experience` rows, in order)."""
        return torch.tensor([self.route(rollout) for rollout in rollouts], dtype=torch.long)

    def check_prompts(self, prompts: list[Prompt]) -> None:
        """At data load (data.train read whole): every row's route answered, else a DataError naming the row."""
        for prompt in prompts:
            self.index(prompt.columns, f"data.train row {prompt.id}")

    def route(self, rollout: Rollout) -> int:
        """The teacher index of one sample, from its row's `column` value; a DataError names what is wrong."""
        return self.index(rollout.prompt.columns, f"sample {rollout.sample_id}")

    def index(self, columns: dict, where: str) -> int:
        """The teacher index a row's `columns` name (`where`: the row or sample, as messages name it)."""
        if not self.column:
            return 0
        if self.column not in columns:
            raise DataError(
                f"{where}: no {self.column!r} column (teacher.route_by={self.column}); "
                f"the row's columns: {', '.join(sorted(columns)) or 'none'}"
            )
        value = columns[self.column]
        if not isinstance(value, str) or value not in self.names:
            raise DataError(
                f"{where}: column {self.column!r} holds {value!r}, which no teacher answers "
                f"(teacher.teachers routes: {', '.join(self.names)})"
            )
        return self.names.index(value)

    def metrics(self, exp: Experience) -> dict[str, float]:
        """`distill/reverse_kl/<route>` for each teacher with rows in the step (several teachers only)."""
        if not self.column or exp.teacher_routes is None or exp.teacher_logprobs is None or exp.old_logprobs is None:
            return {}
        out = {}
        for index, name in enumerate(self.names):
            rows = exp.teacher_routes == index
            if rows.any():
                kl = reverse_kl(exp.old_logprobs[rows], exp.teacher_logprobs[rows], exp.loss_mask[rows])
                out[f"distill/reverse_kl/{name}"] = kl
        return out
