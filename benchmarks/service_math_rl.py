"""The cookbook's math RL recipe through `relayrl serve`: held-out accuracy before and after, over seeds.

Issue 48's open done-when: `python -m tinker_cookbook.recipes.math_rl.train env=arithmetic ...`, unchanged, raises
the held-out accuracy of a tiny warm start by at least 15 points. This measures it, so that the test can set its
threshold from figures (at most half the smallest gain):

1. The warm start: the demo's (`runs/demo/warmstart`, `make demo`), or with `--warm-start tests` the tests' own
   (tests/conftest.py `warm_model_dir`: 4 epochs at batch 128 of the toy SFT set, built here first), with a
   tokenizer that maps role_colon's text onto the demo's format (`User: What is 58 + 67?\n\nAssistant:` reads as
   `58+67=`, the few-shot answer's end as the end-of-sequence token), then a short SFT (`--sft-steps` of
   `--sft-batch` at `--sft-lr`) on the demo's own warm-start problems in the environment's format: the few-shot
   example before each problem, which the demo's model never saw, confuses it until then. `--teacher sloppy` keeps
   the demo teacher's answers (the carry dropped on 60% of carry problems); `minus` writes the true sum with a
   stray minus sign on 55%.
2. Per seed, a service (`train.seed=SEED`), greedy accuracy on `--held-out` (100) held-out problems (none drawn by
   the recipe's first 50 batches of up to 64 groups; the demo's warm-start set covers about half of all problems,
   so some were seen there, with the teacher's answers), graded by the recipe's own ArithmeticEnv; the recipe's
   run; greedy accuracy of its final sampler weights, and the recipe's own sampled accuracy on each step's batch
   (`env/all/correct`). The recipe's settings are a user's CLI arguments: `--groups` (groups_per_batch),
   `--group-size`, `--lr`, `--lora-rank`, `--temperature`, `--steps` (max_steps).

Usage: python benchmarks/service_math_rl.py [--warm-start runs/demo/warmstart|tests] [--seeds 3] [--first-seed 0]
       [--steps 10] [--lr 2e-4] [--temperature 1.0] [--teacher sloppy] [--sft-steps 300] [--sft-lr 2e-3]
       [--sft-batch 64] [--held-out 100] [--groups 32] [--group-size 8] [--lora-rank 8]
It prints the seconds of each part: the warm start's build, per seed the recipe and the two evaluations.
tests/e2e/test_service_cookbook.py runs one seed of its `MATH_RL` flags (`--warm-start tests --groups 16 --steps 14
--held-out 200`: +0.13 to +0.20 over 10 seeds, docs/tinker.md).
The defaults are the measured setting that raises held-out greedy accuracy by 0.15-0.19 in 8 runs (seeds 0-2, 0-4)
(docs/tinker.md): a warm start that samples 0.35-0.45 right at temperature 1, so a group's advantages carry signal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

HELD_OUT = 100
MOST_GROUPS = 64  # the held-out problems are drawn by no batch of up to this many groups in a 50-step run


def question(x: int, y: int) -> str:
    """role_colon's rendering of the recipe's few-shot example and one problem (the renderer adds nothing else)."""
    return f"User: What is 4 + 5?\n\nAssistant: 9\n\nUser: What is {x} + {y}?\n\nAssistant:"


def mapped_warm_start(warm: Path, out: Path) -> None:
    """The demo's weights with a tokenizer reading role_colon's text as the demo's format (and `-` added)."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    vocab = json.loads((warm / "tokenizer.json").read_text())["model"]["vocab"]
    vocab.setdefault("-", len(vocab))
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    drop = [("User:", ""), ("Assistant:", "="), ("What is", ""), ("?\n\n", ""), ("\n\n", "</s>"), (" ", "")]
    core.normalizer = normalizers.Sequence([normalizers.Replace(a, b) for a, b in drop])
    core.pre_tokenizer = pre_tokenizers.Split(Regex("</s>|."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    model = AutoModelForCausalLM.from_pretrained(warm)
    torch.manual_seed(0)  # the added `-` row's initial values: unseeded, the warm start differed run to run
    model.resize_token_embeddings(len(vocab), mean_resizing=False)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def tests_warm_start(out: Path) -> Path:
    """The tests' warm start (tests/conftest.py `warm_model_dir`): 4 epochs at batch 128 of the toy SFT set."""
    from relayrl.data.toy import write_toy_task
    from relayrl.learner.sft import SFTSettings, run_sft

    sft = write_toy_task(out / "toy", seed=0)["sft"]
    return run_sft(
        sft, out / "model", init="tiny", settings=SFTSettings(epochs=4.0, batch_size=128), log=lambda *_: None
    )


def build_warm_start(
    warm: Path, out: Path, teacher: str, sft_steps: int, sft_lr: float = 2e-3, sft_batch: int = 64
) -> Path:
    """The mapped warm start after `sft_steps` of SFT (`sft_batch` rows each, at `sft_lr`) on the demo's own
    warm-start problems (toy seed 0), in the environment's format: `sloppy` keeps the demo teacher's answers,
    `minus` writes the true sum, negated on 55% of them."""
    from relayrl.data.toy import write_toy_task
    from relayrl.learner.sft import SFTSettings, run_sft

    mapped_warm_start(warm, out / "init")
    pairs = [json.loads(line) for line in write_toy_task(out / "toy", seed=0)["sft"].read_text().splitlines()]
    rng, rows = random.Random(0), []
    for pair in pairs[: sft_batch * sft_steps]:
        x, y = (int(n) for n in pair["prompt"].removesuffix("=").split("+"))
        answer = pair["completion"] if teacher == "sloppy" else f"{'-' if rng.random() < 0.55 else ''}{x + y}"
        rows.append({"prompt": question(x, y), "completion": f" {answer}"})
    (out / "sft.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    settings = SFTSettings(epochs=1.0, lr=sft_lr, batch_size=sft_batch, warmup_steps=5)
    return run_sft(
        out / "sft.jsonl", out / "model", model_path=str(out / "init"), settings=settings, log=lambda *_: None
    )


def held_out_problems(n: int = HELD_OUT) -> list[tuple[int, int]]:
    """Problems of the environment's range (0-100 each) that no batch of a 50-step run draws."""
    import numpy as np

    trained = set()
    for index in range(50):  # ArithmeticDataset.get_batch seeds numpy with the batch's index
        rng = np.random.RandomState(index)
        trained |= {(int(rng.randint(0, 101)), int(rng.randint(0, 101))) for _ in range(MOST_GROUPS)}
    pool = [(x, y) for x in range(101) for y in range(101) if (x, y) not in trained]
    return random.Random(1).sample(pool, n)


def held_out_accuracy(running, model: str, model_path: str | None = None, n: int = HELD_OUT) -> float:
    """Greedy accuracy on held_out_problems(n) through the service, graded by the recipe's ArithmeticEnv."""
    import tinker
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticEnv
    from tinker_cookbook.renderers import get_renderer
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    service = tinker.ServiceClient(base_url=running.url, api_key=running.api_key)
    sampler = service.create_sampling_client(model_path=model_path, base_model=None if model_path else model).result()
    renderer = get_renderer("role_colon", get_tokenizer(model))
    fewshot = ArithmeticEnv.standard_fewshot_prefix()
    envs = [ArithmeticEnv(x, y, renderer, convo_prefix=fewshot) for x, y in held_out_problems(n)]

    async def observe():
        return [await env.initial_observation() for env in envs]

    async def grade(samples) -> float:
        return sum([(await env.step(tokens)).metrics["correct"] for env, tokens in zip(envs, samples)]) / len(envs)

    try:
        greedy = [
            (prompt, tinker.SamplingParams(max_tokens=5, temperature=0.0, stop=stop))
            for prompt, stop in asyncio.run(observe())
        ]
        futures = [sampler.sample(prompt, 1, params) for prompt, params in greedy]
        return asyncio.run(grade([future.result().sequences[0].tokens for future in futures]))
    finally:
        service.close("success").result()


def run_recipe(running, model: str, log_path: Path, args) -> subprocess.CompletedProcess:
    """The recipe as a user runs it against the service."""
    flags = [f"model_name={model}", "renderer_name=role_colon", f"base_url={running.url}", f"log_path={log_path}"]
    flags += ["env=arithmetic", f"group_size={args.group_size}", f"groups_per_batch={args.groups}"]
    flags += [f"max_steps={args.steps}", "loss_fn=importance_sampling", f"learning_rate={args.lr}"]
    flags += [f"temperature={args.temperature}", f"lora_rank={args.lora_rank}", "eval_every=0", "save_every=0"]
    flags += ["behavior_if_log_dir_exists=delete"]
    env = {**os.environ, "TINKER_API_KEY": running.api_key}
    command = [sys.executable, "-m", "tinker_cookbook.recipes.math_rl.train", *flags]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)


def one_seed(model: Path, seed: int, root: Path, args) -> dict:
    from relayrl.config import load_config
    from relayrl.service import server
    from relayrl.service.settings import service_settings

    settings = service_settings(load_config(None, [f"train.seed={seed}"]))
    running = server.start({str(model): str(model)}, root / f"state-{seed}", settings=settings)
    seconds = {}
    try:
        with timer(seconds, "before_s"):
            before = held_out_accuracy(running, str(model), n=args.held_out)
        with timer(seconds, "recipe_s"):
            done = run_recipe(running, str(model), root / f"run-{seed}", args)
        if done.returncode:
            raise RuntimeError(f"the recipe failed:\n{done.stderr[-3000:]}")
        saved = (root / f"run-{seed}/checkpoints.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in (root / f"run-{seed}/metrics.jsonl").read_text().splitlines()]
        sampled = [row["env/all/correct"] for row in rows if "env/all/correct" in row]
        with timer(seconds, "after_s"):
            after = held_out_accuracy(running, str(model), json.loads(saved[-1])["sampler_path"], n=args.held_out)
    finally:
        running.stop()
    # sampled: the recipe's own batches' accuracy at its temperature, per step
    return {"seed": seed, "before": before, "after": after, "gain": after - before, "sampled": sampled, **seconds}


@contextmanager
def timer(seconds: dict, key: str):
    start = time.perf_counter()
    yield
    seconds[key] = time.perf_counter() - start


def warm_start(args, root: Path) -> Path:
    """The warm start `--warm-start` names (`tests`: the tests' own, built here first), mapped and SFT'd."""
    warm = tests_warm_start(root / "tests-warm") if args.warm_start == "tests" else Path(args.warm_start)
    return build_warm_start(warm, root / "warm", args.teacher, args.sft_steps, args.sft_lr, args.sft_batch)


def parser() -> argparse.ArgumentParser:
    """The benchmark's settings: the recipe's as a user gives them, the warm start's, the held-out set's size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm-start", default="runs/demo/warmstart", help="a warm start's path, or `tests`")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--teacher", choices=("sloppy", "minus"), default="sloppy")
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--sft-lr", type=float, default=2e-3)
    parser.add_argument("--sft-batch", type=int, default=64)
    parser.add_argument("--held-out", type=int, default=HELD_OUT, help="held-out problems graded")
    parser.add_argument("--groups", type=int, default=32, help="the recipe's groups_per_batch (at most 64)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lora-rank", type=int, default=8)
    return parser


def main(argv=None) -> list[dict]:
    args = parser().parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="service-math-rl-"))
    try:
        built = {}
        with timer(built, "warm_s"):
            model = warm_start(args, root)
        print(f"warm start built in {built['warm_s']:.0f}s", flush=True)
        seeds = range(args.first_seed, args.first_seed + args.seeds)
        results = [one_seed(model, seed, root, args) for seed in seeds]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for r in results:
        print(
            f"seed {r['seed']}: held-out greedy {r['before']:.2f} -> {r['after']:.2f} ({r['gain']:+.2f}), recipe "
            f"{r['recipe_s']:.0f}s, evals {r['before_s']:.1f}s + {r['after_s']:.1f}s, its batches' sampled "
            f"accuracy {' '.join(f'{a:.2f}' for a in r['sampled'])}"
        )
    print(f"smallest gain {min(r['gain'] for r in results):+.2f}")
    return results


if __name__ == "__main__":
    main()
