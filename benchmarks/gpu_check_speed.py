"""gpu_check's `learner_speed` step: the learner's update of a 1.5B-shaped model at ~20k tokens a micro-batch, once
with relayrl's GPU defaults and once with each speed option of issue 45 item 9 switched, one at a time.

Each variant is a fresh learner on the same random Qwen2.5-1.5B-shaped Llama (vocab 32000 from the character
tokenizer instead of 151936) and the same experience; the first update warms up (and compiles), the second is timed.
Reported per variant: the warm update's seconds, its MFU (6 N tokens / seconds / 989 TFLOP/s, recomputation not
counted) and peak device memory; checked: the first update's gradient norm equals the defaults' (bf16 noise on
a GPU, 1e-5 in the rehearsal), so no option changes what is learned. A variant that runs out of memory is reported
as such; only the defaults must fit.

  defaults    padded rows (train.packing=auto pads on a GPU without FlexAttention), the LM head in 1024-position
              chunks, fused AdamW, one host synchronisation a step, activation checkpointing (at this length the
              activations of 28 layers would not fit beside the weights and AdamW state otherwise)
  full_logits train.logits_chunk=0: the model's own [tokens, vocab] logits
  flex        model.attention=flex_attention with train.packing=groups (GPU only: no FlexAttention backward on CPU)
  compile     learner.compile=true (GPU only here: inductor's CPU compile takes minutes on 2 cores)
  no_ac       learner.activation_checkpointing=false (expected to run out of memory on an 80 GB card)

The CPU rehearsal runs the defaults, full_logits and no_ac on a small shape; flex and compile read "needs CUDA".
"""

from __future__ import annotations

import math
from pathlib import Path

from gpu_check_common import SHAPE_REHEARSAL, config, device, experience, shaped_model, timed

from relayrl.placement.sections import learner_settings

SHAPE_1P5B = {"vocab": 32000, "hidden": 1536, "layers": 28, "heads": 12, "kv_heads": 2, "intermediate": 8960}
PEAK_BF16 = 989e12  # FLOP/s, H100/H200 SXM dense bf16
VARIANTS = {
    "defaults": (),
    "full_logits": ("train.logits_chunk=0",),
    "flex": ("model.attention=flex_attention", "train.packing=groups"),
    "compile": ("learner.compile=true",),
    "no_ac": ("learner.activation_checkpointing=false",),
}
GPU_ONLY = ("flex", "compile")


def run_speed(work: Path) -> dict:
    cuda = device() == "cuda"
    shape = SHAPE_1P5B if cuda else SHAPE_REHEARSAL
    groups, n, prompt, response = (8, 4, 256, 768) if cuda else (2, 2, 16, 48)
    if cuda:
        model_dir = shaped_model(work, "shape_1p5b", max_positions=2048, **shape)
    else:  # step_0p5b's rehearsal model, when it ran first
        model_dir = shaped_model(work, "shape_rehearsal", **shape)
    rows = {}
    for name, options in VARIANTS.items():
        if name in GPU_ONLY and not cuda:
            rows[name] = {"status": "needs CUDA"}
            continue
        rows[name] = _variant(model_dir, options, groups, n, prompt, response, shape["vocab"])
    base = rows["defaults"]
    tolerance = 2e-2 if cuda else 1e-5
    checks = {"defaults_fit": base["status"] == "ok"}
    for name, row in rows.items():
        if row["status"] == "ok" and name != "defaults" and base["status"] == "ok":
            checks[f"{name}_same_grad_norm"] = math.isclose(row["grad_norm"], base["grad_norm"], rel_tol=tolerance)
    label = "1.5B shape" if cuda else f"rehearsal shape (hidden {shape['hidden']})"
    parts = [f"{name} {_cell(row, cuda)}" for name, row in rows.items()]
    figure = f"{label}, {base.get('tokens', 0)} tokens a micro-batch: " + "; ".join(parts)
    return {"checks": checks, "figure": figure, "details": {"variants": rows, "shape": shape}}


def _variant(model_dir: Path, options: tuple[str, ...], groups: int, n: int, prompt: int, response: int, vocab: int):
    import torch

    from relayrl.learner.role import LearnerRole

    extra = [
        f"rollout.max_tokens={response}",
        f"train.micro_batch={groups * n}",
        "learner.activation_checkpointing=true",
        *options,
    ]
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        role = LearnerRole(learner_settings(config(model_dir, *extra, groups=groups, n=n)))
        params = sum(p.numel() for p in role.policy.model.parameters())
        metrics, seconds, tokens = [], [], 0
        for step in range(2):
            exp = experience(seed=0, groups=groups, n=n, vocab=vocab, prompt=prompt, response=response)
            tokens = int(exp.attention_mask.sum())
            result, took = timed(_update, role, step, exp)
            metrics.append(result)
            seconds.append(took)
    except torch.OutOfMemoryError:
        return {"status": "out of memory"}
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
    stats = metrics[0]
    return {
        "status": "ok",
        "first_s": seconds[0],
        "warm_s": seconds[1],
        "tokens": tokens,
        "mfu": 6 * params * tokens / seconds[1] / PEAK_BF16,
        "peak_gib": peak,
        "grad_norm": stats["actor/grad_norm"],
    }


def _update(role, step: int, exp) -> dict:
    return role.update(step, role.prepare(exp)).metrics


def _cell(row: dict, cuda: bool) -> str:
    if row["status"] != "ok":
        return row["status"]
    cell = f"{row['warm_s']:.2f} s (first {row['first_s']:.1f} s)"
    return cell + (f", MFU {100 * row['mfu']:.1f}%, peak {row['peak_gib']:.1f} GiB" if cuda else "")
