"""gpu_check.py's `colocated` step: what a colocated step frees when the learner's states leave the device.

The learner (LearnerRole: the policy and its AdamW state, made by one warm-up update) and the HF engine share
one device. Phases, with the device's free memory after each (torch.cuda.mem_get_info, the cache emptied first):
  built     the learner (+ AdamW state) and the engine on the device
  generate  the engine samples a batch
  offload   the learner's parameters, gradients and optimizer state moved to host memory, cache emptied
  reload    moved back (bit-exact: every tensor's checksum as before)
  update    one update on the generated batch
  sync      the weights pushed into the engine (InProcessSync); the engine's tensors then equal the learner's
Checks: offloading freed at least 98% of the learner states' bytes (summed from the device's parameter, gradient and
optimizer tensors; the rest is allocator rounding and small blocks that share a segment with live tensors), the
round trip is exact, the update's loss is finite and the engine holds the learner's weights. Model: hidden 1024,
8 layers, GQA 16/4 heads, intermediate 4096, vocab 512 (~122M parameters: ~1.4 GiB of fp32 weights + AdamW moments).

The moves: relayrl's own (learner.offload=between_phases: LearnerRole.offload_states/reload_states,
relayrl/learner/offload.py) on CUDA, with the config set to it; plain torch here (pinned host copies) when relayrl
lacks them, and the figure says which. Either way relayrl's count of the bytes it moves must equal the check's own.

CPU rehearsal: the "device" is this process's anonymous memory (RssAnon), the host copy is a file on disk, and
learner.return_freed_memory=true and malloc_trim (the CPU's empty_cache) so freed blocks go back to the system; a
smaller model (hidden 256, 4 layers); relayrl's moves are called once (they move nothing on a CPU learner) for
their byte count.
"""

from __future__ import annotations

import ctypes
import gc
import typing
from pathlib import Path

from relayrl.placement.sections import learner_settings


def relayrl_helper():
    """relayrl's own moves, `LearnerRole.offload_states()` / `reload_states()` (learner.offload=between_phases,
    relayrl/learner/offload.py; each returns the bytes it moved), or (None, why there are none)."""
    from relayrl.config.learner import LearnerConfig
    from relayrl.learner.role import LearnerRole

    choices = typing.get_args(LearnerConfig.model_fields["offload"].annotation)
    if "between_phases" not in choices:
        return None, f"relayrl has no learner.offload=between_phases (choices {'/'.join(choices)})"
    if not (
        callable(getattr(LearnerRole, "offload_states", None)) and callable(getattr(LearnerRole, "reload_states", None))
    ):
        return None, "learner.offload=between_phases is accepted but LearnerRole has no offload_states/reload_states"
    return (
        lambda role: role.offload_states(),
        lambda role: role.reload_states(),
    ), "relayrl's LearnerRole.offload_states/reload_states"


class PlainMoves:
    """The learner's states off the device and back with plain torch: each parameter's data, its gradient and every
    optimizer-state tensor, swapped for a host copy (CUDA: pinned memory; CPU rehearsal: one file on disk)."""

    def __init__(self, policy, work: Path):
        self.policy, self.path = policy, Path(work) / "colocated_states.pt"
        self.device = policy.device

    def slots(self):
        """(getter, setter) of every state tensor on the device."""
        for param in self.policy.model.parameters():
            yield (lambda p=param: p.data), (lambda t, p=param: setattr(p, "data", t))
            if param.grad is not None:
                yield (lambda p=param: p.grad), (lambda t, p=param: setattr(p, "grad", t))
        for state in self.policy.optimizer.state.values():
            for key, value in state.items():
                # AdamW's `step` counters are 0-d CPU tensors that torch keeps on the CPU: not device state
                if hasattr(value, "device") and value.device.type == self.device and value.dim() > 0:
                    yield (lambda s=state, k=key: s[k]), (lambda t, s=state, k=key: s.__setitem__(k, t))

    def state_bytes(self) -> int:
        return sum(get().numel() * get().element_size() for get, _ in self.slots())

    def offload(self) -> None:
        import torch

        slots = list(self.slots())
        if self.device == "cuda":
            for get, put in slots:
                host = torch.empty(get().shape, dtype=get().dtype, pin_memory=True)
                host.copy_(get(), non_blocking=True)
                put(host)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        else:
            torch.save([get() for get, _ in slots], self.path)
            for get, put in slots:
                put(torch.empty(0, dtype=get().dtype))
            gc.collect()
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # the CPU's empty_cache: free heap pages back to the system
        self.moved = slots

    def reload(self) -> None:
        import torch

        if self.device == "cuda":
            for get, put in self.moved:
                put(get().to("cuda", non_blocking=True))
            torch.cuda.synchronize()
        else:
            for (_, put), tensor in zip(self.moved, torch.load(self.path)):
                put(tensor)
            self.path.unlink()


