"""The Tinker service's overhead: a cookbook-style RL step through `relayrl serve` vs `relayrl train`'s step on the
same model and batch, and `sample` requests per second from 1 and 8 clients.

The RL step, both sides: the demo's warm start, 8 of the toy task's prompts x 4 samples, at most 6 new tokens,
temperature 1, exact-match reward, group-mean advantages, LoRA rank 8, the HF engine (what `auto` picks for a
tiny model on a CPU). The service's step is the cookbook's loop written against the SDK: `sample` per prompt,
`forward_backward(importance_sampling)`, `optim_step`, `save_weights_and_get_sampling_client`. `relayrl train`'s
is its `time/step` (GRPO, the same batch). Median over the steps after the first. Requests per second: the tiny
random model, 16 tokens per request, `--requests` in flight from one client or spread over 8 (threads, each its
own ServiceClient).

Usage: python benchmarks/service_overhead.py [--model runs/demo/warmstart] [--steps 6] [--requests 40]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PROMPTS, SAMPLES, MAX_TOKENS = 8, 4, 6


def toy_batches(root: Path, steps: int) -> tuple[dict, list[list[dict]]]:
    from relayrl.data.toy import write_toy_task

    task = write_toy_task(root / "toy", seed=0)
    rows = [json.loads(line) for line in task["train"].read_text().splitlines()]
    return task, [rows[i * PROMPTS : (i + 1) * PROMPTS] for i in range(steps)]


def service_rl_steps(model: str, batches: list[list[dict]], root: Path) -> tuple[list[float], list[dict]]:
    """The steps' times and, per step, each phase's seconds as the client waited for it (`<phase>`) and as the
    service's run log timed its work (`<route>/work`); the difference is the wire, the futures' polling and the
    queue."""
    import dataclasses

    import tinker
    from tinker import types

    from relayrl.service import server
    from relayrl.service.settings import service_settings

    settings = dataclasses.replace(service_settings(), run_dir=root / "service-run")
    running = server.start({model: model}, root / "state", settings=settings)
    try:
        service = tinker.ServiceClient(base_url=running.url, api_key=running.api_key)
        trainer = service.create_lora_training_client(base_model=model, rank=8).result()
        tokenizer = trainer.get_tokenizer()
        sampler = trainer.save_weights_and_get_sampling_client().result()
        params = types.SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0)
        times, phases, logged = [], [], 0
        for batch in batches:
            start = time.perf_counter()
            prompts = [tokenizer.encode(row["prompt"]) for row in batch]
            futures = [sampler.sample(types.ModelInput.from_ints(p), SAMPLES, params) for p in prompts]
            data = []
            for row, prompt, future in zip(batch, prompts, futures):
                sequences = future.result().sequences
                texts = [str(tokenizer.decode(s.tokens, skip_special_tokens=True)).strip() for s in sequences]
                rewards = [float(text == row["answer"]) for text in texts]
                mean = sum(rewards) / len(rewards)
                for sequence, reward in zip(sequences, rewards):
                    ids, pad = prompt + list(sequence.tokens), [0.0] * (len(prompt) - 1)
                    inputs = {
                        "target_tokens": ids[1:],
                        "logprobs": pad + list(sequence.logprobs or []),
                        "advantages": pad + [reward - mean] * len(sequence.tokens),
                    }
                    data.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs=inputs))
            marks = [time.perf_counter()]
            trainer.forward_backward(data, "importance_sampling").result()
            marks.append(time.perf_counter())
            trainer.optim_step(types.AdamParams(learning_rate=1e-4)).result()
            marks.append(time.perf_counter())
            sampler = trainer.save_weights_and_get_sampling_client().result()
            marks.append(time.perf_counter())
            times.append(marks[-1] - start)
            rows = metrics_rows(root / "service-run")
            phases.append(
                {"sample": marks[0] - start, "forward_backward": marks[1] - marks[0], "optim_step": marks[2] - marks[1]}
                | {"save_weights_and_get_sampling_client": marks[3] - marks[2]}
                | route_work(rows[logged:])
            )
            logged = len(rows)
        service.close("success").result()
        return times, phases
    finally:
        running.stop()


def metrics_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def route_work(rows: list[dict]) -> dict[str, float]:
    """Seconds of work per route in the service's run-log rows (`<route>/time`)."""
    work: dict[str, float] = {}
    for row in rows:
        for key, value in row.items():
            if key.endswith("/time"):
                work[f"{key.removesuffix('/time')}/work"] = work.get(f"{key.removesuffix('/time')}/work", 0.0) + value
    return work


