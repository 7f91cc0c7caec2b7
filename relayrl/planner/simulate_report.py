"""The planner's bytes per learner phase beside the simulation's (relayrl/planner/simulate.py), and what
`relayrl plan plan.simulate=true` prints: one row per phase, planned, simulated and their ratio, and for a colocated
GPU whether the engine's share fits beside the learner at each phase boundary (`engine_boundaries`).

The planned phases (one rank of W, in bytes), from the planner's memory table (estimate.py) and its formulas
(learner_memory.py):
- load: one process: every model the learner builds, whole and in fp32 as `load_causal_lm` reads it (policy,
  reference when kl.coef > 0 without LoRA, critic under GAE); the reference is then cast to bf16 (its largest
  tensor, the embeddings, briefly in both). W ranks: rank 0 reads the models into CPU memory and every rank's
  device gets its shards only, filled one full tensor at a time (relayrl/learner/sharded_init.py): the peak is the
  shards filled so far and the model's largest tensor (the embeddings) in flight (`sharded_load`);
- after_load: the weights (no optimizer state yet), what a colocated learner keeps once it returns its cache;
- first_pass: the weights, their bf16 copies (`weight_copies`) and the layout's one-time check (`check_logits`);
- passes: the resident states, the copies and a no-grad pass (`pass_logits`);
- update: `Memory.rank_trainer` (states / W + activations + logits);
- after_update: `Memory.resident` / W (no gradients); after_offload: 0 where the states leave the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from relayrl.planner.learner_memory import check_logits, pass_logits, weight_copies

if TYPE_CHECKING:
    from relayrl.planner import Plan
    from relayrl.planner.simulate import SimulatedMemory

AGREEMENT = 0.15  # |simulated / planned - 1| the planner is held to (tests/unit/test_plan_simulate.py)
LEFT_ON_DEVICE = 2**26  # what an offload leaves on the GPU and the planner calls 0: buffers (rotary tables)


def planned_phases(plan: Plan, offload: bool) -> dict[str, float]:
    """The planner's bytes per phase on one GPU (rank 0 of W) for the phases the simulation measures."""
    m, w, shape = plan.memory, plan.workload, plan.shape
    ranks, vb, positions = m.ranks, plan.precision.activation_bytes, w.micro_positions()
    full = shape.params * 4 * (1 + w.critic + (w.reference and not w.lora_rank))
    weights = (m.states - m.gradients) / ranks - optimizer_state(plan) / ranks  # the states before any step
    cast = shape.vocab * shape.hidden * vb if m.reference and vb < 4 else 0.0  # the reference's embeddings, twice
    load = full + cast if ranks == 1 else sharded_load(plan, weights)
    copies = weight_copies(shape, ranks, vb, backward=False, reference=m.reference > 0)
    resident = m.resident / ranks
    return {
        "load": load,
        "after_load": weights,
        "first_pass": weights + copies + check_logits(shape, *positions, vb, w.logits_chunk),
        "passes": resident + copies + pass_logits(shape, *positions, vb, w.logits_chunk),
        "update": m.rank_trainer,
        "after_update": resident,
        "after_offload": 0.0 if offload else resident,
    }


def sharded_load(plan: Plan, weights: float) -> float:
    """One rank's device at load, W ranks: the models are filled in turn (policy, reference, critic), each from
    rank 0's host copy one full tensor at a time, so the peak is the shards filled so far and the largest tensor
    (the embeddings: fp32, the reference's in its bf16) in flight. `weights`: every shard, once filled."""
    m, shape, ranks = plan.memory, plan.shape, plan.memory.ranks
    largest = shape.vocab * shape.hidden
    reference, critic = m.reference / ranks, (shape.params * 4 / ranks if plan.workload.critic else 0.0)
    policy = weights - reference - critic
    stages = [policy + largest * 4]
    if m.reference:
        stages.append(policy + reference + largest * m.reference / shape.params)
    if critic:
        stages.append(weights + largest * 4)
    return max(stages)


def optimizer_state(plan: Plan) -> float:
    """AdamW's m and v of the actor and critic (whole model), which the first optimizer step creates."""
    adam = sum(b for name, b in plan.precision.train_terms if name.startswith("Adam"))
    per_param = plan.precision.train_bytes
    return (plan.memory.actor + plan.memory.critic) * adam / per_param


def agreement(simulated: SimulatedMemory, planned: dict[str, float]) -> dict[str, float]:
    """simulated / planned per phase (a planned 0 agrees, 1.0, with up to LEFT_ON_DEVICE simulated)."""
    return {
        phase: simulated.phases[phase] / planned[phase]
        if planned[phase]
        else (1.0 if simulated.phases[phase] <= LEFT_ON_DEVICE else float("inf"))
        for phase in planned
    }


