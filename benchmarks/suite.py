"""The benchmark suite (issue 8): one command, one table of each measured figure against its target.

Runs, one after the other, each benchmark's `main(argv)` in a fresh process (spawn, so one benchmark's
engine threads, torch thread settings and memory do not linger into the next one's timings):

  peer_a     peer_trl.py --regime a --seeds 3     relayrl (vLLM engine) vs TRL GRPOTrainer, tiny arithmetic
                                                  (~0.8M params, <= 6 tokens), seeds 0..2 on both sides
  peer_a_hf  peer_trl.py --regime a --engine hf   the same with relayrl's HF-generate engine, seeds 0..2
             --seeds 3                            (TRL is run again, not reused)
  peer_b     peer_trl.py --regime b --seeds 1     relayrl (vLLM engine) vs TRL, decode-heavy (~27M, 128 tokens)
  peer_c     peer_trl.py --regime c --interleave  small batch (8 x 8, <= 8 tokens), relayrl's default engine; the two
             --seeds 3                            sides step alternately in one process, so both see the same load
  rollout    rollout_overhead.py                  relayrl's rollout call vs a bare vllm.LLM.generate, same requests
  phases     phases.py                            demo step phases, update MFU vs the matmul peak measured in the
                                                  same run, controller overhead

(--quick: every benchmark small, one seed each), then derives regime b's update MFU and controller overhead
from its relayrl run (metrics.jsonl, first step dropped as warm-up) against the same measured peak, and
prints `metric | measured | target | met?`. Step-time rows name relayrl's rollout engine; held-out rows
compare the means over seeds and show each side's [min-max]: the held-out score moves a lot with the seed
(regime a after 20 steps, seeds 0-3: relayrl 0.74-0.87, TRL 0.84-0.90).
A benchmark that fails is reported (its rows read n/a) and the suite exits with status 1 after the table;
a target not met is a measurement, not a failure. JSON: <dir>/suite.json (suite_quick.json with --quick).

Usage: python benchmarks/suite.py [--quick] [--only peer_a,rollout] [--dir runs/bench]
       (also `make bench`, `relayrl bench all [--quick]`)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

BENCH = Path(__file__).resolve().parent
BENCHMARKS = ("peer_a", "peer_a_hf", "peer_b", "peer_c", "rollout", "phases")
SEEDS = {
    "peer_a": 3,
    "peer_a_hf": 3,
    "peer_b": 1,
    "peer_c": 3,
}  # peer_trl --seeds of each peer benchmark (1 with --quick)
QUICK_ROLLOUT_REPEATS, ROLLOUT_REPEATS = 3, 30
QUICK_PHASE_STEPS, PHASE_STEPS = 4, 20

# targets of issue 8
STEP_RATIO_A, STEP_RATIO_B = 0.67, 0.33  # relayrl step time / TRL's, at most
ROLLOUT_RATIO = 1.15  # relayrl rollout / bare LLM.generate, at most
MFU = 0.35  # update FLOP/s / measured matmul FLOP/s, at least
OVERHEAD_FRAC = 0.05  # (time/step - sum of phases) / time/step, at most


# ---------------------------------------------------------------------------- verdicts (pure)


@dataclass
class Check:
    """One row of the final table. `value` is compared with `bound` by `op`; None = not measured."""

    metric: str
    value: float | None
    op: str  # "<=" or ">="
    bound: float
    measured: str  # the value as shown, with context
    target: str

    @property
    def met(self) -> str:
        return verdict(self.value, self.op, self.bound)


def verdict(value: float | None, op: str, bound: float) -> str:
    """Whether a measured value meets its bound: 'yes' or 'no'; 'n/a' when it was not measured."""
    if value is None:
        return "n/a"
    if op == "<=":
        return "yes" if value <= bound else "no"
    if op == ">=":
        return "yes" if value >= bound else "no"
    raise ValueError(f"unknown comparison {op!r}")


def dig(tree: dict, *keys):
    """tree[k1][k2]...; None when a level is missing (a benchmark that failed or was skipped)."""
    for key in keys:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def seeds_note(report: dict | None) -> str:
    seeds = dig(report, "seeds") or 1
    return f"{seeds} seed" + ("s" if seeds > 1 else "")


def step_ratio_check(report: dict | None, regime: str, bound: float, engine: str = "vllm") -> Check:
    """relayrl/TRL median step time over every step of every seed; the metric names relayrl's engine (the
    report's own when it has one)."""
    engine = dig(report, "engine") or engine
    ratio = dig(report, "step_time_ratio_relayrl_over_trl")
    ours, theirs = dig(report, "rows", "relayrl", "median_step_s"), dig(report, "rows", "TRL", "median_step_s")
    shown = "n/a" if ratio is None else f"{ratio:.2f}x ({ours:.3f}s vs {theirs:.3f}s, {seeds_note(report)})"
    return Check(
        f"regime ({regime}) median step, relayrl ({engine} engine)/TRL", ratio, "<=", bound, shown, f"<= {bound:.2f}x"
    )


