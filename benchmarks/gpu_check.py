"""The Python half of benchmarks/gpu_check.sh: one subcommand per step, each ending with one JSON line.

    python benchmarks/gpu_check.py <step> --work DIR     # a step; its last stdout line is {"step", "status", ...}
    python benchmarks/gpu_check.py table --out DIR       # the table of $OUT/steps.tsv and $OUT/<step>.log
    python benchmarks/gpu_check.py rehearse --work DIR --out DIR   # the CPU rehearsal: every step, one process

Steps (the shell runs each in its own process with its own timeout; docs in gpu_check.sh's header):
  learner     PolicyLearner on the device: pass/master dtypes, one update, activation checkpointing, packed vs padded
  flex        group-packed rows through FlexAttention: log-probs vs padded, gradients and update seconds vs SDPA
  fsdp        one FSDP2 rank (learner.offload=params on CUDA): update with clipping, named_weights' full tensors
  hf_engine   HFEngine generates; its behaviour log-probs vs the learner's on the same tokens (mismatch/*)
  cuda_ipc    weights handed between two processes by CUDA IPC handle, against a copy in one process
  colocated   free memory per phase of a colocated step whose learner states leave the device while it generates
  colocated_memory  a colocated learner's peak device memory per phase, measured, beside relayrl plan's and the
              fake-tensor simulation's figures (gpu_check_memory.py)
  step_0p5b   one RL step of a random 0.5B-shaped model: generate / update / sync seconds, the update's bf16 MFU
  learner_speed  a 1.5B shape's update with relayrl's GPU defaults, then each speed option one at a time: warm
              seconds, MFU, peak memory, the same gradient norm (gpu_check_speed.py)
  vllm, ray, two_gpus   skipped by name unless this machine has what they need (vllm: generate, mismatch, a push
              through the weight-update session, and with a second GPU a broadcast into the engine's worker;
              GPU_CHECK_FORCE=vllm runs it on vLLM's CPU build)

Each step's checks are named booleans; a step is `ok` when all hold, else `failed: <names>`. A step that needs
what the machine lacks raises `Missing` and reads `skipped: needs <what>`. On a machine without CUDA
(GPU_CHECK_REHEARSE=1) every CUDA part has its CPU stand-in, said in the step's figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

from relayrl.placement.sections import learner_settings

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the gpu_check_* helpers beside this file

from gpu_check_common import (  # noqa: E402
    REHEARSE,
    SHAPE_REHEARSAL,
    Missing,
    config,
    device,
    experience,
    fmt,
    grads_of_first_step,
    prompts,
    rollouts_experience,
    set_threads,
    shaped_model,
    timed,
    tiny_model,
)

STEPS = (
    "learner",
    "flex",
    "fsdp",
    "hf_engine",
    "cuda_ipc",
    "colocated",
    "colocated_memory",
    "step_0p5b",
    "vllm",
    "ray",
    "two_gpus",
    "learner_speed",
)
H200_BF16_PEAK = 989e12  # FLOP/s, dense bf16 (no sparsity): NVIDIA's H200 SXM figure, as the H100 SXM's
FORCE = set(filter(None, os.environ.get("GPU_CHECK_FORCE", "").split(",")))  # run a present-only row on CPU stand-ins


def decoder_layer0_linear(model):
    """The first decoder layer's MLP down projection: where the pass dtype is read."""
    return next(m for name, m in model.named_modules() if name.endswith("layers.0.mlp.down_proj"))


def mlp_calls(network) -> list[int]:
    """A counter of the first decoder layer's MLP forwards (a pre-hook: the recompute stops once its tensors are back)."""
    calls = [0]
    mlp = next(m for name, m in network.named_modules() if name.endswith("layers.0.mlp"))
    mlp.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


