"""`timeline.jsonl`: when each phase of each step ran, on which role, on one wall clock.

One row per phase run: `{"step", "role", "phase", "start", "end"}` (seconds since the epoch). The training
loop records its own phases through `StepTimer`; producer threads of the async schedules record each
engine's generation. `relayrl report` draws it, so the bubbles (a role waiting on another) are visible.
Rows are appended: a resumed run keeps the rows up to its checkpoint's step (relayrl/run/directory.py cuts
the rest, as it does for metrics.jsonl), and a new run starts in a directory without one.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

# the role whose work a loop phase stands for
ROLE_OF_PHASE = {
    "generate": "engines",
    "reward": "reward",
    "logprobs": "learner",
    "teacher": "teacher",
    "update": "learner",
    "sync": "sync",
    "probe": "sync",  # the push guard's parity probe (relayrl/sync/guard.py)
    "wait": "learner",
}


class Timeline:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._rows: list[dict] = []
        self._lock = threading.Lock()

    def add(self, step: int, role: str, phase: str, start: float, end: float) -> None:
        with self._lock:
            self._rows.append({"step": step, "role": role, "phase": phase, "start": start, "end": end})

    def flush(self) -> None:
        with self._lock:
            rows, self._rows = self._rows, []
        if rows:
            with self.path.open("a") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows)
