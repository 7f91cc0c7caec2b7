"""Environment workers' start: the seconds until N workers (64 by default, env.max_inflight's scale) are ready,
from a driver script that imports torch at top level, as a training script does. Two ways, in one run:

- relayrl's: forked from the workers' server (relayrl/rewards/supervised.py), which imported the worker modules
  once; the driver's script is not re-run in a worker. Its time includes starting the server.
- multiprocessing's `spawn`, what relayrl used before: every worker is a new interpreter that imports relayrl
  and re-runs this script (its `import torch`) before it can start.

Printed: both times, their ratio, and the load average (other processes on the machine slow both).

Usage: python benchmarks/env_workers_start.py [--workers 64] [--env retry]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time

import torch  # noqa: F401 - the point: a script's heavy top-level import, which `spawn` re-runs in every worker

from relayrl.envs.pool import EnvPool


class SpawnedEnvPool(EnvPool):
    context = multiprocessing.get_context("spawn")
    startup_timeout_s = 3600.0  # measured, not enforced: spawned workers on a busy machine miss the 120 s


class MeasuredEnvPool(EnvPool):
    startup_timeout_s = 3600.0


def seconds_to_ready(pool_class: type[EnvPool], workers: int, env: str) -> float:
    started = time.perf_counter()
    pool = pool_class(env, {}, workers, 30.0)
    try:
        while not all(worker.ready for worker in pool.workers):
            pool.poll(0.2)
        return time.perf_counter() - started
    finally:
        pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--env", default="retry", help="env.fn of the workers")
    args = parser.parse_args()
    print(f"load average before: {' '.join(map(str, os.getloadavg()))} on {os.cpu_count()} CPUs", flush=True)
    ours = seconds_to_ready(MeasuredEnvPool, args.workers, args.env)
    print(f"relayrl (worker server, script not re-run): {args.workers} workers ready in {ours:.2f} s", flush=True)
    spawned = seconds_to_ready(SpawnedEnvPool, args.workers, args.env)
    print(f"spawn (script re-run in every worker):      {args.workers} workers ready in {spawned:.2f} s", flush=True)
    print(f"ratio spawn / relayrl: {spawned / ours:.1f}x", flush=True)
    print(f"load average after: {' '.join(map(str, os.getloadavg()))}", flush=True)


if __name__ == "__main__":
    main()
