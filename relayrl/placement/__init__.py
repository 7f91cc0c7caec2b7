"""Placement of the roles: everything in this process (`local`, relayrl/placement/local.py), or Ray actors in
placement groups (`ray`, relayrl/placement/build.py). Either way the controller gets the same `Roles`.

Placement knows nothing of any engine's internals: an engine is built by `rollout.engine_from_settings` in the
driver or in an engine actor, and sets its own environment (vLLM's) itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from relayrl.placement.learner_restarts import LearnerRestarts

if TYPE_CHECKING:  # the heavy modules load only with the placement that needs them
    from relayrl.config import Config
    from relayrl.learner.role import Learner
    from relayrl.rollout.protocols import EngineGroup
    from relayrl.sync.base import WeightSync


@dataclass
class Roles:
    """The handles the controller holds, the same whatever the placement."""

    engines: EngineGroup
    learner: Learner  # a LearnerRole, or a handle on one in an actor
    sync: WeightSync
    close: Callable[[], None]  # release actors, shared memory, the placement group
    learner_restarts: LearnerRestarts = field(default_factory=LearnerRestarts.off)  # ray: a new learner group
    teacher: Any = None  # teacher.engine=actor or vllm: the teacher's own role, or a handle on its actor


def build_roles(config: Config, max_len: int) -> Roles:
    """Every role of the run for `placement.mode`, with the first weights already on the engines."""
    if config.placement.mode == "ray":
        from relayrl.placement.build import build_ray_roles

        return build_ray_roles(config, max_len)
    from relayrl.placement.local import build_local_roles

    return build_local_roles(config, max_len)
