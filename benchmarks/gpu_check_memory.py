"""gpu_check.py's `colocated_memory` step: a colocated learner's device memory per phase, measured, beside the
figures `relayrl plan` gives for it (relayrl/planner/simulate_report.py `planned_phases`) and, on a GPU, the fake-tensor
simulation's (relayrl/planner/simulate.py), so the first GPU says how far the planner and the simulation are.

The choreography is the colocated one (placement.mode=local: the learner returns its cached blocks after it is built
and after each update, relayrl/learner/role.py; its states leave the device between phases): build the learner
(`load`, `after_load`), the first pre-update passes (`first_pass`), a warm-up update (AdamW's state exists from then
on), the passes of the next step (`passes`), its update (`update`, `after_update`), the states moved out
(`after_offload`, learner.offload=between_phases on CUDA). One micro-batch at the limits the plan sizes
(relayrl/planner/simulate.py `step_batch`), the reference on (algorithm.kl.coef > 0).
Measured: CUDA's allocator, `max_memory_allocated` over each phase (its peak reset first) and `memory_allocated` after
it, less what was allocated before the learner (the CUDA context is not in either). Checks: every phase measured, the
update's loss finite, the offload leaving at most 5% of the states; the ratios to the plan are the figure, not a
check (the first GPU settles what they are: allocator rounding, cuBLAS's workspace, kernels' scratch).

CPU rehearsal: the "device" is the CPU, its bytes counted by torch's MemTracker (every tensor's storage, as the
simulation counts fake ones; the weights read from the file are added once built, so `load` is the built models);
the plan is the `cpu` profile's (fp32 throughout); nothing moves (the states are in host memory already), so
`after_offload` is `after_update`; the simulation, a GPU's, is left out. A smaller model.
"""

from __future__ import annotations

import math
from pathlib import Path

GPU_SHAPE = {"vocab": 512, "hidden": 1024, "layers": 8, "heads": 16, "kv_heads": 4, "intermediate": 4096}
CPU_SHAPE = {"vocab": 512, "hidden": 128, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 256}
PHASES = ("load", "after_load", "first_pass", "passes", "update", "after_update", "after_offload")


class CudaMeter:
    """Bytes the CUDA allocator hands out, from a baseline taken before the learner exists."""

    def __init__(self):
        import torch

        self.torch = torch
        torch.zeros(1, device="cuda")  # the context first
        self.base = torch.cuda.memory_allocated()

    def __enter__(self):
        return self

    def __exit__(self, *args) -> None:
        pass

    def mark(self) -> None:
        self.torch.cuda.synchronize()
        self.torch.cuda.reset_peak_memory_stats()

    @property
    def peak(self) -> float:
        self.torch.cuda.synchronize()
        return float(self.torch.cuda.max_memory_allocated() - self.base)

    @property
    def live(self) -> float:
        self.torch.cuda.synchronize()
        return float(self.torch.cuda.memory_allocated() - self.base)


def cpu_meter():
    """The rehearsal's meter: torch's MemTracker over real CPU tensors (relayrl/planner/simulate.py's, unhooked)."""
    from relayrl.planner.simulate import DeviceTracker

    tracker = DeviceTracker()
    tracker.mark()
    return tracker


def measure(meter, settings, exp, offload: bool) -> dict[str, float]:
    """The learner's phases (PHASES) on `meter`, for one micro-batch `exp`; `offload`: its states leave the device."""
    from relayrl.learner.role import LearnerRole

    measured: dict[str, float] = {}

    def phase(name, run, *args):
        meter.mark()
        out = run(*args)
        measured[name] = meter.peak
        return out

    with meter:
        role = phase("load", LearnerRole, settings)
        loaded = getattr(meter, "track_external", None)
        if loaded is not None:  # MemTracker: weights read from a file were made by no op it saw
            loaded(*[m for m in (role.policy.model, role.policy.reference) if m is not None])
            measured["load"] = max(measured["load"], meter.live)
        measured["after_load"] = meter.live
        prepared = phase("first_pass", role.prepare, exp)
        with_signal(prepared)
        role.update(0, prepared)
        prepared = phase("passes", role.prepare, exp)
        with_signal(prepared)
        stats = phase("update", role.update, 1, prepared).metrics
        measured["after_update"] = meter.live
        if offload:
            role.offload_states()
        measured["after_offload"] = meter.live
    measured["loss"] = stats["loss/policy"]
    return measured


def with_signal(exp) -> None:
    """Advantages and returns for the update (their values do not change its memory)."""
    import torch

    exp.advantages, exp.returns = torch.ones_like(exp.loss_mask), torch.zeros_like(exp.loss_mask)


def run_colocated_memory(work: Path) -> dict:
    from gpu_check_common import config, device, fmt, shaped_model

    from relayrl.placement.sections import learner_settings
    from relayrl.planner import PROFILES, load_shape, make_plan
    from relayrl.planner.checkpointing import this_gpu
    from relayrl.planner.simulate import step_batch
    from relayrl.planner.simulate_report import planned_phases

    cuda = device() == "cuda"
    shape = GPU_SHAPE if cuda else CPU_SHAPE
    model_dir = shaped_model(work, "memory" if cuda else "memory_rehearsal", **shape)
    limits = ["data.max_prompt_tokens=64", "rollout.max_tokens=64", "train.micro_batch=4", "algorithm.kl.coef=0.01"]
    cfg = config(model_dir, *limits, "placement.mode=local", "train.logits_chunk=0", groups=2, n=2)
    hardware = this_gpu() if cuda else PROFILES["cpu"]
    assert hardware is not None
    plan = make_plan(cfg, load_shape(str(model_dir)), hardware, read_prompts=False)
    offload = cuda and plan.offload
    planned = planned_phases(plan, offload)
    work_ = plan.workload
    exp = step_batch(work_.micro_batch, work_.prompt_tokens, work_.response_tokens, 1)
    meter = CudaMeter() if cuda else cpu_meter()
    measured = measure(meter, learner_settings(cfg), exp, offload)
    simulated = {}
    if cuda:  # the simulation's prediction of this GPU (fake tensors, seconds)
        from relayrl.planner.simulate import simulate

        simulated = simulate(learner_settings(cfg), work_, offload).phases
    unit = 2**30 if cuda else 2**20
    rows = []
    for name in PHASES:
        sim = f" sim {simulated[name] / unit:.3g}" if simulated else ""
        rows.append(f"{name} {measured[name] / unit:.3g}/{planned[name] / unit:.3g}{sim}")
    ratios = {name: measured[name] / max(planned[name], 1.0) for name in PHASES}
    states = plan.memory.resident
    checks = {
        "every_phase_measured": all(measured[name] >= 0 for name in PHASES),
        "loss_finite": math.isfinite(measured["loss"]),
        "offload_leaves_the_states": (not offload) or measured["after_offload"] <= 0.05 * states + 2**26,
    }
    size = "GiB" if cuda else "MiB (rehearsal: MemTracker on CPU, cpu plan)"
    worst = max(ratios.values(), key=lambda r: abs(r - 1))
    figure = f"measured/planned{'/simulated' if simulated else ''} {size}: {'; '.join(rows)}; worst ratio {fmt(worst)}"
    details = {"measured": measured, "planned": planned, "simulated": simulated, "ratios": ratios}
    details.update(offload=offload, checkpointing=work_.checkpointing, hardware=hardware.name)
    return {"checks": checks, "figure": figure, "details": details}