# ---------------------------------------------------------------------------------------------------- learner
def step_learner(work: Path) -> dict:
    """PolicyLearner on the device: bf16 passes over fp32 master weights (CPU: fp32 throughout); one update's loss
    and grad norm finite; activation checkpointing's first-step gradients equal the plain ones; packed and padded
    log-probs agree (fp32 within 1e-3; bf16 within the larger of 1e-3 and twice bf16's own gap to fp32)."""
    from relayrl.learner.policy import PolicyLearner

    dev, cuda = device(), device() == "cuda"
    model_dir = tiny_model(work)
    exp = experience(groups=4, n=4, vocab=16)
    mask = exp.loss_mask.bool()

    def learner(*extra):
        return PolicyLearner(learner_settings(config(model_dir, "train.micro_batch=8", *extra)))

    # bf16 passes over fp32 masters, one update, its seconds (the second update, warm)
    plain = learner("train.packing=none")
    passes: set[str] = set()
    decoder_layer0_linear(plain.network).register_forward_hook(lambda m, i, o: passes.add(str(o.dtype)[6:]))
    calls_plain = mlp_calls(plain.network)
    grads_plain, stats = grads_of_first_step(plain, exp)
    calls_plain = calls_plain[0]
    _, step_s = timed(plain.update, exp)
    masters = {str(p.dtype)[6:] for p in plain.model.parameters()}
    on = {p.device.type for p in plain.model.parameters()}
    expected_pass = "bfloat16" if cuda else "float32"

    # activation checkpointing: the same first-step gradients
    checked = learner("train.packing=none", "learner.activation_checkpointing=true")
    calls_checked = mlp_calls(checked.network)
    grads_checked, stats_checked = grads_of_first_step(checked, exp)
    recomputed = calls_checked[0] - calls_plain  # one more MLP forward per micro-batch: the backward's recompute
    scale = max(float(g.abs().max()) for g in grads_plain)
    ac_gap = max(float((a - b).abs().max()) for a, b in zip(grads_plain, grads_checked)) / max(scale, 1e-30)
    ac_tolerance = 1e-2 if cuda else 1e-5  # relative to the largest gradient; bf16 recompute may reorder atomics

    # packed vs padded log-probs, fp32 and (CUDA) bf16; on a GPU packed rows attend through FlexAttention (a dense
    # [L, L] mask there is refused: relayrl/learner/layout.py)
    def logprobs(packing, *extra):
        flex = ("model.attention=flex_attention",) if cuda and packing == "groups" else ()
        return learner(f"train.packing={packing}", *flex, *extra).logprobs(exp)[mask]

    fp32 = {p: logprobs(p, "model.dtype=float32") for p in ("none", "groups")}
    gap_fp32 = float((fp32["groups"] - fp32["none"]).abs().max())
    checks = {
        "masters_fp32": masters == {"float32"},
        "on_device": on == {dev},
        f"passes_{expected_pass}": passes == {expected_pass},
        "loss_finite": math.isfinite(stats["loss/policy"]) and math.isfinite(stats["actor/grad_norm"]),
        "ac_recomputes": recomputed == stats_checked["learner/micro_batches"] > 0,
        "ac_same_gradients": ac_gap <= ac_tolerance,
        "ac_same_loss": abs(stats_checked["loss/policy"] - stats["loss/policy"]) <= (1e-3 if cuda else 1e-5),
        "packed_fp32_1e-3": gap_fp32 <= 1e-3,
    }
    figure = f"max abs(packed - padded) {fmt(gap_fp32)} fp32"
    details = {"gap_fp32": gap_fp32}
    if cuda:
        bf16 = {p: logprobs(p, "model.dtype=bfloat16") for p in ("none", "groups")}
        gap_bf16 = float((bf16["groups"] - bf16["none"]).abs().max())
        noise = float((bf16["none"] - fp32["none"]).abs().max())  # bf16's own error on these tokens
        checks["packed_bf16"] = gap_bf16 <= max(1e-3, 2 * noise)
        figure += f", {fmt(gap_bf16)} bf16 (bf16 vs fp32 {fmt(noise)})"
        details.update(gap_bf16=gap_bf16, bf16_noise=noise)
    figure += f"; step {step_s:.3f} s; AC recomputes x{recomputed}, grad gap {fmt(ac_gap)}; passes/masters {'/'.join(passes)}/{'/'.join(masters)}"
    details.update(step_s=step_s, ac_relative_gap=ac_gap, loss=stats["loss/policy"], grad_norm=stats["actor/grad_norm"])
    return {"checks": checks, "figure": figure, "details": details}