def with_spread(row: dict | None) -> str:
    """A framework's mean held-out score, with [min-max] over seeds when it ran more than one."""
    mean, low, high = (dig(row, key) for key in ("greedy_after", "greedy_after_min", "greedy_after_max"))
    return f"{mean:.3f}" + (f" [{low:.3f}-{high:.3f}]" if (dig(row, "seeds") or 1) > 1 else "")


def held_out_check(report: dict | None, regime: str, engine: str = "vllm") -> Check:
    """Mean held-out score over seeds, relayrl minus TRL (>= 0 meets the target); shows both spreads."""
    ours, theirs = dig(report, "rows", "relayrl"), dig(report, "rows", "TRL")
    before = dig(ours, "greedy_before")
    measured = None
    if dig(ours, "greedy_after") is not None and dig(theirs, "greedy_after") is not None:
        measured = ours["greedy_after"] - theirs["greedy_after"]
    initial = "" if before is None else f" (initial {before:.3f})"
    shown = (
        "n/a" if measured is None else f"{with_spread(ours)} vs {with_spread(theirs)}, {seeds_note(report)}{initial}"
    )
    what = "digit fraction" if regime == "b" else "exact match"
    return Check(
        f"regime ({regime}) held-out {what}, seed mean, relayrl ({engine} engine) vs TRL",
        measured,
        ">=",
        0.0,
        shown,
        "relayrl >= TRL",
    )


def fraction_check(metric: str, value: float | None, op: str, bound: float, digits: int = 0) -> Check:
    shown = "n/a" if value is None else f"{value:.{digits}%}"
    return Check(metric, value, op, bound, shown, f"{op} {bound:.0%}")


def checks(results: dict) -> list[Check]:
    """The final table's rows from each benchmark's returned dict (missing or failed ones give n/a rows)."""
    rollout = results.get("rollout")
    ratio = dig(rollout, "ratio")
    bare, ours = dig(rollout, "medians_s", "bare"), dig(rollout, "medians_s", "relayrl")
    shown = "n/a" if ratio is None else f"{ratio:.3f}x ({ours * 1e3:.1f} vs {bare * 1e3:.1f} ms)"
    return [
        step_ratio_check(results.get("peer_a"), "a", STEP_RATIO_A),
        step_ratio_check(results.get("peer_a_hf"), "a", STEP_RATIO_A, engine="hf"),
        step_ratio_check(results.get("peer_b"), "b", STEP_RATIO_B),
        held_out_check(results.get("peer_a"), "a"),
        held_out_check(results.get("peer_b"), "b"),
        step_ratio_check(results.get("peer_c"), "c", STEP_RATIO_A, engine="auto"),
        held_out_check(results.get("peer_c"), "c", engine="auto"),
        Check("rollout, relayrl/bare vLLM generate (demo)", ratio, "<=", ROLLOUT_RATIO, shown, f"<= {ROLLOUT_RATIO}x"),
        fraction_check("update MFU (demo, phases.py)", dig(results, "phases", "mfu"), ">=", MFU),
        fraction_check("update MFU (regime b, relayrl)", dig(results, "peer_b_phases", "mfu"), ">=", MFU),
        fraction_check(
            "controller overhead, share of step (demo)",
            dig(results, "phases", "overhead_frac"),
            "<=",
            OVERHEAD_FRAC,
            digits=1,
        ),
        fraction_check(
            "controller overhead, share of step (regime b)",
            dig(results, "peer_b_phases", "overhead_frac"),
            "<=",
            OVERHEAD_FRAC,
            digits=1,
        ),
    ]


def format_table(rows: list[Check]) -> str:
    columns = [
        ("metric", [r.metric for r in rows]),
        ("measured", [r.measured for r in rows]),
        ("target", [r.target for r in rows]),
        ("met?", [r.met for r in rows]),
    ]
    widths = [max(len(name), *(len(cell) for cell in cells)) for name, cells in columns]
    lines = [" | ".join(name.ljust(width) for (name, _), width in zip(columns, widths))]
    lines.append("-+-".join("-" * width for width in widths))
    for i in range(len(rows)):
        lines.append(" | ".join(cells[i].ljust(width) for (_, cells), width in zip(columns, widths)))
    return "\n".join(lines)


# ---------------------------------------------------------------------------- running


