"""Peer benchmark: the same GRPO run through relayrl and through TRL's `GRPOTrainer`, on CPU, over one or more seeds.

Three files:
  peer_trl.py      (this one) the command line, the seed loop, the per-seed and pooled figures, the table
                   and the JSON; the CPU-load helpers other benchmarks import from here.
  peer_regimes.py  what each regime (`--regime a|b`) builds: model, data, reward, held-out score, the
                   relayrl config and `relayrl train` command (its docstring describes both regimes).
  peer_sides.py    running each side (relayrl in a subprocess, TRL in this process), `relayrl eval` of
                   each model, and how TRL is configured to do relayrl's work per step (its docstring).

`--seeds N` trains each framework once per seed (train.seed = TRL seed = 0..N-1, alternating relayrl and
TRL) and evaluates every final model. `--engine hf` runs relayrl's rollouts with its HF-generate engine
(`rollout.engine=hf`) instead of vLLM; its runs go to <work>/engine_hf and its JSON gets `_hf`.

What it reports, for each framework:

* median step time (s): one step = generate prompts_per_step * n completions, score them, one optimizer
  step on all of them. relayrl: `time/step` from <run>/metrics.jsonl (generate -> ... -> weight sync).
  TRL: wall clock between a callback's `on_step_begin` and `on_step_end`. The median is over every step of
  every seed (none dropped); the JSON also has each seed's median, the fastest step and every step's time:
  on a shared machine the median moves with the neighbours' load.
* median generate (s): relayrl `time/generate`; TRL: the policy's `generate` calls, timed by wrapping it on
  the model instance. Pooled over seeds like the step time.
* tokens/s: completion tokens generated in a step (EOS included, on both sides) / that step's time,
  median over steps.
* held-out score: for the initial model (once: it is greedy) and for each seed's final model, all by the
  same evaluator (`relayrl eval`, vLLM, one subprocess per model and temperature); mean, min and max over
  seeds, and each seed's. The score varies a lot with the seed (regime a, 20 steps: 0.74-0.90 on either
  side), so one seed each shows that both learn, not which learns better.
* mean completion length (tokens), per framework.

Usage:  python benchmarks/peer_trl.py [--regime a|b] [--seeds N] [--engine vllm|hf] [--quick] [--steps N] ...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# peer_sides sets the vLLM/tokenizers environment defaults on import, before anything imports vLLM
from peer_interleave import run_interleaved  # noqa: E402
from peer_regimes import REGIMES, build_config, engine_of, prepare_inputs, regime_of, settings_of, work_dir  # noqa: E402,F401
from peer_sides import (  # noqa: E402,F401
    check_length,
    check_samples,
    held_out_score,
    run_logged,
    run_relayrl,
    run_trl,
    summarize,
    trl_differences,
)

FRAMEWORKS = ("relayrl", "TRL")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--regime",
        choices=sorted(REGIMES),
        default="a",
        help="a: tiny arithmetic (default); b: decode-heavy, 27M model, 128-token completions; c: small batch "
        "(8 x 8, <= 8 tokens), relayrl's default engine",
    )
    parser.add_argument("--seeds", type=int, default=1, help="train each framework with seeds 0..N-1 (default 1)")
    parser.add_argument(
        "--engine",
        choices=("vllm", "hf", "auto"),
        default=None,
        help="relayrl's rollout.engine (default: the regime's, vllm for a and b, auto for c; hf = transformers "
        "generate; auto = relayrl's default, chosen by model size)",
    )
    parser.add_argument("--steps", type=int, help="default: the regime's (a 20, b 8)")
    parser.add_argument("--prompts-per-step", type=int, help="default: the regime's (a 32, b 8)")
    parser.add_argument("--n", type=int, help="completions per prompt (group size); default: the regime's (a 8, b 4)")
    parser.add_argument("--max-tokens", type=int, help="default: the regime's (a 6, b 128)")
    parser.add_argument("--lr", type=float, help="default: the regime's (1e-4)")
    parser.add_argument("--out", default=None, help="JSON table (default <dir>/peer_trl[_b][_hf][_quick].json)")
    parser.add_argument("--dir", default="runs/bench", help="work directory: data, warm start, every run")
    parser.add_argument("--warmstart", default=None, help="regime a: warm-started model directory to reuse")
    parser.add_argument("--quick", action="store_true", help="smoke run: a few steps (a 3, b 2, c 3)")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch intra-op threads on both sides (relayrl train.threads, TRL torch.set_num_threads); "
        "default 0: torch's own (one per core)",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="train both sides in this process, one step each in turn, so both see the same load "
        "(peer_interleave.py); default: relayrl's `relayrl train` subprocess, then TRL",
    )
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    regime = REGIMES[args.regime]
    args.engine = args.engine or regime.engine
    for key in ("steps", "prompts_per_step", "n", "max_tokens", "lr"):
        if getattr(args, key) is None:
            setattr(args, key, getattr(regime, key))
    if args.quick:
        args.steps = regime.quick_steps
    args.min_tokens = min(regime.min_tokens, args.max_tokens)
    if args.out is None:
        suffix = (
            ("" if args.regime == "a" else f"_{args.regime}")
            + ("" if args.engine == regime.engine else f"_{args.engine}")
            + ("_interleaved" if args.interleave else "")
            + (f"_t{args.threads}" if args.threads else "")
            + ("_quick" if args.quick else "")
        )
        args.out = str(Path(args.dir) / f"peer_trl{suffix}.json")
    return args


# ---------------------------------------------------------------------------- seeds (pure)


def spread(values: list[float | None]) -> dict:
    """Mean, min, max of per-seed values (all None when any seed has none)."""
    if not values or any(v is None for v in values):
        return {"mean": None, "min": None, "max": None}
    return {"mean": statistics.mean(values), "min": min(values), "max": max(values)}


def combine_seeds(runs: list[dict], batch: int) -> dict:
    """One framework's row from its per-seed runs (each `summarize`'s dict plus greedy_after/sampled_after):
    step figures pooled over every step of every seed, held-out mean/min/max over seeds, each seed kept."""

    def pooled(key: str) -> list[float]:
        return [value for run in runs for value in run["per_step"][key]]

    row = summarize(pooled("time_s"), pooled("completion_tokens"), pooled("train_reward"), pooled("generate_s"), batch)
    row.pop("first_step_s")  # pooled it means nothing; each seed's is in per_seed
    greedy = spread([run["greedy_after"] for run in runs])
    sampled = spread([run.get("sampled_after") for run in runs])
    row.update(
        seeds=len(runs),
        wall_s=sum(run["wall_s"] for run in runs),
        median_step_s_per_seed=[run["median_step_s"] for run in runs],
        greedy_after=greedy["mean"],
        greedy_after_min=greedy["min"],
        greedy_after_max=greedy["max"],
        greedy_after_per_seed=[run["greedy_after"] for run in runs],
        sampled_after=sampled["mean"],
        sampled_after_per_seed=[run.get("sampled_after") for run in runs],
        per_seed=runs,
    )
    if "run_dir" in runs[0]:
        row.update(run_dir=runs[0]["run_dir"], run_dirs=[run["run_dir"] for run in runs])
    return row


def step_ratios(rows: dict[str, dict]) -> tuple[float, list[float]]:
    """relayrl/TRL median step time: pooled over all steps, and per seed (same seed on both sides)."""
    ours, theirs = rows["relayrl"], rows["TRL"]
    per_seed = [a / b for a, b in zip(ours["median_step_s_per_seed"], theirs["median_step_s_per_seed"])]
    return ours["median_step_s"] / theirs["median_step_s"], per_seed


def label(name: str, engine: str) -> str:
    """How a framework is named in printed tables: relayrl carries its rollout engine."""
    return f"relayrl ({engine} engine)" if name == "relayrl" else name


def table(rows: dict[str, dict], ratio: float, held_out: str = "", engine: str = "vllm") -> str:
    seeds = next(iter(rows.values()))["seeds"]
    after = "held-out after" + (f" (mean [min-max] of {seeds} seeds)" if seeds > 1 else "")
    width = max(len(label(name, engine)) for name in rows)
    header = (
        f"{'framework':<{width}} {'median step (s)':>16} {'min step':>9} {'median generate':>16} "
        f"{'tokens/s':>9} {'mean len':>9} {'held-out before':>16} {after:>{max(15, len(after))}}"
    )
    lines = [header, "-" * len(header)]
    for name, row in rows.items():
        held = f"{row['greedy_after']:.3f}"
        if seeds > 1:
            held += f" [{row['greedy_after_min']:.3f}-{row['greedy_after_max']:.3f}]"
        lines.append(
            f"{label(name, engine):<{width}} {row['median_step_s']:>16.3f} {row['min_step_s']:>9.3f} "
            f"{row['generate_median_s']:>16.3f} {row['tokens_per_s']:>9.0f} "
            f"{row['completion_length_mean']:>9.1f} {row['greedy_before']:>16.3f} "
            f"{held:>{max(15, len(after))}}"
        )
    if seeds > 1:
        for seed in range(seeds):
            lines.append(
                f"  seed {seed}: "
                + "; ".join(
                    f"{label(name, engine)} {row['median_step_s_per_seed'][seed]:.3f} s/step, held-out "
                    f"{row['greedy_after_per_seed'][seed]:.3f}"
                    for name, row in rows.items()
                )
            )
    steps = f" (median over all {rows['relayrl']['steps']} steps of {seeds} seeds)" if seeds > 1 else ""
    lines.append(
        f"step time {label('relayrl', engine)}/TRL: {ratio:.2f}x{steps}"
        + (f"   held-out = {held_out}" if held_out else "")
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- orchestration


def run_seed(seed: int, args: argparse.Namespace, paths: dict[str, Path], walls: dict[str, float]) -> dict:
    """Both frameworks trained with one seed (relayrl first) and both final models evaluated."""
    regime, work = regime_of(args), work_dir(args)
    config, command = build_config(args, paths, work / "relayrl" / f"seed{seed}", seed)
    if args.interleave:
        print(f"seed {seed}: training relayrl ({engine_of(args)} engine) and TRL in this process, steps alternating")
        relay, trl_stats, samples = run_interleaved(
            config, work / "relayrl" / f"seed{seed}", work / "trl" / f"seed{seed}"
        )
        walls["interleaved_train"] = walls.get("interleaved_train", 0.0) + relay["wall_s"]
    else:
        print(f"seed {seed}: training with relayrl, {engine_of(args)} engine (subprocess)...", flush=True)
        relay = run_relayrl(config, command, work / "relayrl" / f"seed{seed}")
        walls["relayrl_train"] = walls.get("relayrl_train", 0.0) + relay["wall_s"]
        print(f"  done: median step {relay['median_step_s']:.3f}s, wall {relay['wall_s']:.0f}s")
        print(f"seed {seed}: training with TRL GRPOTrainer (this process)...", flush=True)
        trl_stats, samples = run_trl(config, work / "trl" / f"seed{seed}")
        walls["trl_train"] = walls.get("trl_train", 0.0) + trl_stats["wall_s"]
    check_length("relayrl training", relay["completion_length_mean"], args.min_tokens, args.max_tokens)
    print(
        f"  done: median step relayrl {relay['median_step_s']:.3f}s, TRL {trl_stats['median_step_s']:.3f}s, "
        f"wall {trl_stats['wall_s']:.0f}s"
    )
    if seed == 0:
        check_samples(samples, regime)
    check_length("TRL training", trl_stats["completion_length_mean"], args.min_tokens, args.max_tokens)
    runs = {"relayrl": relay, "TRL": trl_stats}
    for name, stats in runs.items():
        with stopwatch(walls, f"eval_{name}"):
            after = held_out_score(
                work / name.lower() / f"seed{seed}" / "model",
                args,
                paths["eval_full"],
                work / "logs" / f"eval_{name}_seed{seed}.log",
            )
        stats.update(seed=seed, greedy_after=after["score"], sampled_after=after["sampled"])
    print(f"  seed {seed} held-out: relayrl {relay['greedy_after']:.3f}, TRL {trl_stats['greedy_after']:.3f}")
    return runs


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    regime, engine = regime_of(args), engine_of(args)
    start, busy_start = time.perf_counter(), cpu_busy()
    if busy_start > 0.1:
        print(f"WARNING: the CPUs were {busy_start:.0%} busy before the start: timings will be noisy")
    cpu_start = cpu_sample()
    if args.threads:  # TRL runs in this process; relayrl gets train.threads (peer_regimes.config_overrides)
        import torch

        torch.set_num_threads(args.threads)
    work = work_dir(args)
    paths = prepare_inputs(args)
    config, _ = build_config(args, paths, work / "relayrl" / "seed0")
    if engine == "auto":  # what relayrl chose for this model (config validation resolved it)
        engine = f"auto: {config.rollout.engine}"
    differences = trl_differences(config, paths["train"], regime, args)
    print(
        f"regime {regime.name}, relayrl engine {engine}, seeds 0..{args.seeds - 1}; settings: "
        + json.dumps(settings_of(config))
    )
    print("TRL differs from relayrl in:\n  - " + "\n  - ".join(differences))
    walls: dict[str, float] = {}
    with stopwatch(walls, "eval_before"):
        before = held_out_score(paths["init"], args, paths["eval_full"], work / "logs" / "eval_before.log")
    per_seed: dict[str, list[dict]] = {name: [] for name in FRAMEWORKS}
    for seed in range(args.seeds):
        for name, stats in run_seed(seed, args, paths, walls).items():
            per_seed[name].append(stats)
    rows = {name: combine_seeds(runs, config.rollout_batch) for name, runs in per_seed.items()}
    for row in rows.values():
        row.update(greedy_before=before["score"], sampled_before=before["sampled"])
    ratio, ratios = step_ratios(rows)
    print("\n" + table(rows, ratio, regime.held_out, engine))
    print(
        "relayrl phases (median s, seed 0): "
        + "  ".join(f"{phase} {seconds:.4f}" for phase, seconds in per_seed["relayrl"][0]["phase_median_s"].items())
    )
    if before["sampled"] is not None:
        print(
            f"held-out sampled (temperature 1, one per prompt, mean over seeds): initial {before['sampled']:.3f}, "
            + ", ".join(f"{label(name, engine)} {row['sampled_after']:.3f}" for name, row in rows.items())
        )
    print("wall times (s): " + "  ".join(f"{name} {seconds:.0f}" for name, seconds in walls.items()))
    others = others_share(cpu_start, cpu_sample())
    if others > 0.05:
        print(f"WARNING: other processes used {others:.0%} of the CPUs during the run: step times are inflated")
    report = {
        "regime": regime.name,
        "engine": engine,
        "seeds": args.seeds,
        "interleaved": args.interleave,
        "held_out": regime.held_out,
        "settings": settings_of(config),
        "rows": rows,
        "step_time_ratio_relayrl_over_trl": ratio,
        "step_time_ratio_per_seed": ratios,
        "trl_differences": differences,
        "init_model": str(paths["init"]),
        "wall_s": time.perf_counter() - start,
        "phase_wall_s": walls,
        "cpu_busy_before_start": busy_start,
        "cpu_share_of_other_processes_during_run": others,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}   script wall time {report['wall_s']:.0f}s")
    return report


@contextlib.contextmanager
def stopwatch(walls: dict[str, float], name: str):
    """Add the wall time of the `with` block to walls[name]."""
    start = time.perf_counter()
    try:
        yield
    finally:
        walls[name] = walls.get(name, 0.0) + time.perf_counter() - start


# ---------------------------------------------------------------------------- CPU load (also used by others)


def cpu_sample() -> tuple[float, float, float]:
    """(machine CPU-seconds, of which busy, CPU-seconds used by this process and its finished children)."""
    fields = [int(x) / os.sysconf("SC_CLK_TCK") for x in Path("/proc/stat").read_text().split()[1:11]]
    own = os.times()
    return (
        sum(fields),
        sum(fields) - fields[3] - fields[4],
        own.user + own.system + own.children_user + own.children_system,
    )


def others_share(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    """Fraction of the machine's CPU time used by other processes between two `cpu_sample`s."""
    total, busy, own = (b - a for a, b in zip(before, after))
    return max(0.0, busy - own) / max(total, 1e-9)


def cpu_busy(seconds: float = 2.0) -> float:
    """Fraction of the machine's CPU time in use over a short window (Linux; load average elsewhere)."""
    if not Path("/proc/stat").is_file():
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    first = cpu_sample()
    time.sleep(seconds)
    return others_share(first, cpu_sample())


if __name__ == "__main__":
    main()
