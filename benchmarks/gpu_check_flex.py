"""gpu_check.py's `flex` step: group-packed rows through FlexAttention (model.attention=flex_attention).

relayrl packs a GRPO group into one row, the prompt once and every response after it, with a mask in which a
response sees the prompt and itself but no other response (relayrl/learner/packing.py). SDPA takes that mask dense,
[L, L] per row; FlexAttention takes it as a BlockMask and skips the blocks where one response would see another.
This step proves on a GPU what the CPU cannot (torch has no FlexAttention backward there):

  1. log-probs: flex-packed rows against the padded forward, fp32 (within 1e-3);
  2. gradients: the first step's gradients of flex-packed rows against SDPA-packed rows, fp32 (relative 1e-4);
  3. seconds: one update (bf16 passes) on long rows, 8 groups of 8 responses of up to 1024 tokens on a 4-layer model,
     SDPA's dense mask against flex (each after a warm-up update: flex compiles on its first call).

The figure (3) decides whether `model.attention: auto` should choose flex on GPUs; today auto keeps SDPA.
CPU rehearsal: (1) only, through the same forward with the learner's CPU refusal bypassed, as
tests/unit/test_packing.py does.
"""

from __future__ import annotations

from pathlib import Path

from gpu_check_common import config, device, experience, fmt, grads_of_first_step, shaped_model, timed, tiny_model

from relayrl.placement.sections import learner_settings

LONG_SHAPE = {  # a 4-layer model with 512-wide layers: attention is a fair share of the update
    "vocab": 1024,
    "hidden": 512,
    "layers": 4,
    "heads": 8,
    "kv_heads": 8,
    "intermediate": 1536,
}


def learner(model_dir: Path, *extra: str, flex: bool, groups: int = 4, n: int = 4):
    """A PolicyLearner on `model_dir` with group packing; with `flex`, its packed rows go through FlexAttention
    (on CPU by switching the built learner, since the config refuses it there)."""
    from relayrl.learner.policy import PolicyLearner

    overrides = ["train.micro_batch=8", "train.packing=groups", *extra]
    if flex and device() == "cuda":
        overrides.append("model.attention=flex_attention")
    built = PolicyLearner(learner_settings(config(model_dir, *overrides, groups=groups, n=n)))
    if flex and device() != "cuda":
        built.network.set_attn_implementation("flex_attention")
        built.layout.attention = "flex_attention"
    return built


def long_experience(groups: int = 8, n: int = 8, prompt: int = 128, longest: int = 1024):
    """`groups` prompts of `prompt` tokens, each with `n` responses of longest/n .. longest tokens: packed rows of
    ~4.7k positions, where most of each row's [L, L] mask is one response facing another."""
    import torch

    from relayrl.algorithms.advantages import grpo, make_inputs
    from relayrl.learner.batching import make_experience
    from relayrl.types import Prompt, Rollout, Score

    gen = torch.Generator().manual_seed(0)
    vocab = LONG_SHAPE["vocab"]
    rollouts, scores = [], []
    for g in range(groups):
        shared = Prompt(id=f"p{g}", text="", token_ids=torch.randint(4, vocab, (prompt,), generator=gen).tolist())
        for i in range(n):
            length = longest * (i + 1) // n
            tokens = torch.randint(4, vocab, (length,), generator=gen).tolist()
            rollouts.append(Rollout(shared, i, tokens, "", [-1.0] * length, "stop", [0] * length))
            scores.append(Score(float(i % 2)))
    exp = make_experience(rollouts, scores, pad_id=0)
    exp.advantages, _ = grpo(make_inputs(exp.rewards, exp.loss_mask, exp.group_ids))
    return exp


def update_seconds(work: Path, flex: bool, longest: int = 1024) -> float:
    """One warm update's seconds on long packed rows (the first update warms up: flex compiles on its first call)."""
    long_dir = shaped_model(work, "flex_long", max_positions=2 * longest + 256, **LONG_SHAPE)
    long = long_experience(longest=longest)
    timing = learner(long_dir, f"rollout.max_tokens={longest}", flex=flex, groups=8, n=8)
    timing.update(long)
    return timed(timing.update, long)[1]


def run_flex(work: Path) -> dict:
    from relayrl.learner.policy import PolicyLearner

    cuda = device() == "cuda"
    model_dir = tiny_model(work)
    exp = experience(groups=4, n=4, vocab=16)
    mask = exp.loss_mask.bool()
    padded = PolicyLearner(
        learner_settings(config(model_dir, "train.micro_batch=8", "train.packing=none", "model.dtype=float32"))
    )
    reference = padded.logprobs(exp)[mask]
    flex = learner(model_dir, "model.dtype=float32", flex=True)
    gap = float((flex.logprobs(exp)[mask] - reference).abs().max())
    packed = flex.layout.take_counts()["learner/packed_frac"] == 1
    checks = {"flex_packed_fp32_1e-3": gap <= 1e-3, "flex_packed": packed}
    details: dict = {"gap_fp32": gap}
    figure = f"max abs(flex packed - padded) {fmt(gap)} fp32"
    if not cuda:
        return {
            "checks": checks,
            "figure": figure + "; CPU: forward only (no FlexAttention backward)",
            "details": details,
        }

    sdpa_grads, _ = grads_of_first_step(learner(model_dir, "model.dtype=float32", flex=False), exp)
    flex_grads, _ = grads_of_first_step(learner(model_dir, "model.dtype=float32", flex=True), exp)
    scale = max(float(g.abs().max()) for g in sdpa_grads)
    grad_gap = max(float((a - b).abs().max()) for a, b in zip(sdpa_grads, flex_grads)) / max(scale, 1e-30)
    checks["flex_same_gradients"] = grad_gap <= 1e-4
    seconds = {"sdpa": update_seconds(work, flex=False), "flex": update_seconds(work, flex=True)}
    ratio = seconds["flex"] / seconds["sdpa"]
    figure += (
        f"; first-step grads vs SDPA-packed {fmt(grad_gap)} (relative); update on 8x8 rows of <=1024 tokens: "
        f"SDPA dense mask {seconds['sdpa']:.3f} s, flex {seconds['flex']:.3f} s ({ratio:.2f}x)"
    )
    details.update(grad_relative_gap=grad_gap, update_s=seconds, flex_over_sdpa=ratio)
    return {"checks": checks, "figure": figure, "details": details}
