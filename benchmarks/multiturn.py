"""Interleaved vs lockstep multi-turn rollouts, with environment latency that varies across trajectories.

Each trajectory runs `--turns` model turns; after each, its environment sleeps for a latency drawn per
(trajectory, turn) from an exponential distribution of mean `--latency-ms` (seeded: both modes see the same
latencies). Lockstep is what a batch-at-a-time agent loop does: every turn of the batch is generated, then
every environment step runs, and the next turn starts when the slowest step has returned. Interleaved is
relayrl's driver: a trajectory's next turn goes to the engine as soon as its own step returns. Same engine,
same model, same work (every trajectory runs all its turns); samples/s = trajectories / wall seconds.

  .venv/bin/python benchmarks/multiturn.py [--engine vllm|hf] [--trajectories 32] [--turns 4] [--latency-ms 0 100 300]

`--learn retry|calculator --warm-start DIR` measures instead what an example learns: held-out greedy success
(and first-turn success) of the warm start and of the trained policy, through `relayrl eval`'s code (env.fn=...),
after `relayrl train` on examples/multiturn_<name>/config.yaml (data written by the example's prepare.py).
"""

from __future__ import annotations

import argparse
import json
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
    from relayrl.config.env import EnvConfig
    from relayrl.data.chat import ChatCodec
    from relayrl.envs.pool import EnvPool
    from relayrl.rollout.local_group import LocalEngineGroup
    from relayrl.sources.trajectories import MultiTurnDriver
    from relayrl.sources.turn_requests import turn_requests
    from relayrl.types import Sampling

    tokenizer = engine.llm.get_tokenizer() if hasattr(engine, "llm") else engine.tokenizer
    settings = EnvConfig(fn="x", max_turns=args.turns, max_total_tokens=4096, max_inflight=len(rows))
    pool = EnvPool(f"{Path(__file__).resolve()}:SleepEnv", {}, slots=len(rows), timeout_s=60)
    try:
        pool.poll(0.5)  # workers start (not timed)
        sampling = Sampling(max_tokens=args.tokens, min_tokens=args.tokens, temperature=1.0, seed=0)
        driver = MultiTurnDriver(
            turn_requests(LocalEngineGroup(engine)), pool, ChatCodec(tokenizer), settings, sampling, lockstep
        )
        start = time.perf_counter()
        batch = driver.run(rows, n=1)
        wall = time.perf_counter() - start
    finally:
        pool.close()
    assert len(batch.rollouts) == len(rows) and batch.metrics["env/turns_mean"] == args.turns
    return len(rows) / wall


def learn(example: str, warm_start: str, out: Path, overrides: list[str]) -> None:
    """Held-out success of the warm start, training on the example's config, held-out success after."""
    import subprocess
    import sys

    import yaml

    from relayrl.api import train
    from relayrl.commands.eval import evaluate, load_eval_config

    directory = Path(__file__).resolve().parents[1] / "examples" / f"multiturn_{example}"
    data = out / "data"
    subprocess.run([sys.executable, str(directory / "prepare.py"), "--out", str(data)], check=True)
    env = yaml.safe_load((directory / "config.yaml").read_text())["env"]
    max_tokens = yaml.safe_load((directory / "config.yaml").read_text())["rollout"]["max_tokens"]

    def held_out(model: str) -> dict:  # greedy, as `relayrl eval MODEL DATA key=value ...` measures it
        keys = {"model.path": model, "data.eval": str(data / "eval.jsonl"), "rollout.engine": "hf"}
        keys |= {"rollout.max_tokens": max_tokens, "data.max_prompt_tokens": 10**6}
        keys |= {
            f"env.{key}": env[key] for key in ("fn", "kwargs", "max_turns", "max_total_tokens", "reward") if key in env
        }
        return evaluate(load_eval_config([f"{key}={json.dumps(value)}" for key, value in keys.items()]))

    before = held_out(warm_start)
    start = time.perf_counter()
    paths = [f"data.train={data / 'train.jsonl'}", f"data.eval={data / 'eval.jsonl'}", f"log.dir={out / 'run'}"]
    train(str(directory / "config.yaml"), overrides=[f"model.path={warm_start}", *paths, *overrides], overwrite=True)
    minutes = (time.perf_counter() - start) / 60
    after = held_out(str(out / "run" / "model"))
    print(f"load average: {os.getloadavg()}  training: {minutes:.1f} min  overrides: {overrides}")
    print("| held-out (greedy) | warm start | after RL | change |\n|---|---|---|---|")
    for key in ("success", "first_turn_success", "reward_mean", "turns_mean"):
        print(f"| {key} | {before[key]:.3f} | {after[key]:.3f} | {after[key] - before[key]:+.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learn", choices=["retry", "calculator"], help="measure an example's learning instead")
    parser.add_argument("--warm-start", help="--learn: the warm-start model directory (relayrl sft on its sft.jsonl)")
    parser.add_argument("--out", default="/tmp/relayrl_bench_multiturn_learn", help="--learn: data and run directory")
    parser.add_argument("overrides", nargs="*", help="--learn: config overrides, key=value")
    parser.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    parser.add_argument("--trajectories", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16, help="tokens per model turn")
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 100.0, 300.0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default="/tmp/relayrl_bench_multiturn_model")
    args = parser.parse_args()
    if args.learn:
        return learn(args.learn, args.warm_start, Path(args.out), args.overrides)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from relayrl.rollout.build import build_engine
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