# ---------------------------------------------------------------------------------------------------- hf_engine
def step_hf_engine(work: Path) -> dict:
    """HFEngine on the device samples 8 prompts x 4; the learner's log-probs of those tokens against the engine's
    behaviour log-probs, through relayrl's own mismatch functions (what a run logs as mismatch/*). HFEngine loads
    float32 weights, so on CUDA the gap is the bf16 learner's; the fp32 learner's gap is the exactness check."""
    import torch

    from relayrl.learner.policy import PolicyLearner, mismatch_by_version, mismatch_metrics
    from relayrl.rollout.hf_engine import HFEngine
    from relayrl.types import Sampling

    cuda = device() == "cuda"
    model_dir = tiny_model(work)
    engine = HFEngine(str(model_dir))
    batch = prompts(8, 6, vocab=len(engine.tokenizer))
    sampling = Sampling(n=4, temperature=1.0, max_tokens=24, seed=0)
    rollouts, gen_s = timed(engine.generate, batch, sampling, 0)
    exp = rollouts_experience(rollouts, engine.pad_id)
    tokens = int(exp.loss_mask.sum())
    gaps = {}
    for dtype in ("bfloat16", "float32") if cuda else ("float32",):
        learner = PolicyLearner(learner_settings(config(model_dir, f"model.dtype={dtype}", groups=8, n=4)))
        logp = learner.logprobs(exp)
        found = mismatch_metrics(mismatch_by_version(logp, exp.behaviour_logprobs, exp.loss_mask, exp.versions), 0)
        gaps[dtype] = (found["mismatch/logprob_abs_max"], found["mismatch/logprob_abs_mean"])
    device_ok = engine.model.device.type == device() and all(
        torch.isfinite(torch.tensor(r.behaviour_logprobs)).all() for r in rollouts
    )
    checks = {"engine_on_device": device_ok, "fp32_gap_1e-3": gaps["float32"][0] <= 1e-3}
    figure = f"max abs(engine - learner) {fmt(gaps['float32'][0])} fp32 learner"
    notes = []
    if cuda:
        (bf16_max, bf16_mean), fp32_max = gaps["bfloat16"], gaps["float32"][0]
        figure = f"max abs(engine - learner) {fmt(bf16_max)} bf16 learner (mean {fmt(bf16_mean)}), {fmt(fp32_max)} fp32"
        if gaps["bfloat16"][0] >= 1e-2:
            notes.append("bf16 gap over the 1e-2 expected")
    figure += f"; {tokens} tokens, {tokens / gen_s:.0f} tok/s"
    return {
        "checks": checks,
        "figure": figure + ("; " + "; ".join(notes) if notes else ""),
        "details": {"gaps": gaps, "generate_s": gen_s, "tokens": tokens},
    }


# ---------------------------------------------------------------------------------------------------- step_0p5b
SHAPE_0P5B = {"vocab": 32000, "hidden": 896, "layers": 24, "heads": 14, "kv_heads": 2, "intermediate": 4864}


