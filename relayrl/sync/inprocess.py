"""In-process transport: the learner's tensors are handed to the engine in the same process.

No copy on our side (the engine copies into its own storage); the version counter rises by one per push.
"""

from __future__ import annotations

import time


class InProcessSync:
    def __init__(self, version: int = 0):
        self.version = version
        self.last: dict[str, float] = {}

    def push(self, learner, engine) -> int:
        self.version += 1
        nbytes = 0

        def counted():
            nonlocal nbytes
            for name, tensor in learner.named_weights():
                nbytes += tensor.numel() * tensor.element_size()
                yield name, tensor

        start = time.perf_counter()
        engine.load_weights(counted(), self.version)
        seconds = time.perf_counter() - start
        self.last = {"sync/bytes": float(nbytes), "sync/gbps": nbytes / max(seconds, 1e-9) / 1e9,
                     "sync/version": float(self.version)}
        return self.version
