"""`placement.on_learner_failure`: whether a learner failure is healed, and the count of restarts.

A learner that dies (its actor, or any one of its ranks: a sharded group cannot lose a member and go on) or hangs
past `placement.call_timeout_s` is replaced as a whole group by `respawn` (relayrl/placement/build.py: the old
actors killed, new ones started in the same bundles, the weight sync attached to them). Restoring the state the
new learner continues from, and redoing the steps after it, is the training loop's (`Trainer.heal` in
relayrl/controller.py). A learner call that raised is not healed: it is the learner's own error, which a restart
would meet again; neither is any other role's failure (engines heal themselves, relayrl/placement/engines.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from relayrl.config import PlacementConfig
from relayrl.errors import RoleFailure


class LearnerRestarts:
    def __init__(self, placement: PlacementConfig | None, respawn: Callable[[], None] | None):
        self.placement, self.respawn, self.count = placement, respawn, 0

    @classmethod
    def off(cls) -> LearnerRestarts:
        """An in-process learner: it cannot fail apart from the run, so nothing is restarted."""
        return cls(None, None)

    def heals(self, failure: RoleFailure) -> bool:
        """True for a failure of the learner that a restart may cure (it died or hung)."""
        return self.respawn is not None and failure.role.startswith("learner") and (failure.died or failure.hung)

    def restart(self, failure: RoleFailure, restoring: str) -> None:
        """A new learner group in place of the failed one; `restoring` (what it will continue from) goes in the
        message. Raises `failure`, with the setting that stops it, when restarts are off or used up."""
        placement = self.placement
        assert placement is not None and self.respawn is not None, "heals() said this learner restarts"
        if placement.on_learner_failure == "stop":
            raise _stopped(failure, " (placement.on_learner_failure=stop)")
        if self.count >= placement.max_learner_restarts:
            raise _stopped(failure, f"; placement.max_learner_restarts={placement.max_learner_restarts} already used")
        self.count += 1
        print(
            f"relayrl: {failure}; restarting the learner from {restoring} "
            f"(restart {self.count} of {placement.max_learner_restarts})",
            file=sys.stderr,
            flush=True,
        )
        self.respawn()

    def metrics(self) -> dict[str, float]:
        return {} if self.respawn is None else {"placement/learner_restarts": float(self.count)}


def _stopped(failure: RoleFailure, why: str) -> RoleFailure:
    return RoleFailure(f"{failure}{why}", failure.role, failure.died, failure.hung)
