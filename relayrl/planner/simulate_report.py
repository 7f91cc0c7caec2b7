"""The planner's bytes per learner phase beside the simulation's (relayrl/planner/simulate.py), and what
`relayrl plan plan.simulate=true` prints: one row per phase, planned, simulated and their ratio, and for a colocated
GPU what the engine finds free at each phase boundary.

The planned phases (one rank of W, in bytes), from the planner's memory table (estimate.py) and its formulas
(learner_memory.py):
- load: every model the learner builds, whole and in fp32 as `load_causal_lm` reads it (policy, reference when
  kl.coef > 0 without LoRA, critic under GAE); the reference is then cast to bf16 (its largest tensor, the
  embeddings, briefly in both); sharded rank 0 then adds the policy's shards before its whole copy goes;
- first_pass: the weights (no optimizer state yet), their bf16 copies (`weight_copies`) and the layout's one-time
  check (`check_logits`);
- passes: the resident states, the copies and a no-grad pass (`pass_logits`);
- update: `Memory.rank_trainer` (states / W + activations + logits);
- after_update: `Memory.resident` / W (no gradients); after_offload: 0 where the states leave the GPU.
"""

from __future__ import annotations

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
    load = full + cast
    if ranks > 1:  # after the cast, the policy's first shards beside its whole copy
        load = max(load, full - (shape.params * 4 - m.reference if m.reference else 0.0) + shape.params * 4 / ranks)
    copies = weight_copies(shape, ranks, vb, backward=False, reference=m.reference > 0)
    resident = m.resident / ranks
    return {
        "load": load,
        "first_pass": weights + copies + check_logits(shape, *positions, vb, w.logits_chunk),
        "passes": resident + copies + pass_logits(shape, *positions, vb, w.logits_chunk),
        "update": m.rank_trainer,
        "after_update": resident,
        "after_offload": 0.0 if offload else resident,
    }


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


def print_simulation(plan: Plan, simulated: SimulatedMemory, offload: bool, colocated: bool) -> None:
    """The table `relayrl plan plan.simulate=true` prints after the plan."""
    from rich.console import Console
    from rich.table import Table

    planned = planned_phases(plan, offload)
    ratios = agreement(simulated, planned)
    memory_gb, util = plan.hardware.memory_gb, plan.workload.gpu_memory_utilization
    table = Table(
        title=f"learner memory per GPU, simulated ({simulated.ranks} rank(s), {simulated.rows} rows x "
        f"{simulated.positions // simulated.rows} positions a micro-batch; {simulated.seconds:.0f} s)",
        title_justify="left",
    )
    for column in ("phase", "planned", "simulated", "sim / plan"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    if colocated:
        table.add_column(f"engine's {util:g} x {memory_gb:g} GB fits beside it", justify="right")
    for phase, value in planned.items():
        row = [phase, f"{value / 1e9:.2f} GB", f"{simulated.phases[phase] / 1e9:.2f} GB", f"{ratios[phase]:.2f}"]
        if colocated:
            free = memory_gb * 1e9 - simulated.phases[phase]
            row.append("yes" if free >= util * memory_gb * 1e9 else f"no: {free / 1e9:.1f} GB free")
        table.add_row(*row)
    Console().print(table)