def step_0p5b(work: Path) -> dict:
    """One RL step (two; the second is reported, warm) of a random Qwen2.5-0.5B-shaped Llama (vocab 32000 from the
    local character tokenizer instead of 151936: ~0.39B parameters): HFEngine generates 16 prompts x 4 samples x
    64 tokens (exactly: min_tokens = max_tokens), the learner updates on them, InProcessSync pushes the weights.
    MFU = 6 N tokens / update seconds / 989 TFLOP/s (H200 dense bf16); N = every parameter once (the tied
    embedding as the LM head), tokens = prompt + response positions trained (attention is left out of 6N)."""
    import torch

    from relayrl.learner.role import LearnerRole
    from relayrl.rollout.hf_engine import HFEngine
    from relayrl.rollout.local_group import LocalEngineGroup
    from relayrl.sync.inprocess import InProcessSync
    from relayrl.types import Sampling

    cuda = device() == "cuda"
    shape, (groups, n, length, prompt) = (SHAPE_0P5B, (16, 4, 64, 32)) if cuda else (SHAPE_REHEARSAL, (8, 4, 16, 16))
    model_dir, build_s = timed(shaped_model, work, "shape_0p5b" if cuda else "shape_rehearsal", **shape)
    extra = [f"rollout.max_tokens={length}", f"train.micro_batch={groups * n if cuda else 16}"]
    role = LearnerRole(learner_settings(config(model_dir, *extra, groups=groups, n=n)))
    engine = HFEngine(str(model_dir))
    group, sync = LocalEngineGroup(engine), InProcessSync()
    params = sum(p.numel() for p in role.policy.model.parameters())
    sampling = Sampling(n=n, temperature=1.0, max_tokens=length, min_tokens=length, seed=0)
    rows = []
    for step in range(2):
        batch = prompts(groups, prompt, shape["vocab"], seed=step)
        rollouts, gen_s = timed(group.generate, batch, sampling, step)
        exp = rollouts_experience(rollouts, engine.pad_id)
        stats, update_s = timed(lambda exp=exp, step=step: role.update(step, role.prepare(exp)).metrics)
        _, sync_s = timed(sync.push, role, group)
        rows.append(
            {
                "generate_s": gen_s,
                "update_s": update_s,
                "sync_s": sync_s,
                "tokens": int(exp.attention_mask.sum()),
                "generated": sum(len(r.response_ids) for r in rollouts),
                "loss": stats["loss/policy"],
                "sync_GBps": sync.last["sync/GBps"],
            }
        )
    warm = rows[-1]
    flops = 6 * params * warm["tokens"]
    mfu = flops / warm["update_s"] / H200_BF16_PEAK
    label = "0.5B shape" if cuda else f"rehearsal shape (hidden {shape['hidden']}, {shape['layers']} layers)"
    figure = (
        f"{label}, {params / 1e6:.0f}M params, vocab {shape['vocab']}: generate {warm['generate_s']:.2f} s "
        f"({warm['generated'] / warm['generate_s']:.0f} tok/s), update {warm['update_s']:.2f} s, sync "
        f"{warm['sync_s']:.3f} s"
    )
    figure += f", MFU {100 * mfu:.1f}% of 989 TFLOP/s" if cuda else ", MFU n/a on CPU"
    engine_params = dict(engine.model.named_parameters())
    with torch.no_grad():
        synced = max(float((engine_params[k] - w).abs().max()) for k, w in role.named_weights())
    checks = {
        "lengths_exact": warm["generated"] == groups * n * length,
        "loss_finite": all(math.isfinite(r["loss"]) for r in rows),
        "engine_has_weights": synced == 0.0,
        "on_device": engine.model.device.type == device() and role.policy.device == device(),
    }
    return {
        "checks": checks,
        "figure": figure,
        "details": {"steps": rows, "params": params, "shape": shape, "mfu": mfu, "build_s": build_s},
    }


