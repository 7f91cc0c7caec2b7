"""In-process transport: the learner's tensors are handed to the engine in the same process.

No copy on our side (the engine copies into its own storage); the version counter rises by one per push.
"""

from __future__ import annotations

import time

from relayrl.rollout.protocols import EngineGroup
from relayrl.sync.base import LearnerWeights


class InProcessSync:
    transport = "inprocess"

    def __init__(self, version: int = 0):
        self.version = version
        self.last: dict[str, float] = {}
        self.tensors: list[str] = []  # the names the last push carried

    def push(self, learner: LearnerWeights, engines: EngineGroup, version: int | None = None) -> int:
        self.version = self.version + 1 if version is None else version
        nbytes, names = 0, []

        def counted():
            nonlocal nbytes
            for name, tensor in learner.named_weights():
                nbytes += tensor.numel() * tensor.element_size()
                names.append(name)
                yield name, tensor

        start = time.perf_counter()
        for index, engine in enumerate(engines.replicas):  # the bytes of one copy are counted
            engine.load_weights(counted() if index == 0 else learner.named_weights(), self.version)
        seconds = time.perf_counter() - start
        self.last = {
            "sync/bytes": float(nbytes),
            "sync/GBps": nbytes / max(seconds, 1e-9) / 1e9,
            "sync/version": float(self.version),
        }
        self.tensors = names
        return self.version