@dataclass(frozen=True)
class Boundary:
    """A point of the step where the engine takes device memory beside the learner: what each holds then."""

    name: str
    phase: str  # the learner's phase whose bytes it holds then
    learner: float
    engine: float

    def free(self, device_bytes: float) -> float:
        """What is left on the device (negative: the engine's request fails, vLLM's free-memory check or a wake)."""
        return device_bytes - self.learner - self.engine


def engine_boundaries(plan: Plan, phases: dict[str, float], engine_first: bool) -> list[Boundary]:
    """Where a colocated engine takes memory beside the learner's `phases` (simulated or planned): when it starts
    (built before the learner under placement.mode=local, `engine_first`, so beside the load's peak; after the
    learner ranks elsewhere, placement/build.py, beside what they keep); with rollout.sleep, when it wakes its
    weights for the push (before the learner offloads, relayrl/placement/time_sharing.py) and its KV cache after;
    without sleep, it holds its share through every learner phase."""
    device = plan.hardware.memory_gb * 1e9
    share = plan.workload.gpu_memory_utilization * device
    start = "load" if engine_first else "after_load"
    out = [Boundary("engine starts", start, phases[start], share)]
    if plan.sleep:
        weights = plan.memory.engine_weights / plan.memory.engine_devices
        out.append(Boundary("engine wakes weights (push)", "after_update", phases["after_update"], weights))
    else:
        out += [Boundary(f"learner {phase}, engine awake", phase, phases[phase], share)
                for phase in ("first_pass", "passes", "update")]  # fmt: skip
    out.append(Boundary("engine wakes KV cache", "after_offload", phases["after_offload"], share))
    return out


def engine_fits(plan: Plan, phases: dict[str, float], engine_first: bool) -> list[str]:
    """The boundaries where the engine's share does not fit beside the learner, each with the bytes short."""
    device = plan.hardware.memory_gb * 1e9
    return [
        f"{b.name} ({b.phase}: learner {b.learner / 1e9:.1f} GB + engine {b.engine / 1e9:.1f} GB, "
        f"{-b.free(device) / 1e9:.1f} GB over {device / 1e9:g} GB)"
        for b in engine_boundaries(plan, phases, engine_first)
        if b.free(device) < 0
    ]


def print_simulation(
    plan: Plan, simulated: SimulatedMemory, offload: bool, colocated: bool, engine_first: bool
) -> None:
    """The tables `relayrl plan plan.simulate=true` prints after the plan."""
    from rich.console import Console
    from rich.table import Table

    planned = planned_phases(plan, offload)
    ratios = agreement(simulated, planned)
    table = Table(
        title=f"learner memory per GPU, simulated ({simulated.ranks} rank(s), {simulated.rows} rows x "
        f"{simulated.positions // simulated.rows} positions a micro-batch; {simulated.seconds:.0f} s)",
        title_justify="left",
    )
    for column in ("phase", "planned", "simulated", "sim / plan"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    for phase, value in planned.items():
        table.add_row(phase, f"{value / 1e9:.2f} GB", f"{simulated.phases[phase] / 1e9:.2f} GB", f"{ratios[phase]:.2f}")
    Console().print(table)
    if colocated and plan.hardware.kind == "gpu":
        Console().print(boundary_table(plan, simulated.phases, planned, engine_first))


def boundary_table(plan: Plan, simulated: dict[str, float], planned: dict[str, float], engine_first: bool):
    """At each boundary of `engine_boundaries`: the learner's bytes (simulated), the engine's, and what is free."""
    from rich.table import Table

    device = plan.hardware.memory_gb * 1e9
    util = plan.workload.gpu_memory_utilization
    table = Table(
        title=f"the engine beside the learner (simulated; its share {util:g} x {device / 1e9:g} GB)",
        title_justify="left",
    )
    for column in ("boundary", "learner phase", "learner", "engine", "free", "planned free"):
        table.add_column(column, justify="left" if column in ("boundary", "learner phase") else "right")
    for sim, plan_b in zip(
        engine_boundaries(plan, simulated, engine_first), engine_boundaries(plan, planned, engine_first)
    ):
        free = sim.free(device)
        table.add_row(sim.name, sim.phase, f"{sim.learner / 1e9:.1f} GB", f"{sim.engine / 1e9:.1f} GB",
                      f"{free / 1e9:.1f} GB" + ("" if free >= 0 else " (short)"),
                      f"{plan_b.free(device) / 1e9:.1f} GB")  # fmt: skip
    return table
