"""One timer for every phase of a step: `with timer("generate"): ...`, then `timer.metrics()`."""

from __future__ import annotations

import time
from contextlib import contextmanager


class StepTimer:
    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._start = time.perf_counter()

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        """time/<phase>, time/step (wall clock since construction) and time_frac/<phase>."""
        step = time.perf_counter() - self._start
        out = {f"time/{phase}": s for phase, s in self.seconds.items()}
        out["time/step"] = step
        out.update({f"time_frac/{phase}": s / step for phase, s in self.seconds.items()})
        return out
