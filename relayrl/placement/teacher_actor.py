"""The teacher's own actor (`teacher.engine: actor` or `vllm` under `placement.mode: ray`), restarted like an engine
replica (relayrl/placement/engines.py).

When the actor dies or misses `placement.call_timeout_s` while scoring a batch, `placement.on_engine_failure=restart`
kills what is left of it, starts a fresh one in the same bundle (and GPU) and scores that batch again: its weights are
teacher.path's, frozen, so there is nothing to re-sync and the batch's signal is the one the dead actor would have
given. The teacher's restarts are counted apart from the engines' (`placement/teacher_restarts`), against the same
`placement.max_engine_restarts`; with `on_engine_failure=stop`, or that budget spent, the run stops with the failure
naming the teacher and the setting (relayrl/build.py adds how to resume). An error raised inside the actor (a
`PlacementError` that is not a death) is the teacher's own and is not retried: a restart would meet it again.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from relayrl.errors import RoleFailure

if TYPE_CHECKING:
    from relayrl.config import PlacementConfig
    from relayrl.placement.handles import RemoteRole
    from relayrl.types import Experience


class TeacherActor:
    """A handle on the teacher's actor with `score_teacher` as the controller calls it; `spawn` starts a fresh
    actor in the teacher's bundle (the first at once)."""

    def __init__(self, spawn: Callable[[], RemoteRole], placement: PlacementConfig):
        self.spawn, self.placement, self.restarts = spawn, placement, 0
        self.role = spawn()

    @property
    def actor(self):
        """The Ray actor now serving (what the run's shutdown kills)."""
        return self.role._actor

    def ping(self) -> int:
        return self.role.ping()

    def score_teacher(self, exp: Experience, teacher_rows: Experience | None = None) -> Experience:
        """`exp` with the teacher's log-probs (as `TeacherRole.score_teacher`); a batch whose actor died is scored
        again on the restarted one."""
        while True:
            try:
                return self.role.score_teacher(exp, teacher_rows)
            except RoleFailure as failure:
                self.restart(failure)

    def restart(self, failure: RoleFailure) -> None:
        """A fresh teacher actor in place of the failed one, or `failure` re-raised, naming the setting that stops
        it, when restarts are off or used up."""
        import ray

        placement = self.placement
        if placement.on_engine_failure == "stop":
            raise _stopped(failure, " (placement.on_engine_failure=stop)")
        if self.restarts >= placement.max_engine_restarts:
            raise _stopped(failure, f"; placement.max_engine_restarts={placement.max_engine_restarts} already used")
        ray.kill(self.actor, no_restart=True)  # a hung actor must not linger
        self.restarts += 1
        print(
            f"relayrl: {failure}; restarting the teacher and scoring its batch again "
            f"(restart {self.restarts} of {placement.max_engine_restarts})",
            file=sys.stderr,
            flush=True,
        )
        self.role = self.spawn()
        self.role.ping()

    def metrics(self) -> dict[str, float]:
        return {"placement/teacher_restarts": float(self.restarts)}


def _stopped(failure: RoleFailure, why: str) -> RoleFailure:
    return RoleFailure(f"{failure}{why}", failure.role, failure.died, failure.hung)
