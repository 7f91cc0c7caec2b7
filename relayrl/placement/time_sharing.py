"""Colocated time-sharing: one device, the engine and the learner each holding it only for their phase.

With `rollout.sleep` a level (and `learner.offload=between_phases`), a step runs in this order:
  generate (the learner's states in CPU memory) -> the engine sleeps (level 1: weights to CPU; 2: dropped) ->
  the learner's states come back -> log-probs, update -> the engine wakes its weights -> the push lands, read
  from the learner's device -> the learner's states leave the device -> the engine wakes its KV cache -> the
  next generate.
Pushing before the offload (as verl does) reads the weights from device memory rather than pageable host memory
(an H2D copy and a cast per push avoided); the price is the peak at the push, the engine's weights beside the
learner's states, which the planner bills (relayrl/planner/placement.py, `colocated_push_bytes`).
The learner leaves the device once before the first generate. `TimeSharing.off()` is the no-op the step holds
when time-sharing is off (disaggregated runs, CPU, overlapped schedules): the step never asks which it has.
The memory each phase frees is measured on a GPU by benchmarks/gpu_check.sh (the `colocated` step).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TimeSharing:
    engines: Any  # an EngineGroup (sleep, wake_up)
    learner: Any  # a Learner with offload_states / reload_states
    sleep_level: int | None  # None: the engine stays awake
    offload: bool  # learner.offload=between_phases
    asleep: list[str] = field(default_factory=list)  # what of the engine sleeps now (weights, kv_cache)

    @classmethod
    def from_settings(cls, sleep: int | str, offload: str, engines, learner) -> TimeSharing:
        """From `rollout.sleep` and `learner.offload`, both resolved (relayrl/rollout/sleep.py)."""
        level = sleep if isinstance(sleep, int) else None  # resolved: off, 1 or 2
        return cls(engines, learner, level, offload == "between_phases")

    @classmethod
    def off(cls) -> TimeSharing:
        return cls(None, None, None, False)

    @property
    def on(self) -> bool:
        return self.sleep_level is not None or self.offload

    def start(self) -> None:
        """Before the first generate: the engine has the device."""
        if self.offload:
            self.learner.offload_states()

    def before_update(self, timer) -> None:
        with timer("swap") if self.on else nullcontext():
            if self.sleep_level is not None:
                self.engines.sleep(self.sleep_level)
                self.asleep = ["weights", "kv_cache"]
            if self.offload:
                self.learner.reload_states()

    def before_push(self, timer) -> None:
        """The engine's weights wake to take the push; the learner keeps the device until it is sent."""
        if self.sleep_level is not None:
            with timer("swap"):
                self.engines.wake_up(["weights"])
            self.asleep = ["kv_cache"]

    def after_push(self, timer) -> None:
        """The push is in: the learner's states leave, then the engine's KV cache takes their room."""
        with timer("swap") if self.on else nullcontext():
            if self.offload:
                self.learner.offload_states()
            if self.sleep_level is not None:
                self.engines.wake_up(["kv_cache"])
                self.asleep = []

    def wake(self) -> None:
        """Whatever of the engine still sleeps wakes (a learner restart pushes weights and then generates)."""
        if self.asleep:
            self.engines.wake_up(self.asleep)
            self.asleep = []
