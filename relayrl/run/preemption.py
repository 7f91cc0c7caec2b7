"""Preemption: SIGTERM and SIGINT stop a run at the end of its current step, with a checkpoint to resume from.

`StopSignals` holds the driver's handlers for the length of a run. Until the training loop starts, a signal
stops the run at once (`Interrupted` is raised in the handler: there is nothing to save yet). Once the loop
runs (`during_steps`), the first signal only records itself: the step finishes, the loop writes a
checkpoint and raises `Interrupted`, and the caller closes every role (Ray actors, reward and environment
workers) on the way out. A signal sent to the whole process group (Ctrl-C, `timeout`, a scheduler) reaches those
workers too; they ignore it and wait to be closed (relayrl/rewards/supervised.py). A second signal exits the process at once, without a checkpoint, for a run that will not stop.
Handlers are process-wide and only the main thread may install them; elsewhere (a run started from a
worker thread) the signals keep their previous behaviour. Left out: SIGHUP, and scheduler-specific
warnings (SLURM's --signal), which can point at SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)
Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None  # what signal.signal returns


class Interrupted(BaseException):
    """A run stopped by a signal: after `step` with `checkpoint` written, or before its first step. Like
    KeyboardInterrupt it is no `Exception`, so no `except Exception` on the way out swallows it."""

    def __init__(
        self,
        signum: int,
        run_dir: str | Path | None = None,
        step: int | None = None,
        checkpoint: str | Path | None = None,
    ):
        self.signum, self.run_dir, self.step, self.checkpoint = signum, run_dir, step, checkpoint
        super().__init__(self.describe())

    @property
    def exit_status(self) -> int:
        return 128 + self.signum  # what a shell reports for a process ended by the signal

    def describe(self) -> str:
        name = signal.Signals(self.signum).name
        where = "before the first step" if self.step is None else f"at step {self.step}"
        saved = f"; checkpoint {self.checkpoint}" if self.checkpoint is not None else ""
        return f"interrupted by {name} {where}{saved}"


def exit_on_next_signal() -> None:
    """After a stop, while the process winds down (Ray's shutdown at exit): a further signal exits at once."""
    if threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            signal.signal(signum, lambda number, frame: os._exit(128 + number))


class StopSignals:
    """SIGTERM/SIGINT handlers for one run; `requested` is the first signal's number once one arrived."""

    def __init__(self, log=lambda text: print(text, file=sys.stderr, flush=True)):
        self.requested: int | None = None
        self.deferred = False
        self._previous: dict[int, Handler] = {}
        self._log = log

    def __enter__(self) -> StopSignals:
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def install(self) -> None:
        """(Re)install the handlers: libraries started since (vLLM, Ray) may have replaced them."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in SIGNALS:
            previous = signal.signal(signum, self._handle)
            self._previous.setdefault(signum, previous)

    @contextmanager
    def during_steps(self):
        """From here a first signal waits for the end of the current step."""
        installed_here = not self._previous
        self.install()
        self.deferred = True
        try:
            yield self
        finally:
            self.deferred = False
            if installed_here:
                self.__exit__()

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:
            self._log(f"relayrl: second signal ({name}): exiting now, without a checkpoint")
            os._exit(128 + signum)  # deliberately skips cleanup: whatever blocked the first stop may block it too
        self.requested = signum
        if not self.deferred:
            raise Interrupted(signum)
        self._log(
            f"relayrl: {name} received: stopping after the current step with a checkpoint "
            "(send it again to exit at once)"
        )