def train_rl_steps(model: str, task: dict, steps: int, root: Path) -> list[float]:
    from learning_cases import run_in_process, write_config

    config = write_config(root / "train.yaml", model, task, root / "run", "hf")
    settings = [f"train.steps={steps}", f"rollout.n={SAMPLES}", f"rollout.prompts_per_step={PROMPTS}"]
    settings += [f"rollout.max_tokens={MAX_TOKENS}", "model.lora.rank=8", "train.lr=1e-4", "eval.max_prompts=8"]
    settings += ["log.save_model=false", "log.progress=false"]
    done = run_in_process("train", str(config), *settings)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    rows = [json.loads(line) for line in (root / "run/metrics.jsonl").read_text().splitlines()]
    return [row["time/step"] for row in rows if "time/step" in row]


def samples_per_second(model: str, requests: int, clients: int, root: Path) -> float:
    import tinker
    from tinker import types

    from relayrl.service import server

    running = server.start({model: model}, root / f"state-rps-{clients}")
    try:
        samplers = []
        for _ in range(clients):
            service = tinker.ServiceClient(base_url=running.url, api_key=running.api_key)
            samplers.append(service.create_sampling_client(base_model=model).result())
        prompt, params = types.ModelInput.from_ints([4, 5, 6]), types.SamplingParams(max_tokens=16, temperature=1.0)
        samplers[0].sample(prompt, 1, params).result()  # the engine is built on the first sample

        def client(sampler, count: int) -> None:
            futures = [sampler.sample(prompt, 1, params) for _ in range(count)]
            for future in futures:
                future.result()

        threads = [threading.Thread(target=client, args=(s, requests // clients)) for s in samplers]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return (requests // clients) * clients / (time.perf_counter() - start)
    finally:
        running.stop()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/demo/warmstart")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--no-rps", action="store_true", help="only the RL step")
    args = parser.parse_args(argv)
    from relayrl.models.tiny import build_tiny

    root = Path(tempfile.mkdtemp(prefix="service-overhead-"))
    try:
        task, batches = toy_batches(root, args.steps)
        service, phases = service_rl_steps(args.model, batches, root)
        service, phases = service[1:], phases[1:]
        train = train_rl_steps(args.model, task, args.steps, root)[1:]
        rps = {1: float("nan"), 8: float("nan")}
        if not args.no_rps:
            build_tiny([f"{a}+{b}={a + b}" for a in range(10) for b in range(10)], root / "random", hidden=64, layers=2)
            rps = {n: samples_per_second(str(root / "random"), args.requests, n, root) for n in (1, 8)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    figures = {
        "service_step_s": statistics.median(service),
        "train_step_s": statistics.median(train),
        "ratio": statistics.median(service) / statistics.median(train),
        "sample_rps_1_client": rps[1],
        "sample_rps_8_clients": rps[8],
        "phases": {
            name: statistics.median(p.get(name, 0.0) for p in phases) for name in {k for p in phases for k in p}
        },
    }
    print(
        f"RL step, median of {len(service)}: service {figures['service_step_s']:.2f}s, relayrl train "
        f"{figures['train_step_s']:.2f}s: {figures['ratio']:.2f}x"
    )
    print("per phase, median s: " + ", ".join(f"{k} {v:.3f}" for k, v in figures["phases"].items()))
    print(f"sample, {args.requests} requests of 16 tokens: 1 client {rps[1]:.1f}/s, 8 clients {rps[8]:.1f}/s")
    return figures


if __name__ == "__main__":
    main()