# ---------------------------------------------------------------------------------------------------- present-only rows
def step_vllm(work: Path) -> dict:
    """Generation through vLLM's CUDA build, when installed: relayrl's vLLM engine (engine_from_settings) samples
    from the tiny model; its behaviour log-probs against the learner's (mismatch/*)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise Missing("vLLM (not installed)")
    from vllm.platforms import current_platform

    platform = current_platform.device_type
    if platform != "cuda" and "vllm" not in FORCE:
        raise Missing(f"vLLM's CUDA build (installed: platform {platform})")
    from relayrl.learner.policy import PolicyLearner, mismatch_by_version, mismatch_metrics
    from relayrl.placement.sections import engine_settings
    from relayrl.rollout.build import engine_from_settings
    from relayrl.types import Sampling

    model_dir = tiny_model(work)
    cfg = config(model_dir, "rollout.engine=vllm", "rollout.kv_cache_gib=1", groups=8)
    engine = engine_from_settings(engine_settings(cfg), max_model_len=64)
    rollouts, gen_s = timed(engine.generate, prompts(8, 6, 16), Sampling(n=4, max_tokens=24, seed=0), 0)
    exp = rollouts_experience(rollouts, 0)
    logp = PolicyLearner(learner_settings(cfg)).logprobs(
        exp
    )  # bf16 autocast on CUDA, as vLLM serves bf16 there; fp32 on CPU
    found = mismatch_metrics(mismatch_by_version(logp, exp.behaviour_logprobs, exp.loss_mask, exp.versions), 0)
    gap = found["mismatch/logprob_abs_max"]
    # bf16 on both sides: only gross errors are caught (relayrl/learner/layout.py's half-precision tolerance)
    tolerance = 0.25 if platform == "cuda" else 1e-3
    note = "; over the 1e-2 expected" if platform == "cuda" and gap >= 1e-2 else ""
    # a push of the same weights through vLLM's weight-update session (relayrl/rollout/vllm_transfer.py): the engine
    # then samples what it sampled before
    from transformers import AutoModelForCausalLM

    named = [
        (n, p.detach()) for n, p in AutoModelForCausalLM.from_pretrained(model_dir).to(platform).named_parameters()
    ]
    _, push_s = timed(engine.load_weights, iter(named), 1)
    again, _ = timed(engine.generate, prompts(8, 6, 16), Sampling(n=4, max_tokens=24, seed=0), 1)
    same = [r.response_ids for r in again] == [r.response_ids for r in rollouts]
    checks = {f"gap_{tolerance:g}": gap <= tolerance, "push_same_samples": same}
    landed, said = broadcast_into_workers(engine, named, platform)
    if landed is not None:  # the same weights again, by broadcast: the samples stay the same
        again, _ = timed(engine.generate, prompts(8, 6, 16), Sampling(n=4, max_tokens=24, seed=0), 2)
        checks["broadcast_same_samples"] = landed and [r.response_ids for r in again] == [
            r.response_ids for r in rollouts
        ]
    return {
        "checks": checks,
        "figure": f"vLLM ({platform}) max abs(engine - learner) {fmt(gap)}; generate {gen_s:.2f} s; "
        f"push through the weight-update session {push_s:.2f} s; {said}{note}",
        "details": found,
    }


def broadcast_into_workers(engine, named: list, platform: str) -> tuple[bool | None, str]:
    """`sync.transport=broadcast` into vLLM (relayrl/rollout/vllm_transfer.py): the engine's worker joins the
    weight-sync group and receives a push from the learner (a thread here, rank 0) itself. NCCL takes one rank
    per GPU, so on CUDA the learner's rank needs a second GPU (cuda:1); gloo on CPU. (None, why) when it cannot run."""
    import torch

    if platform == "cuda" and torch.cuda.device_count() < 2:
        return None, "broadcast into the workers: not run (the learner's NCCL rank needs a second GPU)"
    from concurrent.futures import ThreadPoolExecutor

    from relayrl.sync.buckets import layout_of
    from relayrl.sync.group import join_group
    from relayrl.sync.remote import free_port
    from relayrl.sync.transports import WorkerMembership, make_sender

    def learner_joins(port: int):
        if platform == "cuda":
            torch.cuda.set_device(1)  # this thread's device: the sends below run in it too
        return join_group("127.0.0.1", port, 0, 2, 120.0)

    layout = layout_of(named, 1.0, "bf16" if platform == "cuda" else "fp32")
    with ThreadPoolExecutor(1) as pool:
        port = free_port()
        joined = pool.submit(learner_joins, port)
        engine.join_weight_group(WorkerMembership("127.0.0.1", port, 1, 2, 120.0))
        group = joined.result(120)
        engine.open_weight_receivers(layout, True)
        sender = make_sender("broadcast", layout, True, group, 120.0)
        tensors = [(n, t.to(group.device)) for n, t in named]
        start = time.perf_counter()
        sent = pool.submit(sender.send, iter(tensors), 2)
        engine.receive_broadcast(2)
        sent.result(120)
        seconds = time.perf_counter() - start
    return engine.version == 2, f"broadcast into the workers ({group.backend}) {seconds:.2f} s"


