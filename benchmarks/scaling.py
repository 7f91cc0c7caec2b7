"""How relayrl's time and memory grow with the work (issue 18, item 6): each section a small table of ratios to
its smallest case and the fitted exponent (the slope of log cost against log size).

  (a) response length, (b) rollout batch size: one learner update (`PolicyLearner.update`, GRPO, one
      micro-batch, logits_chunk on) on a tiny random Llama (hidden 64, 2 layers) in a fresh subprocess per
      case: the best seconds of 3 updates after a warm-up (the least disturbed by other processes), the process's peak RSS, and that peak less the
      peak before any update (imports, model, the batch). (a) 8 responses of
      64..1024 tokens; (b) 8..128 responses of 64 tokens. Generation and sync are not in these two sections.
      (a) for long responses (issue 18, item 2): --lengths 1024,...,16384 [--responses 2] [--repeats 1]
      with --activation-checkpointing and/or --logits-chunk N (0 = the model's own logits); a model whose
      max_positions covers the longest case is built beside the default one. Time per token = seconds over the
      update's forward positions (prompt + response, every sample). Beside each measured peak: the planner's
      (relayrl/planner/learner_memory.py: gradients + AdamW + one micro-batch's activations and logits).
      --token-budget runs the lengths again with train.micro_batch_tokens = the shortest case's positions (the
      memory count micro-batching used there) and shows the count beside it: where the count runs past it.
      glibc's malloc keeps freed blocks below its mmap threshold, which rises with every large free up to
      32 MiB: peak RSS then holds more than the live tensors. --return-freed-memory sets
      learner.return_freed_memory=true (relayrl/learner/malloc.py: the threshold fixed at 64 KiB, every block of
      64 KiB and more mapped and unmapped, RSS follows the live bytes, at a time cost).

  (c) dataset rows: a prompt jsonl of 1k, 10k, 100k and 1M rows (same row shape, ~40 bytes), or the same rows
      as parquet or a `datasets` save_to_disk directory (--format). Each case runs
      in a fresh subprocess: load the tokenizer, `load_prompts` + `show_first_prompt` (what `relayrl train`
      does before any role is built), then the sampler's first batch of 8 prompts: the trainer's first batch.
      Measured: seconds from the start of loading to that batch, and the process's peak RSS (ru_maxrss),
      also less the RSS of the same process before it loaded the data (the tokenizer and imports).
      Up to 10k rows a file is read whole (relayrl/data/source.py EAGER_ROWS); above, rows are read when
      drawn, so the 1M-row file pays its line index (12 bytes a row) and not its rows.

Simplifications, stated: a character tokenizer built here (tokenising cost per row is what a real one pays,
scaled); the files are written once into --out and reused; the machine is shared (2 cores): the load average
is printed with the table.

Run: .venv/bin/python benchmarks/scaling.py [--section a|b|c|all] [--out runs/scaling] [--rows 1000,...,1000000]
     [--format jsonl|parquet|datasets] [--lengths 64,...,1024] [--responses 8] [--repeats 3]
     [--activation-checkpointing] [--return-freed-memory] [--logits-chunk N] [--token-budget]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from relayrl.placement.sections import learner_settings

ROOT = Path(__file__).resolve().parents[1]


def write_prompts(path: Path, rows: int) -> Path:
    """A jsonl of `rows` short arithmetic prompts (written once, reused)."""
    if not path.is_file():
        temp = path.with_suffix(".tmp")
        with temp.open("w") as f:
            for i in range(rows):
                f.write(json.dumps({"prompt": f"{i % 997} + {i % 89} =", "answer": str(i % 997 + i % 89)}) + "\n")
        temp.replace(path)
    return path


def convert(jsonl: Path, fmt: str) -> Path:
    """The same rows as a parquet file or a `datasets` save_to_disk directory (written once, reused)."""
    if fmt == "jsonl":
        return jsonl
    target = jsonl.with_suffix(".parquet" if fmt == "parquet" else ".ds")
    if not target.exists():
        import pyarrow.json
        import pyarrow.parquet as pq

        table = pyarrow.json.read_json(jsonl)
        if fmt == "parquet":
            pq.write_table(table, target)
        else:
            import datasets

            datasets.Dataset(table).save_to_disk(str(target))
    return target


def first_batch_child(path: str) -> None:
    """Runs in the subprocess: prints {"seconds", "rss_mb", "base_mb", "rows"} as one JSON line."""
    import resource
    import string

    from relayrl.data.source import PromptSampler, load_prompts, show_first_prompt
    from relayrl.models.tiny import train_char_tokenizer

    tokenizer = train_char_tokenizer([string.printable])
    if not path.endswith(".jsonl"):  # count the Arrow libraries as imports, not as the data's memory
        import datasets  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    base = _rss_mb()
    start = time.perf_counter()
    prompts, stats = load_prompts(path, tokenizer, 64, "error")
    show_first_prompt(prompts, stats, tokenizer)
    batch = PromptSampler(prompts, seed=0).next(8)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "rss_mb": peak, "base_mb": base, "rows": len(prompts), "batch": len(batch)}))


PROMPT_TOKENS = 8  # every prompt of sections (a) and (b)


def update_overrides(model_dir: str, samples: int, response_tokens: int, memory: tuple = ()) -> list[str]:
    """The config of one case; `memory` may hold train.micro_batch_tokens, else one micro-batch of every sample."""
    overrides = [f"model.path={model_dir}", "rollout.n=8", f"rollout.prompts_per_step={samples // 8}"]
    overrides += [f"rollout.max_tokens={response_tokens}", "train.packing=none"]
    overrides += [f"data.max_prompt_tokens={PROMPT_TOKENS}", *memory]
    if not any(m.startswith("train.micro_batch_tokens=") for m in memory):
        overrides.append(f"train.micro_batch={samples}")
    return overrides


def predicted_over_mb(model_dir: str, samples: int, response_tokens: int, memory: tuple = ()) -> float:
    """The planner's update peak beyond the loaded model and batch: gradients and AdamW (12 B/param on CPU) and
    one micro-batch's activations and logits (relayrl/planner/learner_memory.py)."""
    from relayrl.build import resolve
    from relayrl.config import load_config
    from relayrl.planner import PROFILES, load_shape
    from relayrl.planner.estimate import estimate_memory, precision_for, workload_from_config

    config = resolve(load_config(None, update_overrides(model_dir, samples, response_tokens, memory)))
    shape = load_shape(model_dir)
    memory = estimate_memory(shape, workload_from_config(config), PROFILES["cpu"], precision_for(PROFILES["cpu"]))
    return (shape.params * 12 + memory.activations + memory.logits) / 1e6


