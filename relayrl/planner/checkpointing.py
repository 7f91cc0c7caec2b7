"""`learner.activation_checkpointing: auto`: on where a colocated GPU run's update would not fit beside the engine.

The rule, from the planner's memory estimate (relayrl/planner/estimate.py): with checkpointing off, one learner
rank's update phase (`Memory.rank_trainer`: 1/W of the states, one micro-batch's activations and logits, the bf16
weight copies) is compared with what the engine's `rollout.gpu_memory_utilization` leaves the learner of its GPU,
(1 - utilisation) x the GPU's memory. More than that: on. Off on CPU (the learner's memory is the host's, and the
demo's numbers stay as they were), off where the engines have GPUs of their own (placement.layout=disaggregated),
off where the update fits. The builder resolves it once for this machine's GPU (`choose_checkpointing`, called by
relayrl/build.py `resolve`); `relayrl plan` asks the same question of its target hardware (`plan_checkpointing`),
so the plan and `plan.simulate` use the value the run would choose there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from relayrl.errors import ConfigError, ModelError
from relayrl.planner.hardware import PROFILES, Hardware

if TYPE_CHECKING:
    from relayrl.models.shape import ModelShape
    from relayrl.planner.estimate import Workload

KEY = "learner.activation_checkpointing"
DISAGGREGATED = "placement.layout=disaggregated: the learner has its GPUs to itself"


def needs_checkpointing(shape: ModelShape, work: Workload, hardware: Hardware, colocated: bool) -> tuple[bool, str]:
    """(on, why) for the update of `work` (its own checkpointing ignored) on `hardware`."""
    from relayrl.planner.estimate import estimate_memory, precision_for

    if hardware.kind == "cpu":
        return False, "no GPU: the learner's memory is the host's"
    if not colocated:
        return False, DISAGGREGATED
    share = work.gpu_memory_utilization
    memory = estimate_memory(shape, replace(work, checkpointing=False), hardware, precision_for(hardware))
    update, room = memory.rank_trainer, (1 - share) * hardware.memory_gb * 1e9
    sizes = (
        f"the update without it {update / 1e9:.1f} GB per GPU, {'over' if update > room else 'within'} the "
        f"{room / 1e9:.1f} GB that rollout.gpu_memory_utilization={share:g} leaves the learner of one "
        f"{hardware.name} ({hardware.memory_gb:.0f} GB)"
    )
    return update > room, f"colocated on a GPU: {sizes} (relayrl plan)"


def this_gpu() -> Hardware | None:
    """This process's first CUDA device as a planner profile (its memory; the rates are an H100's), or None."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return replace(PROFILES["H100-80GB"], name=props.name, memory_gb=props.total_memory / 1e9, source="this GPU")


def choose_checkpointing(
    model_path: str, work: Callable[[], Workload], colocated: bool, gpu: Callable[[], Hardware | None] | None = None
) -> tuple[bool, str]:
    """`learner.activation_checkpointing: auto` for this machine, once the engine and its share are chosen:
    `work` makes the config's workload (estimate.workload_from_config), `colocated`: an engine shares the learner's
    GPU, `gpu`: this machine's GPU profile, None without one (default `this_gpu`). Engines on GPUs of their own
    decide it before the GPU is asked (its memory cannot matter). A config the planner cannot size (no config.json,
    a KV cache too small for one sequence) keeps it off, saying why."""
    from relayrl.models.shape import load_shape

    if not colocated:
        return False, DISAGGREGATED
    hardware = (gpu or this_gpu)()
    if hardware is None:
        return False, "no GPU here: the learner's memory is the host's"
    try:
        return needs_checkpointing(load_shape(model_path), work(), hardware, colocated)
    except (ConfigError, ModelError) as err:
        return False, f"the planner could not size the update ({err})"


def plan_checkpointing(asked: bool | str, shape: ModelShape, work: Workload, hardware: Hardware, colocated: bool):
    """What a plan on `hardware` uses: learner.activation_checkpointing as set (`asked`), or what `auto` would
    choose there."""
    if asked == "auto":
        return needs_checkpointing(shape, work, hardware, colocated)[0]
    return bool(asked)