def free_memory() -> int:
    """Free bytes on the device (CUDA), or minus this process's anonymous resident bytes (CPU rehearsal), so that
    `after - before` is what a phase freed either way; read with the allocator's cache emptied first (CPU:
    malloc_trim), so each figure is the live tensors' and the offload's gain is not inflated by cached blocks."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info()[0]
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return -int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def checksum(policy):
    import torch

    return torch.stack([p.detach().double().sum() for p in policy.model.parameters()]).cpu()


def run_colocated(work: Path) -> dict:
    import math

    import torch
    from gpu_check_common import config, device, experience, fmt, prompts, rollouts_experience, shaped_model, timed

    from relayrl.learner.role import LearnerRole
    from relayrl.rollout.hf_engine import HFEngine
    from relayrl.rollout.local_group import LocalEngineGroup
    from relayrl.sync.inprocess import InProcessSync
    from relayrl.types import Sampling

    cuda = device() == "cuda"
    shape = (
        {"vocab": 512, "hidden": 1024, "layers": 8, "heads": 16, "kv_heads": 4, "intermediate": 4096}
        if cuda
        else {"vocab": 512, "hidden": 256, "layers": 4, "heads": 4, "kv_heads": 2, "intermediate": 1024}
    )
    model_dir = shaped_model(work, "colocated" if cuda else "colocated_rehearsal", **shape)
    groups, n = 8, 4
    extra = ["rollout.max_tokens=32"] + ([] if cuda else ["learner.return_freed_memory=true"])
    helper, how = relayrl_helper()
    cfg = config(model_dir, *extra, groups=groups, n=n)
    if helper is not None and cuda:  # relayrl's setting for this (refused without CUDA: its states are in RAM already)
        cfg = config(model_dir, *extra, "learner.offload=between_phases", groups=groups, n=n)
    if cuda:
        torch.zeros(1, device="cuda")  # the context, before the first reading
    free = {"start": free_memory()}
    role = LearnerRole(learner_settings(cfg))
    role.update(0, role.prepare(experience(groups=groups, n=n, vocab=shape["vocab"])))  # AdamW state exists now
    engine = HFEngine(str(model_dir))
    group = LocalEngineGroup(engine)
    free["built"] = free_memory()
    rollouts = group.generate(prompts(groups, 16, shape["vocab"]), Sampling(n=n, max_tokens=32, seed=0), 0)
    free["generate"] = free_memory()

    moves = PlainMoves(role.policy, work)
    states = moves.state_bytes()  # parameters + gradients (none after the update) + AdamW moments, on the device
    before = checksum(role.policy)
    counted = None  # the bytes relayrl's offload_states says it moved
    if helper is not None:
        try:  # once before the measured round trip: its count, and any error, are reported
            counted = helper[0](role)
            helper[1](role)
        except Exception as err:  # noqa: BLE001  (reported; the plain moves measure instead)
            helper, how = None, f"{how} failed: {type(err).__name__}: {' '.join(str(err).split())[:160]}"
    if helper is not None and cuda:
        (off, on), used = helper, how
    else:
        off, on = (lambda _: moves.offload()), (lambda _: moves.reload())
        why = "the CPU stand-in (relayrl's moves have no device to leave here)" if helper is not None else how
        used = f"plain torch moves in the check: {why}"
    _, off_s = timed(off, role)
    free["offload"] = free_memory()
    _, on_s = timed(on, role)
    free["reload"] = free_memory()
    exact = torch.equal(checksum(role.policy), before)
    exp = rollouts_experience(rollouts, engine.pad_id)
    stats = role.update(1, role.prepare(exp)).metrics
    free["update"] = free_memory()
    sync = InProcessSync()
    sync.push(role, group)
    free["sync"] = free_memory()
    params = dict(engine.model.named_parameters())
    with torch.no_grad():
        synced = max(float((params[k] - w).abs().max()) for k, w in role.named_weights())

    freed = free["offload"] - free["generate"]
    scale, size = (2**30, "GiB") if cuda else (2**20, "MiB")
    checks = {
        "offload_freed_states": freed >= 0.98 * states,
        "round_trip_exact": exact,
        "loss_finite": math.isfinite(stats["loss/policy"]),
        "engine_has_weights": synced == 0.0,
    }
    if counted is not None:
        checks["relayrl_counts_the_states"] = counted == states
        used += f"; relayrl's offload_states counted {counted / scale:.3g} {size}"
    unit = f"free {size}" if cuda else f"-RssAnon {size} (rehearsal)"
    phases = " ".join(f"{k} {v / scale:.{2 if cuda else 0}f}" for k, v in free.items())
    figure = (
        f"freed {freed / scale:.3g} {size} of {states / scale:.3g} {size} states ({fmt(freed / max(states, 1))}x), off "
        f"{off_s:.2f} s / on {on_s:.2f} s; {unit}: {phases}; moves: {used}"
    )
    details = {"free": free, "state_bytes": states, "relayrl_counted": counted, "freed": freed, "moves": used}
    details.update(off_s=off_s, on_s=on_s)
    return {"checks": checks, "figure": figure, "details": details}
