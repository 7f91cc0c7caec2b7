"""`relayrl plan`: memory per role, placement and step time of a config on a hardware profile, before a run.

`shape` reads the model's size from config.json, `hardware` holds the device profiles (and measures this
CPU), `estimate` does the arithmetic, `report` prints every input and formula. Nothing here loads weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from relayrl.config import Config
from relayrl.planner.estimate import (Memory, Placement, Precision, StepTime, Workload, estimate_memory,
                                      estimate_time, place, precision_for, workload_from_config)
from relayrl.planner.hardware import PROFILES, Hardware, get_profile
from relayrl.planner.shape import ModelShape, count_params, load_shape


@dataclass(frozen=True)
class Plan:
    shape: ModelShape
    workload: Workload
    hardware: Hardware
    precision: Precision
    memory: Memory
    placement: Placement
    time: StepTime
    offload: bool


def make_plan(config: Config, shape: ModelShape, hardware: Hardware, fp32_master: bool = True,
              infer_dtype: str | None = None, offload: bool = False,
              mean_response_tokens: float | None = None) -> Plan:
    work = workload_from_config(config, mean_response_tokens)
    precision = precision_for(hardware, fp32_master, infer_dtype)
    memory = estimate_memory(shape, work, hardware, precision)
    placement = place(memory, hardware, work.gpu_memory_utilization, offload)
    return Plan(shape, work, hardware, precision, memory, placement,
                estimate_time(shape, work, memory, placement, hardware, precision), offload)


__all__ = ["PROFILES", "Plan", "ModelShape", "count_params", "get_profile", "load_shape", "make_plan"]