def update_child(model_dir: str, samples: int, response_tokens: int, memory: tuple = (), repeats: int = 3) -> None:
    """Runs in the subprocess: one warm-up update, then `repeats` timed ones; prints {"seconds", "rss_mb",
    "over_mb", "tokens"}. `memory`: extra config overrides (activation checkpointing, logits chunk, a token
    budget)."""
    import resource

    import torch

    from relayrl.algorithms.advantages import grpo, make_inputs
    from relayrl.build import resolve
    from relayrl.config import load_config
    from relayrl.learner.batching import make_experience
    from relayrl.learner.policy import PolicyLearner
    from relayrl.types import Prompt, Rollout, Score

    torch.set_num_threads(2)
    learner = PolicyLearner(
        learner_settings(resolve(load_config(None, update_overrides(model_dir, samples, response_tokens, memory))))
    )
    gen = torch.Generator().manual_seed(0)
    rollouts = []
    for i in range(samples):
        ids = torch.randint(4, 20, (PROMPT_TOKENS,), generator=gen).tolist()
        prompt = Prompt(id=str(i // 8), text="", token_ids=ids)
        response = torch.randint(4, 20, (response_tokens,), generator=gen).tolist()
        rollouts.append(Rollout(prompt, i % 8, response, "", [-1.0] * response_tokens, "stop", [0] * response_tokens))
    scores = [Score(float(i % 3 == 0)) for i in range(samples)]
    exp = make_experience(rollouts, scores, pad_id=0)
    exp.advantages, _ = grpo(make_inputs(exp.rewards, exp.loss_mask, exp.group_ids))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # imports, model, optimizer, the batch
    times = []
    for _ in range(repeats + 1):  # the first warms up (AdamW states are allocated there); repeats=0: it alone
        start = time.perf_counter()
        stats = learner.update(exp).metrics
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row = {
        "seconds": min(times[1:] or times),
        "rss_mb": peak,
        "over_mb": peak - base,
        "tokens": int(exp.attention_mask.sum()),
        "micro_batches": int(stats["learner/micro_batches"]),
    }
    print(json.dumps(row))


def run_cases(model_dir: Path, cases: list[tuple[int, int]], memory: tuple, repeats: int, label: str) -> list[dict]:
    """Each case in a fresh subprocess (its own peak RSS), with the planner's prediction beside it."""
    results = []
    for samples, tokens in cases:
        code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from benchmarks.scaling import update_child; "
        code += f"update_child({str(model_dir)!r}, {samples}, {tokens}, {tuple(memory)!r}, {repeats})"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
        if done.returncode:
            raise SystemExit(done.stderr[-2000:])
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result.update(samples=samples, response=tokens)
        result["predicted_mb"] = predicted_over_mb(str(model_dir), samples, tokens, memory)
        results.append(result)
        print(
            f"  {label} {samples} x {tokens}: {result['seconds']:.3f} s, {result['rss_mb']:.0f} MB, over "
            f"{result['over_mb']:.0f} MB (predicted {result['predicted_mb']:.0f}), load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
    return results


def tiny_model(out: Path, longest: int) -> Path:
    """The sections' tiny random Llama (hidden 64, 2 layers), with positions for the longest case."""
    positions = max(2048, longest + 64)  # prompts of 8 tokens, and room
    model_dir = out / ("model" if positions == 2048 else f"model_{positions}")
    if not (model_dir / "config.json").is_file():
        from relayrl.models.tiny import build_tiny

        build_tiny(
            [chr(c) for c in range(32, 127)],
            model_dir,
            hidden=64,
            layers=2,
            heads=2,
            intermediate=128,
            max_positions=positions,
        )
    return model_dir


def section_update(
    out: Path, name: str, cases: list[tuple[int, int]], size_of, memory: tuple = (), repeats: int = 3
) -> list[dict]:
    """Sections (a) and (b): `cases` of (samples, response tokens); `size_of` picks the swept one. `memory`:
    config overrides passed to every case (learner.activation_checkpointing, train.logits_chunk)."""
    model_dir = tiny_model(out, max(tokens for _, tokens in cases))
    results = run_cases(model_dir, cases, memory, repeats, name)
    for r in results:
        r["n"] = size_of(r["samples"], r["response"])
    _table(name + "".join(f", {m}" for m in memory), results, repeats, memory)
    return results


def section_budget(out: Path, cases: list[tuple[int, int]], counted: list[dict], memory: tuple, repeats: int) -> None:
    """Section (a) again with train.micro_batch_tokens = the positions of the shortest case's one micro-batch:
    the memory count-based micro-batching (`counted`) used there. Beside it: where the count runs past it."""
    samples, shortest = cases[0]
    budget = samples * (PROMPT_TOKENS + shortest)
    model_dir = tiny_model(out, max(tokens for _, tokens in cases))
    results = run_cases(model_dir, cases, (*memory, f"train.micro_batch_tokens={budget}"), repeats, "budget")
    limit = results[0]["over_mb"]  # the memory both use at the shortest case: the budget's
    print(
        f"\n(a) token budget {budget} vs count-based micro_batch {samples} (the same memory at {shortest} tokens)"
        f"{''.join(f', {m}' for m in memory)}; malloc: {malloc_setting(memory)}"
        f" (load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f})"
    )
    print(
        "| response tokens | budget: micro-batches | s | peak over MB | predicted | x "
        f"| count: micro-batches | s | peak over MB | predicted | within the budget's {limit:.0f} MB? |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for b, c in zip(results, counted):
        fits = "yes" if c["over_mb"] <= limit * 1.05 else f"no: {c['over_mb'] / limit:.1f}x, runs out"
        if b["samples"] * (PROMPT_TOKENS + b["response"]) > budget * b["micro_batches"]:
            fits += " (the budget too: one sample is over it, alone)"
        print(
            f"| {b['response']} | {b['micro_batches']} | {b['seconds']:.2f} | {b['over_mb']:.0f} | {b['predicted_mb']:.0f} "
            f"| {b['predicted_mb'] / max(b['over_mb'], 0.1):.2f} | {c['micro_batches']} | {c['seconds']:.2f} "
            f"| {c['over_mb']:.0f} | {c['predicted_mb']:.0f} | {fits} |"
        )


def malloc_setting(memory: tuple) -> str:
    """glibc's mmap threshold in the case subprocesses (relayrl/learner/malloc.py)."""
    if "learner.return_freed_memory=true" in memory:
        return "mmap threshold fixed at 64 KiB (learner.return_freed_memory)"
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return f"MALLOC_MMAP_THRESHOLD_={os.environ['MALLOC_MMAP_THRESHOLD_']}"
    return "glibc's sliding mmap threshold"


def _table(name: str, results: list[dict], repeats: int = 3, memory: tuple = ()) -> None:
    small = results[0]
    print(
        f"\n{name} -> one learner update (load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}, "
        f"malloc: {malloc_setting(memory)})"
    )
    print(
        f"| {name} | s (best of {repeats}) | x | us per token | peak RSS MB | x | peak over the loaded model MB | x "
        "| predicted MB | predicted / measured |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        over = r["over_mb"] / max(small["over_mb"], 0.1)
        print(
            f"| {r['n']} | {r['seconds']:.3f} | {r['seconds'] / small['seconds']:.1f} "
            f"| {1e6 * r['seconds'] / r['tokens']:.1f} | {r['rss_mb']:.0f} "
            f"| {r['rss_mb'] / small['rss_mb']:.2f} | {r['over_mb']:.1f} | {over:.1f} "
            f"| {r['predicted_mb']:.1f} | {r['predicted_mb'] / max(r['over_mb'], 0.1):.2f} |"
        )
    sizes = [r["n"] for r in results]
    if len(set(sizes)) < 2:
        return  # one case: nothing to fit
    print(
        f"fitted exponent: time {fit_exponent(sizes, [r['seconds'] for r in results]):.2f}, "
        f"peak RSS {fit_exponent(sizes, [r['rss_mb'] for r in results]):.2f}, "
        f"over the model {fit_exponent(sizes, [max(r['over_mb'], 0.1) for r in results]):.2f}"
    )
    slope, intercept, r2 = fit_line(sizes, [r["over_mb"] for r in results])
    print(f"peak over the model as a line: {slope:.4f} MB per unit + {intercept:.1f} MB, R^2 {r2:.3f}")


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def fit_exponent(sizes: list[float], costs: list[float]) -> float:
    """Least-squares slope of log(cost) on log(size)."""
    xs, ys = [math.log(s) for s in sizes], [math.log(max(c, 1e-9)) for c in costs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def fit_line(sizes: list[float], costs: list[float]) -> tuple[float, float, float]:
    """(slope, intercept, R^2) of the least-squares line cost = slope * size + intercept."""
    n, mx, my = len(sizes), sum(sizes) / len(sizes), sum(costs) / len(costs)
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes, costs)) / sum((x - mx) ** 2 for x in sizes)
    intercept = my - slope * mx
    total = sum((y - my) ** 2 for y in costs) or 1e-12
    residual = sum((y - slope * x - intercept) ** 2 for x, y in zip(sizes, costs))
    return slope, intercept, 1 - residual / total if n > 2 else 1.0


def section_c(out: Path, row_counts: list[int], fmt: str = "jsonl") -> None:
    results = []
    for rows in row_counts:
        path = convert(write_prompts(out / f"prompts_{rows}.jsonl", rows), fmt)
        code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from benchmarks.scaling import first_batch_child; "
        code += f"first_batch_child({str(path)!r})"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        size = sum(f.stat().st_size for f in path.rglob("*")) if path.is_dir() else path.stat().st_size
        result.update(file_mb=size / 1e6, n=rows)
        results.append(result)
        print(f"  {rows:>9} rows: {result['seconds']:.3f} s, peak RSS {result['rss_mb']:.0f} MB", flush=True)
    small = results[0]
    print(
        f"\n(c) dataset rows ({fmt}) -> trainer's first batch (load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f})"
    )
    print("| rows | file MB | s to first batch | x | peak RSS MB | x | RSS over imports MB | x |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        data_mb, small_data = r["rss_mb"] - r["base_mb"], max(small["rss_mb"] - small["base_mb"], 0.1)
        print(
            f"| {r['n']} | {r['file_mb']:.2f} | {r['seconds']:.3f} | {r['seconds'] / small['seconds']:.1f} "
            f"| {r['rss_mb']:.0f} | {r['rss_mb'] / small['rss_mb']:.2f} | {data_mb:.1f} | {data_mb / small_data:.1f} |"
        )
    sizes = [r["n"] for r in results]
    print(
        f"fitted exponent: time {fit_exponent(sizes, [r['seconds'] for r in results]):.2f}, "
        f"RSS over imports {fit_exponent(sizes, [max(r['rss_mb'] - r['base_mb'], 0.1) for r in results]):.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", choices=["a", "b", "c", "all"], default="all")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "scaling")
    parser.add_argument("--rows", default="1000,10000,100000,1000000")
    parser.add_argument("--format", choices=["jsonl", "parquet", "datasets"], default="jsonl", help="section (c)")
    parser.add_argument("--lengths", default="64,128,256,512,1024", help="section (a): response tokens per case")
    parser.add_argument("--responses", type=int, default=8, help="section (a): responses per update (a multiple of 8)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="sections (a), (b): timed updates after the warm-up (0: time it)"
    )
    parser.add_argument("--activation-checkpointing", action="store_true", help="sections (a), (b)")
    parser.add_argument(
        "--return-freed-memory",
        action="store_true",
        help="sections (a), (b): learner.return_freed_memory=true (glibc's mmap threshold fixed at 64 KiB)",
    )
    parser.add_argument("--logits-chunk", type=int, default=None, help="sections (a), (b); default: the config's")
    parser.add_argument(
        "--token-budget",
        action="store_true",
        help="section (a): also with train.micro_batch_tokens at the shortest case's memory, beside the count",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    memory = ("learner.activation_checkpointing=true",) if args.activation_checkpointing else ()
    memory += () if args.logits_chunk is None else (f"train.logits_chunk={args.logits_chunk}",)
    memory += ("learner.return_freed_memory=true",) if args.return_freed_memory else ()
    if args.section in ("a", "all"):
        cases = [(args.responses, int(t)) for t in args.lengths.split(",")]
        counted = section_update(args.out, "(a) response tokens", cases, lambda s, t: t, memory, args.repeats)
        if args.token_budget:
            section_budget(args.out, cases, counted, memory, args.repeats)
    if args.section in ("b", "all"):
        cases = [(s, 64) for s in (8, 16, 32, 64, 128)]
        section_update(args.out, "(b) responses", cases, lambda s, t: s, memory, args.repeats)
    if args.section in ("c", "all"):
        section_c(args.out, [int(n) for n in args.rows.split(",")], args.format)


if __name__ == "__main__":
    main()
