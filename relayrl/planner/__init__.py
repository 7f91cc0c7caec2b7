"""`relayrl plan`: memory per role, placement and step time of a config on a hardware profile, before a run.

`shape` reads the model's size from config.json, `hardware` holds the device profiles (and measures this
CPU), `probe` measures matmuls at the model's shapes and the engine's fixed costs, `estimate` does the memory
arithmetic, `timing` the step time, `report` prints every input and formula; `vision` adds a vision-language
model's tower and connector to each (`vision_report` prints them). Nothing here loads weights.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from relayrl.config import Config
from relayrl.models.shape import ModelShape, count_params, load_shape
from relayrl.placement.sections import colocation
from relayrl.planner.advice import Advice, advise
from relayrl.planner.checkpointing import KEY as CHECKPOINTING
from relayrl.planner.checkpointing import plan_checkpointing
from relayrl.planner.estimate import (
    Memory,
    Precision,
    Workload,
    estimate_memory,
    precision_for,
    smallest_ranks,
    workload_from_config,
)
from relayrl.planner.hardware import PROFILES, Hardware, get_profile
from relayrl.planner.placement import Placement, place
from relayrl.planner.prompts import PromptLengths, sample_prompt_lengths
from relayrl.planner.timing import Rates, StepTime, estimate_time, measured_rates, profile_rates
from relayrl.planner.vision import vision_workload
from relayrl.rollout.sleep import time_sharing_on


@dataclass(frozen=True)
class Plan:
    shape: ModelShape
    workload: Workload
    hardware: Hardware
    precision: Precision
    memory: Memory
    placement: Placement
    time: StepTime
    rates: Rates
    offload: bool
    advice: Advice  # a placement the code can express, with its overrides (relayrl/planner/advice.py)
    # Per plan.hardware profile: the least learner ranks W whose rank fits and that rank's update phase in bytes;
    # None and the activations + logits of one micro-batch when no W fits
    smallest_ranks: tuple[tuple[str, int | None, float], ...] = ()
    prompts: PromptLengths | str = "not asked to"  # prompt lengths sampled from data.train, or why not
    sleep: bool = False  # colocated: the engine sleeps while the learner trains (rollout.sleep, on the target)
    busy: str = ""  # plan.measure on a machine whose load average passed its cores: said in the plan, not hidden


def make_plan(
    config: Config,
    shape: ModelShape,
    hardware: Hardware,
    fp32_master: bool = True,
    infer_dtype: str | None = None,
    offload: bool = False,
    longest_prompt_tokens: float | None = None,
    longest_response_tokens: float | None = None,
    measure: bool = False,
    learner_ranks: int | None = None,
    read_prompts: bool = True,
    mean_response_tokens: float | None = None,
) -> Plan:
    """`measure`: time the model's matmuls at this plan's shapes and the rollout engine's fixed costs here (starts
    the engine with a null model: ~15 s) instead of the profile's peak x MFU. `learner_ranks`: W sharded ranks in
    place of placement.learner_ranks. `read_prompts`: sample data.train for its prompt lengths (the expected longest
    of a batch sizes the learner's width unless `longest_prompt_tokens` is given; the mean sizes prefill).
    `mean_response_tokens`: a response's expected length (default the longest), as decode's costs scale with."""
    batch = config.rollout.prompts_per_step
    prompts = sample_prompt_lengths(config.data, config.model.path, batch) if read_prompts else "not asked to"
    read = isinstance(prompts, PromptLengths)
    if longest_prompt_tokens is None and read:
        longest_prompt_tokens = prompts.batch_longest
    work = workload_from_config(
        config,
        longest_prompt_tokens,
        longest_response_tokens,
        learner_ranks,
        prompts.mean if read else None,
        mean_response_tokens,
        checkpointing=False,
        gpu=hardware.kind != "cpu",  # teacher.engine auto, chosen for this plan's hardware
    )
    work = replace(work, **vision_workload(shape, prompts))  # images per prompt and their tokens (a VLM)
    # learner.activation_checkpointing as set, or what auto chooses on this plan's hardware
    asked = "auto" if CHECKPOINTING in config._auto else config.learner.activation_checkpointing
    colocated = colocation(config, as_asked=True).colocated
    work = replace(work, checkpointing=plan_checkpointing(asked, shape, work, hardware, colocated))
    precision = precision_for(hardware, fp32_master, infer_dtype)
    memory = estimate_memory(shape, work, hardware, precision)
    sleep, offloads = time_sharing_on(colocation(config, as_asked=True), hardware.kind != "cpu")
    offload = offload or offloads
    placement = place(memory, hardware, work.gpu_memory_utilization, offload, sleep)
    rates, busy = profile_rates(hardware), ""
    if measure:
        before = os.getloadavg()[0]
        rates = _measured_rates(config.model.path, config.rollout.engine, shape, work, memory.concurrent)
        load, cores = max(before, os.getloadavg()[0]), os.cpu_count() or 1
        if load > cores:
            busy = (
                f"measured at load average {load:.1f} on {cores} cores: other work shared the machine, so the "
                "rates (each the best of repeated probes) may still read low and the times high; measure when idle"
            )
    return Plan(
        shape,
        work,
        hardware,
        precision,
        memory,
        placement,
        estimate_time(shape, work, memory, placement, hardware, precision, rates),
        rates,
        offload,
        advise(shape, work, hardware, precision, memory, sleep, offload),
        tuple(_smallest_ranks(shape, work, fp32_master, infer_dtype)),
        prompts,
        sleep,
        busy,
    )


def _measured_rates(model: str, engine: str, shape: ModelShape, work: Workload, concurrent: int) -> Rates:
    """This machine's rates at the plan's shapes: the engine's matmuls (prefill, decode), the learner's passes
    through the model's own layers, and the engine's and learner's fixed costs (relayrl/planner/probe.py)."""
    from relayrl.planner.pass_probe import measure_pass_rates
    from relayrl.planner.probe import measure_engine_overhead, measure_matmul_rates

    matmul = measure_matmul_rates(shape, prefill_rows=int(work.micro_batch * work.width), decode_rows=concurrent)
    row = work.packed_width if work.packed else work.width  # a packed group or a padded sample
    passes = measure_pass_rates(model, shape, work.tokens // work.micro_batches, int(row))
    return measured_rates(passes, matmul, *measure_engine_overhead(engine, shape.layers))


def _smallest_ranks(shape: ModelShape, work: Workload, fp32_master: bool, infer_dtype: str | None):
    from relayrl.errors import ConfigError

    for name, hardware in PROFILES.items():
        try:
            memory = estimate_memory(shape, work, hardware, precision_for(hardware, fp32_master, infer_dtype))
        except ConfigError:  # the engine cannot run this config there at all
            continue
        ranks = smallest_ranks(memory, work, hardware)
        per_rank = memory.activations + memory.logits  # with no W: what no W divides
        yield name, ranks, per_rank + (memory.states / ranks if ranks else 0.0)


__all__ = ["PROFILES", "Plan", "ModelShape", "count_params", "get_profile", "load_shape", "make_plan"]
