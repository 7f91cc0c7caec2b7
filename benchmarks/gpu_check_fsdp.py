"""gpu_check.py's `fsdp` and `two_gpus` steps: FSDP2 learner ranks (relayrl.learner.sharded.sharded_learner, as
tests/unit/test_sharded_scenarios.py starts them) against the one-process learner on the same batch.

Each rank is a spawned process (torch.multiprocessing) in a learner group (NCCL on CUDA, gloo on CPU): it shards
the tiny Llama, runs one update with gradient clipping (train.grad_clip=0.05, so the clip acts), then gathers
every weight with `named_weights()` (DTensor.full_tensor). Rank 0 saves what it found; the parent runs the
one-process learner on the whole batch and compares.

`fsdp` (W=1) on CUDA sets learner.offload=params (FSDP2's CPUOffloadPolicy) on the validated config: relayrl's
config check refuses it below two learner ranks (relayrl/config/learner.py), which one GPU cannot host, so the
check assigns it after validation to reach the offloaded code path anyway. The CPU rehearsal keeps offload=none
(offload=params is refused without CUDA by design). These are the cases verl works around: with parameters,
gradients and optimizer state offloaded to CPU, the grad-norm reduction and the full-tensor all-gathers meet
CPU tensors, which an NCCL-only process group cannot reduce (verl builds its group as "cpu:gloo,cuda:nccl" and
moves the norm to the GPU). The figure counts the collectives DTensor issues in clip_grad_norm_ and in the
gathers: a one-rank mesh issues none (measured here: 0 and 0 at W=1, 1 and 29 at W=2), so on one GPU the step
proves the offloaded shards, the bf16-over-fp32 passes, the CPU optimizer step and the gathers' values, and
only `two_gpus` (W=2, offload=params) meets the NCCL-with-CPU-tensors case itself.

Weights are compared in units of the learning rate: AdamW's first step moves every element by at most lr
(m/sqrt(v) = sign(g)), so two numerics (FSDP2's bf16 mixed precision vs the one-process bf16 autocast) can differ
by at most 2 lr, while a misplaced or stale shard differs by the weights' own scale (~0.02 = 20 lr here).
"""

from __future__ import annotations

import math
from pathlib import Path

from relayrl.placement.sections import learner_settings

GROUPS, N = 4, 4
LR = 1e-3
HINT_NCCL_CPU = (
    " [an NCCL-only learner group meets CPU-offloaded shards: relayrl/learner/process_group.py would need a "
    "'cpu:gloo,cuda:nccl' group, or the grad norm moved to CUDA, as verl does]"
)


def fsdp_config(model_dir):
    from gpu_check_common import config

    return config(model_dir, "train.micro_batch=4", "train.grad_clip=0.05", f"train.lr={LR}", groups=GROUPS, n=N)


def count_clip_collectives() -> list[int]:
    """Wrap torch.nn.utils.clip_grad_norm_ in this rank's process (relayrl's policy calls it by that name) so that the
    collectives DTensor issues in it are counted (CommDebugMode; around the whole update its module tracker trips on
    the model's hooks). A one-rank mesh issues none; two ranks issue the norm's all-reduce on the shards' device."""
    import torch
    from torch.distributed.tensor.debug import CommDebugMode

    counted, clip = [0], torch.nn.utils.clip_grad_norm_

    def wrapped(*args, **kwargs):
        with CommDebugMode() as comms:
            norm = clip(*args, **kwargs)
            float(norm)  # the norm's own gather, if any, as the caller's float() would
        counted[0] += comms.get_total_counts()
        return norm

    torch.nn.utils.clip_grad_norm_ = wrapped
    return counted


