"""Per-program overhead of the code sandbox: the median wall time of a trivial program, run N times.

    .venv/bin/python benchmarks/sandbox_overhead.py [--runs 20] [--isolation auto|namespaces|rlimits]

Prints one JSON line: the isolation mode, the runs, the median/min/max wall seconds of `run_program` (the
launcher, the namespaces and filesystem view, the interpreter start, the kill and the read-back), and the
median CPU seconds of the sandbox's processes (less sensitive to a loaded machine than the wall clock).
A report, not a test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

from relayrl.rewards.sandbox import SandboxLimits, resolve_isolation, run_program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--isolation", default="auto", choices=["auto", "namespaces", "rlimits"])
    args = parser.parse_args()
    mode = resolve_isolation(args.isolation)
    limits = SandboxLimits(timeout_s=10)
    seconds, cpu_seconds = [], []
    for _ in range(args.runs):
        start, cpu_start = time.perf_counter(), _children_cpu_s()
        run = run_program("print(sum(range(10)))", limits=limits, isolation=mode)
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(_children_cpu_s() - cpu_start)
        if run.stdout != "45\n":
            raise SystemExit(f"the trivial program failed: {run}")
    print(
        json.dumps(
            {
                "isolation": mode,
                "runs": args.runs,
                "median_s": round(statistics.median(seconds), 4),
                "min_s": round(min(seconds), 4),
                "max_s": round(max(seconds), 4),
                "median_cpu_s": round(statistics.median(cpu_seconds), 4),
            }
        )
    )


def _children_cpu_s() -> float:
    """CPU time of reaped descendants: the launcher, and through it the sandbox's init and program."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
