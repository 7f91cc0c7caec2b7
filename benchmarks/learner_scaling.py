"""W=1 vs W=2 learner ranks on the same work (issue 15): per-rank state bytes, step time, sync time.

The same rollout batch (8 groups of 4 responses, 48 response tokens each, GRPO) trains a tiny random Llama
(hidden 256, 4 layers: ~4.2M parameters) once as today's single learner (`LearnerRole`, W=1) and once as two
FSDP2 ranks (`sharded_learner` on gloo, W=2), each case in fresh spawned processes with one torch thread per
rank. Measured on every rank:
  - state: the bytes this rank holds of the trainable state: parameters + gradients (at the optimizer step)
    + AdamW's two moments (local shards under FSDP2); the planner's figure beside it is 16 B/param (fp32
    weight, grad, m, v: relayrl/planner/estimate.py's CPU precision) divided by W;
  - step: seconds of one `prepare` + `update` on the rank's share, best of 3 after a warm-up;
  - sync: seconds of one push of every weight through `shm` (W=1: the parameters live in the segments, a push
    only checksums; W=2: every bucket gathered from the shards and packed), best of 3; and the most bytes
    rank 0 held for it beyond the model (gathered tensors, bucket buffer), against 2 buckets;
  - pass/master dtype: the first decoder layer's weights while it runs / the parameters the optimizer steps
    (on CUDA an FSDP2 rank must show bfloat16/float32, MixedPrecisionPolicy, or the run fails: gpu_check.sh).
`--worlds 1 --sharded` runs one FSDP2 rank (a one-device GPU check of the sharded path).

`--startup`: instead, the peak resident memory (ru_maxrss) of each rank while it builds a GAE learner with a KL
reference (policy, reference and critic) of a larger random Llama (--hidden 768, --layers 6: ~57M parameters,
~230 MB per fp32 copy, saved in bf16 as published checkpoints are), beside the resident set after its imports: W=1, and W=2 where only rank 0
reads the weights (the others build on the meta device and receive their shards).

Simplifications, stated: 2 shared cores (the load average is printed), so W=2's step is two ranks on two
cores against one rank on one; no engine receives the push (the sender's side only).

Run: .venv/bin/python benchmarks/learner_scaling.py [--out runs/learner_scaling] [--bucket-mb 1] [--startup]
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from relayrl.placement.sections import learner_settings

GROUPS, N, RESPONSE, PROMPT = 8, 4, 48, 12


def build_model(out: Path, hidden: int = 256, layers: int = 4) -> Path:
    from relayrl.models.tiny import build_tiny

    if not (out / "config.json").is_file():
        texts = [f"{a}+{b}={a + b}" for a in range(10) for b in range(10)] + [" "]
        build_tiny(texts, out, seed=0, hidden=hidden, layers=layers, heads=4, intermediate=4 * hidden)
    return out


def rollout_batch():
    from relayrl.algorithms.advantages import grpo, make_inputs
    from relayrl.learner.batching import make_experience
    from relayrl.types import Prompt, Rollout, Score

    gen = torch.Generator().manual_seed(0)
    rollouts, scores = [], []
    for g in range(GROUPS):
        prompt = Prompt(id=f"p{g}", text="", token_ids=torch.randint(4, 15, (PROMPT,), generator=gen).tolist())
        for i in range(N):
            response = torch.randint(4, 15, (RESPONSE,), generator=gen).tolist()
            rollouts.append(Rollout(prompt, i, response, "", [-2.0] * RESPONSE, "stop", [0] * RESPONSE))
            scores.append(Score(float((g + i) % 2)))
    exp = make_experience(rollouts, scores, pad_id=0)
    exp.advantages, _ = grpo(make_inputs(exp.rewards, exp.loss_mask, exp.group_ids))
    return exp


def local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def best_of(fn, times: int = 3) -> float:
    fn()  # warm-up
    seconds = []
    for _ in range(times):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return min(seconds)


def rank_main(rank, world, port, model_dir, bucket_mb, sharded, results):
    from relayrl.build import resolve
    from relayrl.config import load_config
    from relayrl.learner.process_group import split_by_groups

    torch.set_num_threads(1)
    overrides = [f"model.path={model_dir}", f"rollout.n={N}", f"rollout.prompts_per_step={GROUPS}"]
    config = resolve(load_config(None, overrides + ["train.micro_batch=8", f"rollout.max_tokens={RESPONSE}"]))
    from relayrl.learner.sharded import ShardedRanks, sharded_learner, transformer_blocks

    if world == 1 and not sharded:
        from relayrl.learner.role import LearnerRole

        learner = LearnerRole(learner_settings(config), threads=1)
    else:
        learner = sharded_learner(learner_settings(config), rank, world, "127.0.0.1", port, timeout_s=300, threads=1)
    part = split_by_groups(rollout_batch(), world)[rank]
    passes = set()  # the dtype of the first layer's weights while it runs (FSDP2 gathers them in param_dtype)
    layer = transformer_blocks(learner.policy.model)[0]
    layer.register_forward_pre_hook(lambda module, _: passes.add(str(next(module.parameters()).dtype)[6:]))
    grads = []
    learner.policy.optimizer.register_step_pre_hook(
        lambda *_: grads.append(sum(local_bytes(p.grad) for p in learner.policy.model.parameters()))
    )
    step_s = best_of(lambda: learner.update(1, learner.prepare(part)))
    model = learner.policy.model
    params = sum(local_bytes(p) for p in model.parameters())
    moments = sum(local_bytes(t) for s in learner.policy.optimizer.state.values() for t in s.values() if t.dim())
    layout = learner.weight_layout(bucket_mb, "fp32")
    learner.open_sender("shm", layout, True, 300.0, "", None)
    sync_s = best_of(lambda: learner.send_weights(1))
    held = getattr(learner.sender, "held", None)
    masters = {str(p.dtype)[6:] for p in model.parameters()}
    precision = f"{'+'.join(sorted(passes))}/{'+'.join(sorted(masters))}"
    if isinstance(learner.distribution, ShardedRanks) and torch.cuda.is_available() and precision != "bfloat16/float32":
        raise SystemExit(f"FSDP2 on CUDA should pass bfloat16 over float32 master shards, found {precision}")
    if rank == 0:
        results.put(
            {
                "world": world,
                "params": sum(p.numel() for p in model.parameters()),
                "state": params + grads[-1] + moments,
                "step_s": step_s,
                "sync_s": sync_s,
                "held": held.peak if held else 0,
                "bucket": max(layout.bucket_sizes) * 4,
                "precision": precision,
                "sharded": isinstance(learner.distribution, ShardedRanks),
            }
        )
    learner.close()


def peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def rss_mb() -> float:
    """The resident set now (VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def touch(models) -> None:
    """Read every byte of every parameter this rank holds: weights loaded from a memory-mapped file count in
    the resident set only once read, as they are by the first forward."""
    for model in models:
        for p in model.parameters():
            float((p.to_local() if hasattr(p, "to_local") else p).detach().sum())


def startup_main(rank, world, port, model_dir, results):
    """Build the learner (policy, reference, critic) and report this rank's peak RSS before and after."""
    import transformers.models.llama.modeling_llama  # noqa: F401  (imports count in the baseline)

    from relayrl.build import resolve
    from relayrl.config import load_config
    from relayrl.learner.process_group import leave_learner_group
    from relayrl.learner.role import LearnerRole
    from relayrl.learner.sharded import sharded_learner

    torch.set_num_threads(1)
    overrides = [f"model.path={model_dir}", "rollout.n=4", "rollout.prompts_per_step=4"]
    config = resolve(load_config(None, overrides + ["algorithm.advantage=gae", "algorithm.kl.coef=0.1"]))
    base = rss_mb()
    if world == 1:
        learner = LearnerRole(learner_settings(config), threads=1)
    else:
        learner = sharded_learner(learner_settings(config), rank, world, "127.0.0.1", port, timeout_s=300, threads=1)
    touch((learner.policy.model, learner.policy.reference, learner.critic.model))
    results.put({"world": world, "rank": rank, "base": base, "rss": rss_mb(), "peak": peak_rss_mb()})
    learner.close()
    leave_learner_group()


def run_case(world: int, model_dir: Path, bucket_mb: float, target=rank_main, sharded: bool = False) -> list[dict]:
    """Every rank's result (rank_main: rank 0's alone)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    extra = (bucket_mb, sharded) if target is rank_main else ()
    procs = [ctx.Process(target=target, args=(r, world, port, str(model_dir), *extra, results)) for r in range(world)]
    for p in procs:
        p.start()
    found = [results.get(timeout=900) for _ in range(1 if target is rank_main else world)]
    for p in procs:
        p.join(timeout=120)
    return found


def bf16_checkpoint(model_dir: Path) -> Path:
    """The model saved in bf16, as published checkpoints are: loading it into fp32 allocates every weight (an
    fp32 file would be memory-mapped and read lazily, which hides part of a full load)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = model_dir.with_name(model_dir.name + "_bf16")
    if not (out / "config.json").is_file():
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).save_pretrained(out)
        AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out