def rank_main(rank: int, world: int, port: int, model_dir: str, offload: bool, result_path: str) -> None:
    import torch
    from gpu_check_common import experience, threads
    from torch.distributed.tensor.debug import CommDebugMode

    from relayrl.learner.process_group import leave_learner_group, split_by_groups
    from relayrl.learner.sharded import sharded_learner, transformer_blocks

    torch.set_num_threads(max(1, threads() // world))
    cfg = fsdp_config(model_dir)
    if offload:
        cfg.learner.offload = "params"  # see the module docstring: refused by the config check at one rank
    phase = "join the group and shard"
    try:
        learner = sharded_learner(learner_settings(cfg), rank, world, "127.0.0.1", port, timeout_s=120)
        model = learner.policy.model
        passes: set[str] = set()
        layer = transformer_blocks(learner.policy.network)[0]
        layer.register_forward_pre_hook(lambda m, _: passes.add(str(next(m.parameters()).dtype)[6:]))
        masters = {str(p.dtype)[6:] for p in model.parameters()}
        shards_on = {p.to_local().device.type for p in model.parameters()}
        phase = "update with gradient clipping"
        part = split_by_groups(experience(groups=GROUPS, n=N), world)[rank]
        clip_comms = count_clip_collectives()
        stats = learner.update(0, learner.prepare(part)).metrics
        phase = "named_weights (full_tensor gathers)"
        with CommDebugMode() as comms:
            weights = {name: tensor.detach().to("cpu", copy=True) for name, tensor in learner.named_weights()}
        gather_comms = comms.get_total_counts()
        gathered = sum(t.numel() * t.element_size() for t in weights.values())
        if rank == 0:
            torch.save(
                {
                    "weights": weights,
                    "gathered_bytes": gathered,
                    "grad_norm": stats["actor/grad_norm"],
                    "loss": stats["loss/policy"],
                    "passes": sorted(passes),
                    "masters": sorted(masters),
                    "shards_on": sorted(shards_on),
                    "offload": cfg.learner.offload,
                    "comms": (clip_comms[0], gather_comms),
                },
                result_path,
            )
    except Exception as err:
        hint = HINT_NCCL_CPU if "backend" in str(err).lower() and "cpu" in str(err).lower() else ""
        raise RuntimeError(f"rank {rank} of {world}, {phase}: {type(err).__name__}: {err}{hint}") from err
    finally:
        leave_learner_group()


def run_fsdp(work: Path, world: int, offload: bool | None = None) -> dict:
    """W ranks against the one process; `offload` (default: on CUDA) sets learner.offload=params."""
    import torch
    import torch.multiprocessing as mp
    from gpu_check_common import device, experience, fmt, free_port, tiny_model

    from relayrl.learner.policy import PolicyLearner

    cuda = device() == "cuda"
    offload = cuda if offload is None else offload
    model_dir = tiny_model(work)
    result_path = Path(work) / f"fsdp_w{world}_{'params' if offload else 'none'}.pt"
    result_path.unlink(missing_ok=True)
    try:
        mp.spawn(
            rank_main, args=(world, free_port(), str(model_dir), offload, str(result_path)), nprocs=world, join=True
        )
    except mp.ProcessRaisedException as err:  # the rank's traceback is in the message; keep its last line short
        print(err, flush=True)
        raise RuntimeError(str(err).strip().splitlines()[-1]) from None
    found = torch.load(result_path, weights_only=False)

    reference = PolicyLearner(learner_settings(fsdp_config(model_dir)))  # the one-process learner, whole batch
    initial = {name: t.detach().to("cpu", copy=True) for name, t in reference.named_weights()}
    stats = reference.update(experience(groups=GROUPS, n=N)).metrics
    expected = {name: t.detach().to("cpu") for name, t in reference.named_weights()}
    weights = found["weights"]
    same_names = set(weights) == set(expected) and all(weights[k].shape == expected[k].shape for k in expected)
    delta = max(float((weights[k] - expected[k]).abs().max()) for k in expected) / LR if same_names else math.inf
    moved = max(float((weights[k] - initial[k]).abs().max()) for k in initial) / LR if same_names else 0.0
    norm_gap = abs(found["grad_norm"] - stats["actor/grad_norm"]) / max(stats["actor/grad_norm"], 1e-12)
    pass_dtype = "bfloat16" if cuda else "float32"
    checks = {
        "full_tensors_named_as_unsharded": same_names,
        "weights_moved": moved >= 0.5,  # an update happened: AdamW's first step moves elements by ~lr
        "weights_match_one_process": delta <= (2.05 if cuda else 0.1),
        "grad_norm_matches": norm_gap <= (5e-2 if cuda else 1e-4),
        "grad_norm_finite": math.isfinite(found["grad_norm"]),
        "clipped": found["grad_norm"] > 0.05,  # the clip acted (train.grad_clip=0.05)
        f"passes_{pass_dtype}_masters_float32": found["passes"] == [pass_dtype] and found["masters"] == ["float32"],
    }
    if offload:
        checks["shards_offloaded_to_cpu"] = found["shards_on"] == ["cpu"]
    backend = "nccl" if cuda else "gloo"
    figure = (
        f"W={world} {backend}, offload={found['offload']} (shards on {'/'.join(found['shards_on'])}): grad norm "
        f"{found['grad_norm']:.4g} (one process {stats['actor/grad_norm']:.4g}), gathered "
        f"{found['gathered_bytes'] / 2**20:.2f} MiB, max abs(w - one process) {fmt(delta)} lr, passes/masters "
        f"{'/'.join(found['passes'])}/{'/'.join(found['masters'])}; DTensor collectives: clip "
        f"{found['comms'][0]}, gathers {found['comms'][1]}"
    )
    if world == 1:  # a one-rank mesh issues none: the NCCL-meets-CPU-shard case needs two ranks (two_gpus)
        figure += " (W=1: none issued)" if found["comms"] == (0, 0) else ""
    details = {k: v for k, v in found.items() if k != "weights"} | {"delta_lr": delta, "norm_gap": norm_gap}
    return {"checks": checks, "figure": figure, "details": details}
