"""The async schedule's prompt ledger: every prompt drawn and not yet settled, so a checkpoint loses none.

Under `async` the producers draw prompts ahead of the learner: at any moment some are being generated, some are
scored and waiting in the buffer, some are carried as partial rollouts. A checkpoint written then must not skip
them (the sampler's position is already past them). The ledger records each draw (its sampler row, in draw
order) and settles it when its fate is decided the way the uninterrupted run decides it: its group taken by the
learner, dropped as too stale, discarded unfinished, or left with no kept sample (a failed reward, dropped
trajectories). What is unsettled at a checkpoint goes into the sampler's state as rows to replay, so the resumed
run draws those prompts again before going on: they are generated anew, with the checkpoint's weights (so the
staleness bound holds after the resume as before it), multi-turn ones from their first turn.

Why prompts and not the rollouts themselves: a rollout in flight has no tokens to save yet, and a saved one
would carry versions that the resumed run's bound must count; drawing again is simple and loses nothing but the
generation time. Thread-safe: producers draw and settle, the training loop settles and snapshots.
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relayrl.types import Prompt


class PromptLedger:
    def __init__(self):
        self._open: dict[int, tuple[int, str]] = {}  # draw number -> (sampler row, prompt id), in draw order
        self._draws = itertools.count()
        self._lock = threading.Lock()

    def drawn(self, rows: list[tuple[int, Prompt]]) -> None:
        """Record prompts just drawn (call it under the lock that serialises the draws, so the order is theirs)."""
        with self._lock:
            for row, prompt in rows:
                self._open[next(self._draws)] = (row, prompt.id)

    def settle(self, prompt_ids: list[str]) -> None:
        """Each id settles the oldest open draw of that prompt (a prompt drawn twice, in two epochs, has two)."""
        with self._lock:
            for prompt_id in prompt_ids:
                draw = next((d for d, (_, pid) in self._open.items() if pid == prompt_id), None)
                if draw is not None:
                    del self._open[draw]

    def open_rows(self) -> list[int]:
        """The sampler rows drawn and not settled, oldest first."""
        with self._lock:
            return [row for row, _ in self._open.values()]

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)
