"""Rollout overhead: relayrl's rollout call vs a bare `vllm.LLM.generate` of the same requests, one process.

Both sides use the same engine instance (so the same weights, KV cache and threads), the same prompts
(the demo's: 32 prompts x n=8, at most 6 new tokens, temperature 1) and the same per-request seeds;
calls alternate, so drift on a shared machine hits both. relayrl's side is `VLLMEngine.generate`:
SamplingParams per request, the call, and turning outputs into `Rollout`s with behaviour log-probs and
version tags. The bare side builds the same SamplingParams and only calls `llm.generate`.

Usage: python benchmarks/rollout_overhead.py [--model runs/demo/warmstart] [--repeats 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/demo/warmstart")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=6)
    args = parser.parse_args(argv)
    from vllm import SamplingParams

    from relayrl.data.source import PromptSampler, load_prompts
    from relayrl.data.toy import write_toy_task
    from relayrl.models.loading import load_tokenizer
    from relayrl.rollout.vllm_engine import VLLMEngine, request_seed
    from relayrl.types import Sampling

    paths = write_toy_task(Path("runs/bench/rollout_overhead/data"), seed=0)
    prompts, _ = load_prompts(paths["train"], load_tokenizer(args.model), 16)
    batch = PromptSampler(prompts, 0).next(args.prompts)
    engine = VLLMEngine(args.model, 32, seed=0)
    sampling = Sampling(n=args.n, temperature=1.0, max_tokens=args.max_tokens, seed=1)

    def ours():
        engine.generate(batch, sampling, 0)

    def bare():
        params = [
            SamplingParams(
                n=args.n, temperature=1.0, max_tokens=args.max_tokens, logprobs=0, seed=request_seed(1, i, args.n)
            )
            for i in range(len(batch))
        ]
        engine.llm.generate([{"prompt_token_ids": p.token_ids} for p in batch], params, use_tqdm=False)

    for fn in (ours, bare, ours, bare):  # warm-up
        fn()
    times = {"relayrl": [], "bare": []}
    for _ in range(args.repeats):
        for name, fn in (("relayrl", ours), ("bare", bare)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratio = medians["relayrl"] / medians["bare"]
    print(f"{args.prompts} prompts x n={args.n}, <= {args.max_tokens} tokens, {args.repeats} alternating calls")
    print(
        f"relayrl rollout {medians['relayrl'] * 1e3:.1f} ms   bare LLM.generate {medians['bare'] * 1e3:.1f} ms   "
        f"overhead ratio {ratio:.3f}"
    )
    return {
        "medians_s": medians,
        "ratio": ratio,
        "times_s": times,
        "settings": {
            "model": args.model,
            "prompts": args.prompts,
            "n": args.n,
            "max_tokens": args.max_tokens,
            "repeats": args.repeats,
        },
    }


if __name__ == "__main__":
    main()
