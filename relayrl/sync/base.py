"""The weight-sync seam: publish the learner's weights to the engines under a new policy version.

`InProcessSync` (relayrl/sync/inprocess.py) hands tensors to an engine in this process; `RaySync`
(relayrl/sync/remote.py) moves them between actors through a transport. The controller holds either as a
`WeightSync`; a Ray engine group that restarts replicas is a `RestartingEngines`, whose restarts call back
into the sync to re-attach the new replica and push it the current weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from relayrl.errors import RoleFailure
from relayrl.rollout.protocols import EngineGroup


class LearnerWeights(Protocol):
    """The learner's side, as an in-process sync and the parity probe see it (relayrl/learner/role.py)."""

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]: ...

    def sequence_logprobs(self, token_ids: list[int]) -> list[float]: ...


class WeightSync(Protocol):
    version: int  # the policy version every engine holds
    last: dict[str, float]  # the last push's metrics: sync/bytes, sync/GBps, sync/version, ...
    transport: str  # sync.transport, resolved
    tensors: list[str]  # the names a push carries (what the push guard names when one did not land)

    def push(self, learner: LearnerWeights, engines: EngineGroup, version: int | None = None) -> int:
        """Send the learner's weights to every engine under `version` (default: the current one + 1)."""
        ...


class RestartingEngines(EngineGroup, Protocol):
    """An engine group whose replicas can die and be replaced (relayrl/placement/engines.py)."""

    on_restart: Callable[[], None]  # set by the sync: re-attach the new replica and push the current weights

    def recover(self, index: int, failure: RoleFailure, seen: Any = None) -> None:
        """Replace replica `index` after `failure` (seen on the actor `seen`), or re-raise it."""
        ...