def startup_table(out: Path, hidden: int, layers: int) -> None:
    model_dir = bf16_checkpoint(build_model(out / f"model_{hidden}x{layers}", hidden, layers))
    from safetensors.torch import load_file

    rows = [row for world in (1, 2) for row in run_case(world, model_dir, 0, startup_main)]
    params = sum(t.numel() for t in load_file(model_dir / "model.safetensors").values())
    print(
        f"peak RSS while building policy + reference + critic ({params / 1e6:.1f}M params, "
        f"{params * 4 / 2**20:.0f} MiB per fp32 copy, bf16 on disk); load average {os.getloadavg()[0]:.1f}"
    )
    print("| W | rank | RSS after imports MiB | RSS after build MiB | peak RSS MiB | peak - imports MiB |")
    print("|---|---|---|---|---|---|")
    for row in sorted(rows, key=lambda r: (r["world"], r["rank"])):
        added = row["peak"] - row["base"]
        print(
            f"| {row['world']} | {row['rank']} | {row['base']:.0f} | {row['rss']:.0f} | {row['peak']:.0f} | {added:.0f} |"
        )


def main() -> None:
    from relayrl.planner.estimate import precision_for
    from relayrl.planner.hardware import PROFILES

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/learner_scaling")
    parser.add_argument("--bucket-mb", type=float, default=1.0)
    parser.add_argument("--startup", action="store_true", help="peak RSS per rank while building the learner")
    parser.add_argument("--hidden", type=int, default=768, help="--startup's model width")
    parser.add_argument("--layers", type=int, default=6, help="--startup's model depth")
    parser.add_argument("--worlds", default="1,2", help="the numbers of ranks to run, comma-separated")
    parser.add_argument("--sharded", action="store_true", help="W=1 as one FSDP2 rank (ShardedLearner) too")
    args = parser.parse_args()
    if args.startup:
        return startup_table(Path(args.out), args.hidden, args.layers)
    model_dir = build_model(Path(args.out) / "model")
    per_param = precision_for(PROFILES["cpu"]).train_bytes
    worlds = [int(w) for w in args.worlds.split(",")]
    rows = [run_case(world, model_dir, args.bucket_mb, rank_main, args.sharded)[0] for world in worlds]
    base = rows[0]
    print(f"learner ranks on {rows[0]['params'] / 1e6:.2f}M params; load average {os.getloadavg()[0]:.1f}")
    print(
        "| W | state/rank MB | planner MB | vs W=1 | step s | vs W=1 | sync s | sync held MB (2 buckets) "
        "| pass/master dtype |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        w, mb = row["world"], 1e6
        print(
            f"| {w} | {row['state'] / mb:.1f} | {per_param * row['params'] / w / mb:.1f} | "
            f"{row['state'] / base['state']:.2f} | {row['step_s']:.3f} | {row['step_s'] / base['step_s']:.2f} | "
            f"{row['sync_s']:.4f} | {row['held'] / mb:.2f} ({2 * row['bucket'] / mb:.2f}) | "
            f"{row['precision']}{' FSDP2' if row['sharded'] else ''} |"
        )


if __name__ == "__main__":
    main()