def step_ray(work: Path) -> dict:
    """Placement on Ray with real GPUs, when Ray is installed and CUDA is present: an actor asking for one GPU is
    given one (ray.get_gpu_ids, CUDA_VISIBLE_DEVICES) and computes on it."""
    import importlib.util

    import torch

    if importlib.util.find_spec("ray") is None:
        raise Missing("Ray (not installed)")
    gpus = torch.cuda.device_count()
    if not gpus and "ray" not in FORCE:
        raise Missing("Ray with real GPUs (Ray is installed; no CUDA device)")
    import ray

    ray.init(num_cpus=2, num_gpus=max(gpus, 1), include_dashboard=False, log_to_driver=False)
    try:

        @ray.remote(num_gpus=1, num_cpus=0)
        def probe():
            import torch

            dev = "cuda" if torch.cuda.is_available() else "cpu"
            x = torch.ones(256, 256, device=dev)
            return ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count(), float(x.sum())

        ids, visible, count, total = ray.get(probe.remote(), timeout=120)
    finally:
        ray.shutdown()
    checks = {"one_gpu_assigned": len(ids) == 1, "computes": total == 256 * 256}
    if gpus:
        checks["actor_sees_one_device"] = count == 1
    return {"checks": checks, "figure": f"actor GPU ids {ids}, CUDA_VISIBLE_DEVICES={visible}, sees {count} device(s)"}


def step_two_gpus(work: Path) -> dict:
    """Two NCCL ranks, when there are two GPUs: W=2 FSDP2 against the one-process learner (gpu_check_fsdp.py),
    with offload=none, then with learner.offload=params (the CPU-shard collectives a W=1 mesh never issues)."""
    import torch

    count = torch.cuda.device_count()
    if count < 2 and "two_gpus" not in FORCE:
        raise Missing(f"a second GPU (two NCCL ranks, W=2 FSDP2 equivalence; this machine has {count})")
    from gpu_check_fsdp import run_fsdp

    cases = {"none": run_fsdp(work, world=2, offload=False)}
    if torch.cuda.is_available():  # the case verl works around: clip and gathers over CPU-offloaded shards on NCCL
        try:
            cases["params"] = run_fsdp(work, world=2, offload=True)
        except Exception as err:  # noqa: BLE001  (the W=2 equivalence above stays reported)
            message = " ".join(str(err).split())[:300]
            cases["params"] = {"checks": {"offload_params_runs": False}, "figure": f"offload=params: {message}"}
    return {
        "checks": {f"{case}:{name}": held for case, found in cases.items() for name, held in found["checks"].items()},
        "figure": " -- ".join(found["figure"] for found in cases.values()),
        "details": {case: found.get("details", {}) for case, found in cases.items()},
    }


def step_fsdp(work: Path) -> dict:
    from gpu_check_fsdp import run_fsdp

    return run_fsdp(work, world=1)


def step_flex(work: Path) -> dict:
    from gpu_check_flex import run_flex

    return run_flex(work)


def step_cuda_ipc(work: Path) -> dict:
    from gpu_check_ipc import run_ipc

    return run_ipc()


def step_learner_speed(work: Path) -> dict:
    from gpu_check_speed import run_speed

    return run_speed(work)


def step_colocated(work: Path) -> dict:
    from gpu_check_colocated import run_colocated

    return run_colocated(work)


def step_colocated_memory(work: Path) -> dict:
    from gpu_check_memory import run_colocated_memory

    return run_colocated_memory(work)


RUNNERS = {
    "learner": step_learner,
    "flex": step_flex,
    "fsdp": step_fsdp,
    "hf_engine": step_hf_engine,
    "cuda_ipc": step_cuda_ipc,
    "colocated": step_colocated,
    "colocated_memory": step_colocated_memory,
    "step_0p5b": step_0p5b,
    "vllm": step_vllm,
    "ray": step_ray,
    "two_gpus": step_two_gpus,
    "learner_speed": step_learner_speed,
}
NEEDS_RELAYRL = {
    "learner",
    "flex",
    "fsdp",
    "hf_engine",
    "colocated",
    "colocated_memory",
    "step_0p5b",
    "vllm",
    "two_gpus",
}