def benchmark_argv(name: str, quick: bool, work: str, init_a: str | None) -> tuple[str, list[str]]:
    """(module, argv) of one benchmark. peer_a_hf, rollout and phases reuse regime a's initial model when known."""
    quick_flag = ["--quick"] if quick else []
    if name in SEEDS:
        regime = name.split("_")[1]
        engine = ["--engine", "hf"] if name.endswith("_hf") else ["--interleave"] if regime == "c" else []
        warm = ["--warmstart", init_a] if init_a and regime == "a" else []  # peer_a_hf: peer_a's very model
        return "peer_trl", [
            "--regime",
            regime,
            *engine,
            "--seeds",
            str(1 if quick else SEEDS[name]),
            "--dir",
            work,
            *warm,
            *quick_flag,
        ]
    model = ["--model", init_a] if init_a else []
    if name == "rollout":
        return "rollout_overhead", [*model, "--repeats", str(QUICK_ROLLOUT_REPEATS if quick else ROLLOUT_REPEATS)]
    if name == "phases":
        warm = ["--warmstart", init_a] if init_a else []
        return "phases", [
            *warm,
            "--dir",
            str(Path(work) / "phases"),
            "--steps",
            str(QUICK_PHASE_STEPS if quick else PHASE_STEPS),
        ]
    raise ValueError(f"unknown benchmark {name!r}")


def call_main(module: str, argv: list[str]) -> dict:
    """Import a benchmark module and run its main (in the worker process)."""
    import importlib

    sys.path.insert(0, str(BENCH))
    return importlib.import_module(module).main(argv)


def run_isolated(module: str, argv: list[str]) -> dict:
    """`module.main(argv)` in a fresh spawned process; its exception, if any, is raised here."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(call_main, module, argv).result()


def regime_b_phases(report: dict, peak: float | None) -> dict:
    """Regime b's relayrl run(s) through phases.step_analysis: MFU against `peak` (phases.py's measurement in
    this suite run; measured here when phases did not run), controller overhead. Each seed's first step is
    dropped (warm-up) and the other steps are pooled."""
    sys.path.insert(0, str(BENCH))
    from phases import measure_peak, read_metrics, step_analysis

    peak = peak or measure_peak()
    relayrl = report["rows"]["relayrl"]
    rows = []
    for run_dir in relayrl.get("run_dirs") or [relayrl["run_dir"]]:
        steps = read_metrics(Path(run_dir))
        rows += steps[1:] if len(steps) > 1 else steps  # the first step warms up
    settings = report["settings"]
    return {
        **step_analysis(rows, report["init_model"], settings["prompts_per_step"] * settings["n"], peak),
        "peak_flops": peak,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every benchmark small: a smoke run")
    parser.add_argument("--dir", default="runs/bench", help="work directory of the benchmarks")
    parser.add_argument("--only", default=",".join(BENCHMARKS), help=f"comma-separated subset of {BENCHMARKS}")
    parser.add_argument("--out", default=None, help="JSON (default <dir>/suite.json; suite_quick.json with --quick)")
    args = parser.parse_args(argv)
    args.only = [name.strip() for name in args.only.split(",") if name.strip()]
    if unknown := sorted(set(args.only) - set(BENCHMARKS)):
        parser.error(f"unknown benchmark(s) {unknown}; choose from {BENCHMARKS}")
    if args.out is None:
        args.out = str(Path(args.dir) / ("suite_quick.json" if args.quick else "suite.json"))
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    sys.path.insert(0, str(BENCH))
    from peer_trl import cpu_busy

    start, busy = time.perf_counter(), cpu_busy()
    if busy > 0.1:
        print(f"WARNING: the CPUs are {busy:.0%} busy before the suite starts: every timing will be noisy")
    results, errors, walls = {}, {}, {}
    for name in BENCHMARKS:
        if name not in args.only:
            continue
        module, argv_ = benchmark_argv(name, args.quick, args.dir, dig(results, "peer_a", "init_model"))
        print(f"\n===== {name}: {module}.py {' '.join(argv_)}", flush=True)
        began = time.perf_counter()
        try:
            results[name] = run_isolated(module, argv_)
        except Exception as err:  # noqa: BLE001 - report it and go on with the next benchmark
            errors[name] = "".join(traceback.format_exception_only(type(err), err)).strip()
            print(f"{name} FAILED: {errors[name]}")
        walls[name] = time.perf_counter() - began
    if "peer_b" in results:
        try:
            results["peer_b_phases"] = regime_b_phases(results["peer_b"], dig(results, "phases", "peak_flops"))
        except Exception as err:  # noqa: BLE001 - the other rows still stand
            errors["peer_b_phases"] = "".join(traceback.format_exception_only(type(err), err)).strip()
    rows = checks(results)
    print("\n" + format_table(rows))
    print(
        "benchmark wall times (s): "
        + "  ".join(f"{k} {v:.0f}" for k, v in walls.items())
        + f"; CPUs busy before the start: {busy:.0%}"
        + ("; QUICK run: smoke-test sizes" if args.quick else "")
    )
    report = {
        "quick": args.quick,
        "checks": [{**asdict(r), "met": r.met} for r in rows],
        "errors": errors,
        "results": results,
        "wall_s": time.perf_counter() - start,
        "benchmark_wall_s": walls,
        "cpu_busy_before_start": busy,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    for name, error in errors.items():
        print(f"FAILED {name}: {error}")
    return report


if __name__ == "__main__":
    sys.exit(1 if main()["errors"] else 0)
