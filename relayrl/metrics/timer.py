"""One timer for every phase of a step: `with timer("generate"): ...`, then `timer.metrics()`.

With a `Timeline`, every phase run is also recorded with its wall-clock start and end.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from relayrl.metrics.timeline import ROLE_OF_PHASE, Timeline


class StepTimer:
    def __init__(self, timeline: Timeline | None = None, step: int = 0):
        self.seconds: dict[str, float] = {}
        self.timeline, self.step = timeline, step
        self._start = time.perf_counter()

    @contextmanager
    def __call__(self, phase: str):
        start, wall = time.perf_counter(), time.time()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds
            if self.timeline is not None:
                self.timeline.add(self.step, ROLE_OF_PHASE.get(phase, "driver"), phase, wall, wall + seconds)

    def metrics(self) -> dict[str, float]:
        """time/<phase>, time/step (wall clock since construction) and time_frac/<phase>."""
        step = time.perf_counter() - self._start
        out = {f"time/{phase}": s for phase, s in self.seconds.items()}
        out["time/step"] = step
        out.update({f"time_frac/{phase}": s / step for phase, s in self.seconds.items()})
        return out