def run_step(name: str, work: Path) -> int:
    """Run one step; print its traceback (if any) and then its one JSON line; exit 0 unless it failed."""
    start = time.perf_counter()
    result: dict = {}
    try:
        import torch

        if not torch.cuda.is_available() and not REHEARSE:
            raise Missing("a CUDA device (none here; GPU_CHECK_REHEARSE=1 runs the CPU stand-ins)")
        set_threads()
        if name in NEEDS_RELAYRL:
            try:
                import pydantic  # noqa: F401  (relayrl.config is pydantic)
            except ImportError:
                raise Missing(
                    "pydantic (relayrl.config): run `bash benchmarks/gpu_wheels.sh` where there is a package "
                    "index and carry runs/gpu_wheels"
                ) from None
        work.mkdir(parents=True, exist_ok=True)
        result = RUNNERS[name](work)
        failed = [check for check, held in result["checks"].items() if not held]
        status = "ok" if not failed else "failed: " + ", ".join(failed)
    except Missing as missing:
        status = f"skipped: needs {missing}"
    except Exception as err:  # noqa: BLE001  (any error is this step's result; the traceback goes to its log)
        traceback.print_exc()
        status = f"failed: {type(err).__name__}: {' '.join(str(err).split())[:200]}"
    line = {
        "step": name,
        "status": status,
        "seconds": round(time.perf_counter() - start, 1),
        "figure": result.get("figure", ""),
        "checks": result.get("checks", {}),
        "details": result.get("details", {}),
    }
    print(json.dumps(line, default=str), flush=True)
    return 1 if status.startswith("failed") else 0


# ---------------------------------------------------------------------------------------------------- the table
def last_json(log: Path) -> dict | None:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except ValueError:
                continue
            if isinstance(found, dict) and "step" in found:
                return found
    return None


def last_error(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines or ["empty log"])[-1][:160]


def table(out: Path) -> int:
    """Print the table from $OUT/steps.tsv (step, exit code, seconds; written by the shell); 1 if a step failed."""
    rows, failed = [], False
    tsv = out / "steps.tsv"
    entries = [line.split("\t") for line in tsv.read_text().splitlines() if line] if tsv.is_file() else []
    for step, rc, seconds, *note in entries:
        found = last_json(out / f"{step}.log")
        if note and note[0]:  # the shell's own status (out of time, pydantic missing before the step ran)
            status, figure = note[0], ""
        elif rc in ("124", "137"):
            status, figure = f"timeout after {seconds} s", last_error(out / f"{step}.log")
        elif found is None:
            status, figure = f"failed rc={rc}", last_error(out / f"{step}.log")
        else:
            status, figure = found["status"], found["figure"]
        # a step that could not run for want of time or of pydantic (nothing of relayrl ran) fails the check too
        failed |= status.startswith(("failed", "timeout")) or "needs pydantic" in status or "out of time" in status
        cells = [step, status, seconds, figure]
        rows.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    print("| step | status | seconds | key figure |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    return 1 if failed else 0


def rehearse(work: Path, out: Path) -> int:
    """The CPU rehearsal's steps one after another in this one process (GPU_CHECK_STEPS picks them, as for the
    shell): each step's output to $OUT/<step>.log and its row to $OUT/steps.tsv, as the shell writes them. Its
    own process per step costs the rehearsal ~5 s of imports a step on two cores, and on a CPU there is no device
    state for a process to isolate; on a GPU the shell gives every step its own process and timeout."""
    chosen = set(filter(None, os.environ.get("GPU_CHECK_STEPS", "").split(",")))
    failed = 0
    for name in (step for step in STEPS if not chosen or step in chosen):
        start = time.perf_counter()
        with open(out / f"{name}.log", "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            rc = run_step(name, work)
        with open(out / "steps.tsv", "a") as rows:
            rows.write(f"{name}\t{rc}\t{round(time.perf_counter() - start)}\t\n")
        print(f"  {name}: exit {rc}, {time.perf_counter() - start:.0f} s (in the rehearsal's one process)", flush=True)
        failed |= rc
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=(*STEPS, "table", "rehearse"))
    parser.add_argument("--work", type=Path, default=Path("runs/gpu_check_work"), help="models are built here")
    parser.add_argument("--out", type=Path, default=Path("runs/gpu_check"), help="table: where the logs are")
    args = parser.parse_args()
    if args.step == "table":
        return table(args.out)
    if args.step == "rehearse":
        return rehearse(args.work, args.out)
    return run_step(args.step, args.work)


if __name__ == "__main__":
    sys.exit(main())
