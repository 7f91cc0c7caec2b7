"""Colocated vs disaggregated placement from the memory per role (estimate.py): the devices each needs, phase by
phase, and whether the colocated layout fits one node. What the code can express, and its overrides, is advice.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from relayrl.planner.estimate import Memory
from relayrl.planner.hardware import Hardware


@dataclass(frozen=True)
class Placement:
    generate_phase: float  # engine (one replica) + what stays resident while generating
    train_phase: float
    colocated_peak: float  # max over phases
    disaggregated: float  # sum of the pools
    colocated_devices: float  # a device count; math.inf when generating leaves no room for the resident states
    trainer_devices: int
    rollout_devices: int
    group_devices: int  # one node of this hardware
    colocated: bool  # the recommendation
    ranks: int = 1  # learner ranks W; with W > 1 the phases above are per device (one rank each)
    rank_fits: bool = True  # W > 1: one rank's update phase fits its device
    push_phase: float = 0.0  # time-sharing: the engine's woken weights + the learner's states, at the push
    teacher_devices: int = 0  # the teacher's own actor's GPU(s) (teacher.engine=actor or vllm), in both counts

    @property
    def recommendation(self) -> str:
        if not self.rank_fits:
            return (
                f"{self.ranks} learner ranks do not fit: one rank's update phase is {self.train_phase / 1e9:.1f} GB "
                "per device (more ranks, see the smallest W)"
            )
        if self.colocated:
            return (
                f"colocated on {self.colocated_devices} device(s): the colocated peak "
                f"{self.colocated_peak / 1e9:.1f} GB fits one node of {self.group_devices}"
            )
        teacher = f" + teacher {self.teacher_devices}" if self.teacher_devices else ""
        return (
            f"disaggregated: trainer {self.trainer_devices} + rollout {self.rollout_devices}{teacher} device(s); "
            f"colocated needs {self.colocated_devices} > {self.group_devices} devices of one node"
        )

    @property
    def disaggregated_devices(self) -> int:
        return self.trainer_devices + self.rollout_devices + self.teacher_devices

    @property
    def device_sum(self) -> str:
        """The disaggregated count as the plan prints it: trainer + rollout (+ teacher) = total."""
        teacher = f" + {self.teacher_devices}" if self.teacher_devices else ""
        return f"{self.trainer_devices} + {self.rollout_devices}{teacher} = {self.disaggregated_devices}"


def place(
    memory: Memory, hardware: Hardware, gpu_memory_utilization: float, offload: bool = False, sleep: bool = False
) -> Placement:
    """Colocated: the phases time-slice the same devices, so the bill is the max of the phases; disaggregated:
    the trainer and the engine hold their own devices, so it is the sum. Roles are sharded evenly (FSDP /
    tensor parallel). On GPU the engine takes `gpu_memory_utilization` of every device it shares, so while
    generating the resident trainer states must fit in the rest: n >= resident / ((1 - util) * M) (none with
    `offload`, learner.offload=between_phases); and unless the engine sleeps while the learner trains
    (`sleep`, rollout.sleep), the update too must fit in (1 - util) * M. With `sleep` the push lands before the
    learner offloads (relayrl/placement/time_sharing.py): the engine's weights and the learner's states share the
    device then (`push_phase`)."""
    resident = 0.0 if offload else memory.resident
    if memory.ranks > 1:
        return with_teacher(place_ranks(memory, hardware, gpu_memory_utilization, resident, sleep), memory, hardware)
    return with_teacher(place_one(memory, hardware, gpu_memory_utilization, resident, sleep), memory, hardware)


def with_teacher(placed: Placement, memory: Memory, hardware: Hardware) -> Placement:
    """A teacher in its own actor (relayrl/planner/teacher.py): on GPUs its own device(s) join every layout's
    count (its Ray bundle holds a GPU of its own, colocated or not) and its bytes the disaggregated sum; on a CPU
    its weights (and a vLLM teacher's KV cache) share the host with every phase."""
    own = memory.teacher_apart + memory.teacher_kv
    if not own:
        return placed
    if not memory.teacher_devices:
        generate, train = placed.generate_phase + own, placed.train_phase + own
        peak = max(generate, train, placed.push_phase)
        devices = math.ceil(peak / (hardware.memory_gb * 1e9))
        return replace(
            placed,
            generate_phase=generate,
            train_phase=train,
            colocated_peak=peak,
            disaggregated=placed.disaggregated + own,
            colocated_devices=max(placed.colocated_devices, devices),
            colocated=placed.colocated and devices <= hardware.devices_per_node,
        )
    devices = placed.colocated_devices + memory.teacher_devices
    return replace(
        placed,
        disaggregated=placed.disaggregated + own,
        colocated_devices=devices,
        colocated=placed.colocated and devices <= hardware.devices_per_node,
        teacher_devices=memory.teacher_devices,
    )


def place_one(
    memory: Memory, hardware: Hardware, gpu_memory_utilization: float, resident: float, sleep: bool
) -> Placement:
    """One learner process: the phases and device counts of `place`, before a teacher's own actor."""
    generate, train = memory.engine + resident, memory.trainer
    push = memory.engine_weights + memory.states if sleep else 0.0
    per_device = hardware.memory_gb * 1e9
    trainer = math.ceil(train / per_device)
    if hardware.kind == "cpu":  # a fixed-size KV cache: the phases are plain byte counts
        colocated, rollout = math.ceil(max(generate, train) / per_device), math.ceil(memory.engine / per_device)
    else:
        beside_engine = (1 - gpu_memory_utilization) * per_device
        generating = math.ceil(resident / beside_engine) if beside_engine else math.inf
        training = trainer if sleep else (math.ceil(train / beside_engine) if beside_engine else math.inf)
        pushing = math.ceil(push / per_device)
        colocated, rollout = max(training, generating, pushing, memory.engine_devices), memory.engine_devices
    return Placement(
        generate,
        train,
        max(generate, train, push),
        memory.engine + memory.trainer,
        colocated,
        trainer,
        rollout,
        hardware.devices_per_node,
        colocated <= hardware.devices_per_node,
        push_phase=push,
    )


def place_ranks(
    memory: Memory, hardware: Hardware, gpu_memory_utilization: float, resident: float, sleep: bool = False
) -> Placement:
    """W learner ranks, one device each: a rank holds 1/W of the states and its own micro-batch's activations.
    Colocated, each rank's device also hosts the engine's share while generating (on GPU the engine takes
    `gpu_memory_utilization` of it, on CPU its bytes), so 1/W of the resident states must fit beside it; and
    unless the engine sleeps (`sleep`), so must the rank's whole update phase."""
    ranks, per_device = memory.ranks, hardware.memory_gb * 1e9
    if hardware.kind == "cpu":
        rollout = math.ceil(memory.engine / per_device)
        beside_engine = per_device - memory.engine
    else:
        rollout, beside_engine = memory.engine_devices, (1 - gpu_memory_utilization) * per_device
    generate, train = memory.engine / rollout + resident / ranks, memory.rank_trainer
    push = memory.engine_weights / rollout + memory.states / ranks if sleep else 0.0  # before the offload
    fits = train <= per_device
    colocated = max(ranks, rollout)
    return Placement(
        generate,
        train,
        max(generate, train, push),
        memory.engine + ranks * train,
        colocated,
        ranks,
        rollout,
        hardware.devices_per_node,
        fits
        and resident / ranks <= beside_engine
        and (sleep or hardware.kind == "cpu" or train <= beside_engine)
        and push <= per_device
        and colocated <= hardware.devices_per_node,
        ranks,
        fits,
        push,
    )
