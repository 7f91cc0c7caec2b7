"""Interleaved vs lockstep multi-turn rollouts, with environment latency that varies across trajectories.

Each trajectory runs `--turns` model turns; after each, its environment sleeps for a latency drawn per
(trajectory, turn) from an exponential distribution of mean `--latency-ms` (seeded: both modes see the same
latencies). Lockstep is what a batch-at-a-time agent loop does: every turn of the batch is generated, then
every environment step runs, and the next turn starts when the slowest step has returned. Interleaved is
relayrl's driver: a trajectory's next turn goes to the engine as soon as its own step returns. Same engine,
same model, same work (every trajectory runs all its turns); samples/s = trajectories / wall seconds.

  .venv/bin/python benchmarks/multiturn.py [--engine vllm|hf] [--trajectories 32] [--turns 4] [--latency-ms 0 100 300]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path


class SleepEnv:
    """Answers 'again' after the row's latency for this turn; done after the row's number of turns."""

    def reset(self, row):
        self.latencies, self.turn = row["latencies"], 0
        return row["prompt"]

    def step(self, action):
        from relayrl.envs import Step

        time.sleep(self.latencies[self.turn])
        self.turn += 1
        return Step(" 1+1=", 0.0, self.turn >= len(self.latencies))


def build_model(out: Path) -> Path:
    from relayrl.models.tiny import build_tiny

    if not (out / "config.json").exists():
        texts = [f"{a}+{b}={a + b}" for a in range(10) for b in range(10)] + [" "]
        build_tiny(texts, out, seed=0)
    return out


def run_once(engine, rows, args, lockstep: bool) -> float:
    from relayrl.envs.config import EnvConfig
    from relayrl.envs.pool import EnvPool
    from relayrl.envs.requests import turn_requests
    from relayrl.rollout.base import Sampling
    from relayrl.rollout.chat import ChatCodec
    from relayrl.rollout.multiturn import MultiTurnDriver

    tokenizer = engine.llm.get_tokenizer() if hasattr(engine, "llm") else engine.tokenizer
    settings = EnvConfig(fn="x", max_turns=args.turns, max_total_tokens=4096, max_inflight=len(rows))
    pool = EnvPool(f"{Path(__file__).resolve()}:SleepEnv", {}, slots=len(rows), timeout_s=60)
    try:
        pool.poll(0.5)  # workers start (not timed)
        sampling = Sampling(max_tokens=args.tokens, min_tokens=args.tokens, temperature=1.0, seed=0)
        driver = MultiTurnDriver(turn_requests(engine), pool, ChatCodec(tokenizer), settings, sampling, lockstep)
        start = time.perf_counter()
        batch = driver.run(rows, n=1)
        wall = time.perf_counter() - start
    finally:
        pool.close()
    assert len(batch.rollouts) == len(rows) and batch.metrics["env/turns_mean"] == args.turns
    return len(rows) / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    parser.add_argument("--trajectories", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16, help="tokens per model turn")
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 100.0, 300.0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default="/tmp/relayrl_bench_multiturn_model")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from relayrl.rollout.base import build_engine
    from relayrl.types import Prompt

    engine = build_engine(args.engine, str(build_model(Path(args.model))), 256, 0)
    print(f"cores: {os.cpu_count()}  load average: {os.getloadavg()}  engine: {args.engine}")
    print(f"{args.trajectories} trajectories x {args.turns} turns x {args.tokens} tokens, median of {args.repeats}")
    print("| env latency (mean, exponential) | lockstep samples/s | interleaved samples/s | ratio |")
    print("|---|---|---|---|")
    for latency in args.latency_ms:
        rng = random.Random(0)
        rows = [
            Prompt(
                id=str(i),
                text=f"{i % 10}+{i % 7}=",
                token_ids=[],
                columns={
                    "latencies": [rng.expovariate(1000.0 / latency) if latency else 0.0 for _ in range(args.turns)]
                },
            )
            for i in range(args.trajectories)
        ]
        results = {mode: [] for mode in (True, False)}
        for _ in range(args.repeats):
            for lockstep in (True, False):
                results[lockstep].append(run_once(engine, rows, args, lockstep))
        lock, inter = statistics.median(results[True]), statistics.median(results[False])
        print(f"| {latency:.0f} ms | {lock:.2f} | {inter:.2f} | {inter / lock:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
