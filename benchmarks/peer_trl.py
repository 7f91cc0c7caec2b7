"""Peer benchmark: the same GRPO run through relayrl and through TRL's `GRPOTrainer`, on CPU.

Two regimes (`--regime`), both on the demo task's data (two-number addition prompts,
`relayrl/configs/demo.yaml` with this script's --steps/--prompts-per-step/--n/--max-tokens/--lr, whose
defaults are each regime's own, not the demo's):

  a (default)  tiny arithmetic: the demo's warm-started Llama (~0.8M parameters), 20 steps x 32 prompts x
               n=8, completions of at most 6 tokens, reward and held-out score = exact match (500 problems).
  b            decode-heavy: a randomly initialised ~27M-parameter Llama (hidden 512, 8 layers, 8 heads,
               MLP 1536, `relayrl.models.tiny.build_tiny` over the task's texts, cached in <dir>/regime_b/model),
               8 steps x 8 prompts x n=4, every completion exactly 128 tokens (end-of-sequence is suppressed
               before 128: relayrl `rollout.min_tokens=128`, TRL `generation_kwargs={"min_new_tokens": 128}`;
               both sides' mean completion length is checked to be 128 +- 1). No warm start: supervised
               training of a 27M model on this 2-core machine would take longer than the benchmark. Exact
               match is always 0 for a random model writing 128 tokens, so the reward is the dense, verifiable
               `digit_fraction` of benchmarks/rewards.py (share of the completion's characters that are digits),
               the same function on both sides; the held-out score is its greedy mean over the first 64
               held-out prompts, 128 tokens, measured by one benchmark-side evaluator (relayrl's vLLM engine,
               `min_tokens=128`; `relayrl eval` has no length floor) for the initial model and both final models.

What it measures, for each framework:

* median step time (s): one step = generate prompts_per_step * n completions, score them, one optimizer
  step on all of them. relayrl: `time/step` from <run>/metrics.jsonl (generate -> ... -> weight sync to
  vLLM). TRL: wall clock between a callback's `on_step_begin` and `on_step_end`. The JSON also has the
  fastest step and every step's time: on a shared machine the median moves with the neighbours' load.
* median generate (s): median time of the rollout phase (relayrl `time/generate`: vLLM; TRL: the
  policy's `generate` call, timed by wrapping it on the model instance).
* tokens/s: completion tokens generated in a step (EOS included, on both sides) / that step's time,
  median over steps.
* held-out greedy score: regime a: exact match on the 500 held-out problems, greedy, for the warm start and
  for each final model, all measured by the same evaluator (`relayrl eval`, vLLM, one subprocess per model);
  regime b: see above.
* mean completion length (tokens), per framework.

How TRL is configured to do the same work per step (TRL 1.16 semantics):
    per_device_train_batch_size = prompts_per_step * n      (= relayrl train.micro_batch: one forward/backward)
    gradient_accumulation_steps = 1, steps_per_generation = 1
      -> generation_batch_size = prompts_per_step * n = prompts_per_step groups of num_generations = n
      -> one TRL "global step" = one generation batch = one optimizer step (relayrl: mini_batch = rollout batch)
    num_iterations = 1 (relayrl train.epochs = 1); since the generation and the optimizer step are aligned,
      neither side runs a separate old-log-prob pass (the ratio is exp(logp - logp.detach()))
    loss_type = "dapo": sum of per-token losses / active tokens in the batch (relayrl loss_agg = token_mean)
    scale_rewards = "group" (relayrl std_normalize), beta = 0 (relayrl kl.coef = 0: no reference model),
    epsilon = clip_eps, max_grad_norm = grad_clip, temperature/top_p/top_k, max_completion_length = max_tokens
    generation_kwargs = {"min_new_tokens": min_tokens} when rollout.min_tokens > 0 (regime b)
    optimizer + schedule: relayrl's own AdamW and warmup/constant LambdaLR, handed to TRL through
      `optimizers=`, because HF's `constant_with_warmup` starts at lr 0 where relayrl starts at lr/warmup.

Simplifications and known differences (also printed at run time):
* TRL generates with transformers `generate` (use_vllm=False); relayrl generates with vLLM and copies the
  weights into it after every update. This is the difference the benchmark is about.
* Prompt order and sampling random streams differ, so the two runs see different prompts and completions
  (same data, same seed value). Accuracy is one run each: it shows both learn, not which learns better.
* TRL divides group-centred rewards by (std + 1e-4), relayrl by (std + 1e-6).
* relayrl settings with no TRL counterpart here (other policy losses, loss aggregations, entropy bonus,
  rollout correction, DAPO options) must be at their defaults; otherwise they are listed as not mirrored.
* relayrl trains in a subprocess (`relayrl train`), TRL in this process; each evaluation is its own
  subprocess, so no two vLLM engines ever share a process.

Usage:  python benchmarks/peer_trl.py [--regime a|b] [--quick] [--steps N] [--prompts-per-step N] [--n N] ...
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# TRL imports vLLM at import time and warns about its version; TRL's vLLM path is not used here.
warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions")

REPO = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
DEMO_WARMSTART = REPO / "runs" / "demo" / "warmstart"


@dataclass(frozen=True)
class Regime:
    """One benchmark setting: its defaults (overridable on the command line) and what it scores."""

    name: str
    steps: int
    quick_steps: int
    prompts_per_step: int
    n: int
    max_tokens: int
    min_tokens: int  # 0 = completions end at EOS; > 0: EOS is suppressed before this many tokens
    lr: float
    reward: str  # relayrl reward.fn spec; TRL calls the same function
    eval_prompts: int  # held-out prompts scored (0 = all)
    warm_start: bool  # False: a random init of MODEL_B
    held_out: str  # what the held-out number is, for the table and the JSON


REGIMES = {
    "a": Regime("a", steps=20, quick_steps=3, prompts_per_step=32, n=8, max_tokens=6, min_tokens=0, lr=1e-4,
                reward="exact_match", eval_prompts=0, warm_start=True,
                held_out="greedy exact match on the 500 held-out problems"),
    "b": Regime("b", steps=8, quick_steps=2, prompts_per_step=8, n=4, max_tokens=128, min_tokens=128, lr=1e-4,
                reward=f"{BENCH / 'rewards.py'}:digit_fraction", eval_prompts=64, warm_start=False,
                held_out="greedy digit_fraction on the first 64 held-out prompts, 128 tokens"),
}
MODEL_B = dict(hidden=512, layers=8, heads=8, intermediate=1536)  # ~27M parameters with the task's vocabulary
LENGTH_TOLERANCE = 1.0  # tokens: a fixed-length regime fails when a side's mean completion length is further off


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regime", choices=sorted(REGIMES), default="a",
                        help="a: tiny arithmetic (default); b: decode-heavy, 27M model, 128-token completions")
    parser.add_argument("--steps", type=int, help="default: the regime's (a 20, b 8)")
    parser.add_argument("--prompts-per-step", type=int, help="default: the regime's (a 32, b 8)")
    parser.add_argument("--n", type=int, help="completions per prompt (group size); default: the regime's (a 8, b 4)")
    parser.add_argument("--max-tokens", type=int, help="default: the regime's (a 6, b 128)")
    parser.add_argument("--lr", type=float, help="default: the regime's (1e-4)")
    parser.add_argument("--out", default=None, help="JSON table (default <dir>/peer_trl[_b][_quick].json)")
    parser.add_argument("--dir", default="runs/bench", help="work directory: data, warm start, both runs")
    parser.add_argument("--warmstart", default=None, help="regime a: warm-started model directory to reuse")
    parser.add_argument("--quick", action="store_true", help="smoke run: a few steps (a 3, b 2)")
    args = parser.parse_args(argv)
    regime = REGIMES[args.regime]
    for key in ("steps", "prompts_per_step", "n", "max_tokens", "lr"):
        if getattr(args, key) is None:
            setattr(args, key, getattr(regime, key))
    if args.quick:
        args.steps = regime.quick_steps
    args.min_tokens = min(regime.min_tokens, args.max_tokens)
    if args.out is None:
        suffix = ("_b" if args.regime == "b" else "") + ("_quick" if args.quick else "")
        args.out = str(Path(args.dir) / f"peer_trl{suffix}.json")
    return args


def regime_of(args: argparse.Namespace) -> Regime:
    """The regime of a namespace; callers with their own arguments (phases.py) get regime a."""
    return REGIMES[getattr(args, "regime", "a")]


def work_dir(args: argparse.Namespace) -> Path:
    """Where a regime's model, runs and logs go: <dir> for regime a (as before regimes), <dir>/regime_b."""
    regime = regime_of(args)
    return Path(args.dir) if regime.name == "a" else Path(args.dir) / f"regime_{regime.name}"


# ---------------------------------------------------------------------------- shared inputs


def prepare_inputs(args: argparse.Namespace) -> dict[str, Path]:
    """Toy data in <dir>/data; the initial model ("init"): regime a's warm start (--warmstart, the demo's cache,
    or built in <dir>), regime b's random init; regime b's held-out subset."""
    from relayrl.data.toy import write_toy_task

    regime, work = regime_of(args), work_dir(args)
    paths = write_toy_task(Path(args.dir) / "data", seed=0)
    if not regime.warm_start:
        init = build_random_model(paths["sft"], work / "model")
    elif getattr(args, "warmstart", None):
        init = Path(args.warmstart)
    elif all((DEMO_WARMSTART / name).is_file() for name in ("config.json", "model.safetensors")):
        init = DEMO_WARMSTART
    else:
        init = build_warmstart(paths["sft"], Path(args.dir) / "warmstart")
    if regime.eval_prompts:
        paths["eval"] = first_rows(paths["eval"], work / f"eval_{regime.eval_prompts}.jsonl", regime.eval_prompts)
    print(f"initial model: {init}")
    return {**paths, "init": init}


def build_warmstart(sft: Path, warm: Path) -> Path:
    """The demo's supervised warm start, cached in `warm` and rebuilt when sft.jsonl has changed."""
    from relayrl.demo import DEMO_SFT_EPOCHS
    from relayrl.sft import SFTSettings, run_sft

    stamp, digest = warm / "bench_sft_sha256.txt", hashlib.sha256(sft.read_bytes()).hexdigest()
    if (warm / "model.safetensors").is_file() and stamp.is_file() and stamp.read_text() == digest:
        return warm
    print(f"building the warm start in {warm} (supervised, 1-3 min)")
    run_sft(sft, warm, init="tiny", settings=SFTSettings(epochs=DEMO_SFT_EPOCHS, batch_size=128))
    stamp.write_text(digest)
    return warm


def build_random_model(sft: Path, out: Path) -> Path:
    """Regime b's model: a random-init MODEL_B Llama with a character tokenizer over the task's texts, cached."""
    if not all((out / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json")):
        from relayrl.models.tiny import build_tiny

        texts = [row["prompt"] + row["completion"] for row in map(json.loads, sft.read_text().splitlines())]
        model, _ = build_tiny(texts, out, seed=0, **MODEL_B)
        print(f"built a random-init model in {out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params")
    return out


def first_rows(source: Path, target: Path, count: int) -> Path:
    """The first `count` rows of a .jsonl file, written to `target` (rewritten only when they changed)."""
    text = "".join(source.read_text().splitlines(keepends=True)[:count])
    if not target.is_file() or target.read_text() != text:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return target


def build_config(args: argparse.Namespace, paths: dict[str, Path], run_dir: Path) -> tuple[object, list[str]]:
    """The demo config with the benchmark's settings (one optimizer step per rollout batch), and the
    `relayrl train` command that runs it: the tree as <run_dir>/bench_config.yaml plus the overrides."""
    import yaml

    from relayrl.config import load_config, read_yaml

    regime = regime_of(args)
    tree = read_yaml(resources.files("relayrl") / "configs" / "demo.yaml")
    tree.update(model={"path": str(paths["init"])},
                data={**tree.get("data", {}), "train": str(paths["train"]), "eval": str(paths["eval"])},
                log={"dir": str(run_dir), "progress": False},
                reward={**tree.get("reward", {}), "fn": regime.reward})
    batch = args.prompts_per_step * args.n
    overrides = [f"train.steps={args.steps}", f"rollout.prompts_per_step={args.prompts_per_step}",
                 f"rollout.n={args.n}", f"rollout.max_tokens={args.max_tokens}", f"train.lr={args.lr}",
                 f"train.mini_batch={batch}", f"train.micro_batch={batch}"]
    if getattr(args, "min_tokens", 0):
        overrides.append(f"rollout.min_tokens={args.min_tokens}")
    config = load_config(None, overrides, base=tree)  # validates here, before anything runs
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "bench_config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    return config, [sys.executable, "-m", "relayrl.cli", "train", str(run_dir / "bench_config.yaml"), *overrides]


def run_logged(command: list[str], log_path: Path) -> str:
    """Run a subprocess (same working directory), its output in `log_path`; return stdout's last line."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=log, text=True)
        log.write("\n--- stdout ---\n" + proc.stdout)
    if proc.returncode:
        tail = "\n".join(line[:300] for line in log_path.read_text().splitlines()[-30:])
        raise RuntimeError(f"{' '.join(command)} failed with status {proc.returncode}; see {log_path}:\n{tail}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def held_out_score(model_dir: Path, args: argparse.Namespace, eval_path: Path, log_path: Path) -> dict:
    """The regime's held-out greedy score of a saved model, in its own process: `relayrl eval` (vLLM) when
    completions end at EOS; else `evaluate_fixed_length` (relayrl's engine with the regime's length floor).
    Returns {"score", "sampled", "length_mean"} (the last two None from `relayrl eval`)."""
    regime = regime_of(args)
    if not args.min_tokens:
        command = [sys.executable, "-m", "relayrl.cli", "eval", "--model", str(model_dir), "--data", str(eval_path),
                   "--reward", regime.reward, "--max-tokens", str(args.max_tokens), "--temperature", "0"]
        score = float(json.loads(run_logged(command, log_path))["reward_mean"])
        return {"score": score, "sampled": None, "length_mean": None}
    entry = "import sys; sys.path.insert(0, sys.argv[1]); import peer_trl; peer_trl.fixed_length_entry(sys.argv[2:])"
    command = [sys.executable, "-c", entry, str(BENCH), str(model_dir), str(eval_path), regime.reward,
               str(args.max_tokens), str(args.min_tokens)]
    result = json.loads(run_logged(command, log_path))
    check_length(f"held-out eval of {model_dir}", result["length_mean"], args.min_tokens, args.max_tokens)
    return {"score": result["reward_mean"], "sampled": result["sampled_mean"], "length_mean": result["length_mean"]}


def evaluate_fixed_length(model: str, data: str, reward: str, max_tokens: int, min_tokens: int) -> dict:
    """`relayrl eval`'s greedy path (vLLM engine, relayrl's prompt loading and reward scoring, a failing sample
    scored 0) with `min_tokens`, which `relayrl eval` does not take; also the mean completion length and the
    mean reward of one sample per prompt at temperature 1 (continuous where the greedy score saturates)."""
    from relayrl.data.source import load_prompts
    from relayrl.models.loading import context_length, load_tokenizer
    from relayrl.rewards import load_reward, score_rollouts
    from relayrl.rollout.base import Sampling, build_engine

    limit = context_length(model) or 10**9
    prompts, _ = load_prompts(data, load_tokenizer(model), max_prompt_tokens=max(1, limit - max_tokens))
    engine = build_engine("vllm", model, max(len(p.token_ids) for p in prompts) + max_tokens, seed=0)
    fn = load_reward(reward)

    def run(temperature: float) -> tuple[float, float]:
        sampling = Sampling(n=1, temperature=temperature, max_tokens=max_tokens, min_tokens=min_tokens, seed=0)
        rollouts = engine.generate(prompts, sampling, 0)
        scores, _ = score_rollouts(fn, rollouts, on_error="zero")
        return (sum(s.reward for s in scores if s is not None) / len(scores),
                statistics.mean(len(r.response_ids) for r in rollouts))

    (greedy, length), (sampled, _) = run(0.0), run(1.0)
    return {"reward_mean": greedy, "sampled_mean": sampled, "n": len(prompts), "length_mean": length}


def fixed_length_entry(argv: list[str]) -> None:
    """Subprocess entry of `held_out_score`: MODEL DATA REWARD MAX_TOKENS MIN_TOKENS -> one JSON line."""
    model, data, reward, max_tokens, min_tokens = argv
    print(json.dumps(evaluate_fixed_length(model, data, reward, int(max_tokens), int(min_tokens))))


def check_length(who: str, length_mean: float, min_tokens: int, max_tokens: int) -> None:
    """Fail loudly when a fixed-length regime's completions are not that long (min_tokens == max_tokens)."""
    if min_tokens == max_tokens and abs(length_mean - min_tokens) > LENGTH_TOLERANCE:
        raise RuntimeError(f"{who}: mean completion length {length_mean:.2f} tokens, expected {min_tokens} "
                           f"(+-{LENGTH_TOLERANCE:g}): the length floor is not applied; the timings would not compare")


def summarize(step_times: list[float], tokens: list[float], rewards: list[float], batch: int) -> dict:
    """Per-step numbers of one framework's run; `tokens` = completion tokens per step, `batch` completions."""
    return {
        "per_step": {"time_s": step_times, "completion_tokens": tokens, "train_reward": rewards},
        "steps": len(step_times),
        "median_step_s": statistics.median(step_times),
        "min_step_s": min(step_times),  # least disturbed step: a guide when the CPUs are shared
        "first_step_s": step_times[0],
        "tokens_per_s": statistics.median(t / s for t, s in zip(tokens, step_times)),
        "completion_tokens_per_step": statistics.mean(tokens),
        "completion_length_mean": statistics.mean(tokens) / batch,
    }


# ---------------------------------------------------------------------------- relayrl


def run_relayrl(config, command: list[str], run_dir: Path) -> dict:
    """`relayrl train` in a subprocess; per-step numbers from its metrics.jsonl."""
    start = time.perf_counter()
    result = json.loads(run_logged(command, run_dir / "train.log"))
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    times = [row["time/step"] for row in rows]
    tokens = [row["response/length_mean"] * config.rollout_batch for row in rows]
    rewards = [row["reward/mean"] for row in rows]
    return {**summarize(times, tokens, rewards, config.rollout_batch), "wall_s": wall, "own_eval": result,
            "generate_median_s": statistics.median(row["time/generate"] for row in rows),
            "phase_median_s": phase_medians(rows), "run_dir": str(run_dir)}


def phase_medians(rows: list[dict]) -> dict[str, float]:
    phases = sorted({key for row in rows for key in row if key.startswith("time/") and key != "time/step"})
    return {key.split("/", 1)[1]: statistics.median(row[key] for row in rows) for key in phases}


# ---------------------------------------------------------------------------- TRL


def trl_arguments(config, out_dir: Path):
    """GRPOConfig doing relayrl's step: one generation batch of prompts_per_step * n, one optimizer step."""
    from trl import GRPOConfig

    r, a, t = config.rollout, config.algorithm, config.train
    args = GRPOConfig(
        output_dir=str(out_dir), use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        max_steps=t.steps, seed=t.seed, learning_rate=t.lr, weight_decay=t.weight_decay,
        adam_beta1=t.betas[0], adam_beta2=t.betas[1], max_grad_norm=t.grad_clip, warmup_steps=t.warmup_steps,
        num_generations=r.n, per_device_train_batch_size=config.rollout_batch, gradient_accumulation_steps=1,
        steps_per_generation=1, num_iterations=t.epochs, max_completion_length=r.max_tokens,
        temperature=r.temperature, top_p=r.top_p, top_k=max(r.top_k, 0),
        beta=a.kl.coef, epsilon=a.clip_eps, loss_type="dapo", scale_rewards="group" if a.std_normalize else "none",
        use_vllm=False, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
        shuffle_dataset=config.data.shuffle, dataloader_num_workers=0,
        generation_kwargs={"min_new_tokens": r.min_tokens} if r.min_tokens else None,
    )
    assert args.generation_batch_size == config.rollout_batch and args.steps_per_generation == 1
    return args


def make_clock():
    """A TrainerCallback timing each optimizer step and keeping each step's logged metrics."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []
            self.logs: list[dict] = []
            self._start = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self._start)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                self.logs.append(dict(logs))

    return StepClock()


def recording_reward(spec: str, samples: list):
    """The run's reward function as relayrl loads it (`reward.fn`), unchanged, also keeping the first batch's
    (prompt, completion, answer) triples."""
    import functools

    from relayrl.rewards import load_reward

    fn = load_reward(spec)

    @functools.wraps(fn)
    def reward(prompts, completions, **columns):
        if not samples:
            samples.extend(zip(prompts, completions, columns["answer"]))
        return fn(prompts, completions, **columns)

    return reward


def time_generate(model, seconds: list[float]) -> None:
    """Record the wall time of each `model.generate` call (TRL's rollout phase) on this model instance."""
    original = model.generate

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - start)

    model.generate = timed


def run_trl(config, out_dir: Path) -> tuple[dict, list[tuple[str, str, str]]]:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import GRPOTrainer

    from relayrl.learner.optim import build_optimizer, build_scheduler

    t = config.train
    torch.manual_seed(t.seed)
    model = AutoModelForCausalLM.from_pretrained(config.model.path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(config.model.path)
    rows = [json.loads(line) for line in Path(config.data.train).read_text().splitlines() if line.strip()]
    optimizer = build_optimizer(model, t.lr, t.weight_decay, t.betas)
    scheduler = build_scheduler(optimizer, t.steps, t.warmup_steps, t.lr_schedule, t.min_lr_ratio)
    clock, samples, generate_s = make_clock(), [], []
    time_generate(model, generate_s)
    trainer = GRPOTrainer(model=model, reward_funcs=recording_reward(config.reward.fn, samples),
                          args=trl_arguments(config, out_dir),
                          train_dataset=datasets.Dataset.from_list(rows), processing_class=tokenizer,
                          callbacks=[clock], optimizers=(optimizer, scheduler))
    trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    trainer.save_model(str(out_dir / "model"))
    tokens = [log["completions/mean_length"] * config.rollout_batch for log in clock.logs]
    rewards = [log["reward"] for log in clock.logs]
    stats = {**summarize(clock.times, tokens, rewards, config.rollout_batch), "wall_s": wall,
             "generate_median_s": statistics.median(generate_s),
             "trl_step_time_median_s": statistics.median(log["step_time"] for log in clock.logs if "step_time" in log)}
    return stats, samples


# relayrl settings the TRL side is configured for; any other value is reported as not mirrored
MIRRORED_AS = {"algorithm.advantage": "grpo", "algorithm.policy_loss": "ppo_clip", "algorithm.loss_agg": "token_mean",
               "algorithm.entropy_coef": 0.0, "algorithm.clip_eps_low": None, "algorithm.clip_eps_high": None,
               "algorithm.dual_clip_c": None, "algorithm.correction.mode": "none",
               "algorithm.dapo.dynamic_sampling": False, "algorithm.dapo.overlong_filter": False, "rollout.stop": []}


def unmirrored(config) -> list[str]:
    notes = []
    for key, expected in MIRRORED_AS.items():
        value = config
        for part in key.split("."):
            value = getattr(value, part, expected)  # a key this relayrl version lacks is at its old behaviour
        if value != expected:
            notes.append(f"relayrl {key}={value!r} is not mirrored on the TRL side (it runs as if {expected!r})")
    return notes


def trl_differences(config, rows_path: Path, regime: Regime) -> list[str]:
    """Check the inputs TRL will see against relayrl's; list what cannot be made identical (and, for a regime
    without a warm start, what the benchmark simplifies)."""
    from transformers import AutoTokenizer
    from trl.data_utils import is_conversational

    tokenizer = AutoTokenizer.from_pretrained(config.model.path)
    first = json.loads(rows_path.read_text().splitlines()[0])
    if is_conversational(first):
        raise RuntimeError("TRL would apply a chat template to these prompts; the benchmark expects plain strings")
    notes = [
        "generation: TRL uses transformers generate (use_vllm=False); relayrl uses vLLM + a weight sync per step",
        "advantages: TRL divides by (group std + 1e-4), relayrl by (group std + 1e-6)",
        "prompt order and sampling RNG differ (TRL RepeatSampler vs relayrl PromptSampler, both seed "
        f"{config.train.seed}): different prompts/completions per step",
        f"data.max_prompt_tokens={config.data.max_prompt_tokens}: no TRL equivalent (no prompt here is that long)",
    ]
    notes += unmirrored(config) + regime_notes(config, regime)
    trl_ids = tokenizer(text=[first["prompt"]])["input_ids"][0]
    ours = tokenizer(first["prompt"], add_special_tokens=False)["input_ids"]
    if trl_ids != ours:
        notes.append(f"prompt tokens differ: TRL {trl_ids} vs relayrl {ours} (special tokens added by TRL)")
    return notes


def regime_notes(config, regime: Regime) -> list[str]:
    """The regime's own simplifications, printed with the differences."""
    if regime.warm_start:
        return []
    notes = [f"model: randomly initialised ({config.model.path}), no warm start: supervised training of a model "
             "this size would take longer than the benchmark on this machine",
             f"reward: {regime.reward} on both sides (exact match is always 0 for a random model at this length)",
             f"held-out score: {regime.held_out}, one benchmark-side evaluator (relayrl's vLLM engine with "
             "min_tokens; `relayrl eval` has no length floor) for the initial and both final models"]
    if config.rollout.min_tokens:
        notes.append(f"length: end-of-sequence suppressed before {config.rollout.min_tokens} tokens on both sides "
                     "(vLLM min_tokens / HF min_new_tokens); each side's mean length is checked")
    return notes


# ---------------------------------------------------------------------------- report


def check_samples(samples: list[tuple[str, str, str]], regime: Regime) -> None:
    """Show TRL's decoded completions as the reward sees them; regime a's must be bare answers (digits; no
    '</s>', no prompt echo)."""
    shown = ", ".join(f"{p!r}->{c[:40]!r} (answer {a})" for p, c, a in samples[:4])
    print(f"TRL completions as the reward sees them: {shown}")
    if regime.reward != "exact_match":
        return
    digits = sum(c.strip().isdigit() for _, c, _ in samples) / max(len(samples), 1)
    if digits < 0.5:
        print(f"WARNING: only {digits:.0%} of TRL's first-batch completions are digit strings")


def table(rows: dict[str, dict], ratio: float, held_out: str = "") -> str:
    header = (f"{'framework':<10} {'median step (s)':>16} {'min step':>9} {'median generate':>18} {'tokens/s':>9} "
              f"{'mean len':>9} {'held-out before':>16} {'held-out after':>15}")
    lines = [header, "-" * len(header)]
    for name, row in rows.items():
        lines.append(f"{name:<10} {row['median_step_s']:>16.3f} {row['min_step_s']:>9.3f} "
                     f"{row['generate_median_s']:>18.3f} {row['tokens_per_s']:>9.0f} "
                     f"{row['completion_length_mean']:>9.1f} "
                     f"{row['greedy_before']:>16.3f} {row['greedy_after']:>15.3f}")
    lines.append(f"step time relayrl/TRL: {ratio:.2f}x" + (f"   held-out = {held_out}" if held_out else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    regime = regime_of(args)
    start, busy_start = time.perf_counter(), cpu_busy()
    if busy_start > 0.1:
        print(f"WARNING: the CPUs were {busy_start:.0%} busy before the start: timings will be noisy")
    cpu_start = cpu_sample()
    work = work_dir(args)
    paths = prepare_inputs(args)
    config, relayrl_command = build_config(args, paths, work / "relayrl")
    differences = trl_differences(config, paths["train"], regime)
    print(f"regime {regime.name}; settings: " + json.dumps(settings_of(config)))
    print("TRL differs from relayrl in:\n  - " + "\n  - ".join(differences))
    walls: dict[str, float] = {}
    with stopwatch(walls, "eval_before"):
        before = held_out_score(paths["init"], args, paths["eval"], work / "logs" / "eval_before.log")
    print("training with relayrl (subprocess)...")
    relay = run_relayrl(config, relayrl_command, work / "relayrl")
    walls["relayrl_train"] = relay["wall_s"]
    check_length("relayrl training", relay["completion_length_mean"], args.min_tokens, args.max_tokens)
    print(f"  done: median step {relay['median_step_s']:.3f}s, wall {relay['wall_s']:.0f}s")
    print("training with TRL GRPOTrainer (this process)...")
    trl_stats, samples = run_trl(config, work / "trl")
    walls["trl_train"] = trl_stats["wall_s"]
    print(f"  done: median step {trl_stats['median_step_s']:.3f}s, wall {trl_stats['wall_s']:.0f}s")
    check_samples(samples, regime)
    check_length("TRL training", trl_stats["completion_length_mean"], args.min_tokens, args.max_tokens)
    rows = {"relayrl": relay, "TRL": trl_stats}
    for name, stats in rows.items():
        with stopwatch(walls, f"eval_{name}"):
            after = held_out_score(work / name.lower() / "model", args, paths["eval"],
                                   work / "logs" / f"eval_{name}.log")
        stats.update(greedy_before=before["score"], greedy_after=after["score"], eval_length_mean=after["length_mean"],
                     sampled_before=before["sampled"], sampled_after=after["sampled"])
    ratio = relay["median_step_s"] / trl_stats["median_step_s"]
    print("\n" + table(rows, ratio, regime.held_out))
    if before["sampled"] is not None:
        print(f"held-out sampled (temperature 1, one per prompt): initial {before['sampled']:.3f}, "
              + ", ".join(f"{name} {stats['sampled_after']:.3f}" for name, stats in rows.items()))
    print("wall times (s): " + "  ".join(f"{name} {seconds:.0f}" for name, seconds in walls.items()))
    others = others_share(cpu_start, cpu_sample())
    if others > 0.05:
        print(f"WARNING: other processes used {others:.0%} of the CPUs during the run: step times are inflated")
    report = {"regime": regime.name, "held_out": regime.held_out, "settings": settings_of(config), "rows": rows,
              "step_time_ratio_relayrl_over_trl": ratio, "trl_differences": differences,
              "init_model": str(paths["init"]),
              "wall_s": time.perf_counter() - start, "phase_wall_s": walls,
              "cpu_busy_before_start": busy_start, "cpu_share_of_other_processes_during_run": others}
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


def cpu_sample() -> tuple[float, float, float]:
    """(machine CPU-seconds, of which busy, CPU-seconds used by this process and its finished children)."""
    fields = [int(x) / os.sysconf("SC_CLK_TCK") for x in Path("/proc/stat").read_text().split()[1:11]]
    own = os.times()
    return sum(fields), sum(fields) - fields[3] - fields[4], own.user + own.system + own.children_user + \
        own.children_system


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


def settings_of(config) -> dict:
    r, t = config.rollout, config.train
    return {"steps": t.steps, "prompts_per_step": r.prompts_per_step, "n": r.n, "max_tokens": r.max_tokens,
            "min_tokens": getattr(r, "min_tokens", 0), "reward": config.reward.fn, "lr": t.lr,
            "warmup_steps": t.warmup_steps, "temperature": r.temperature, "model": config.model.path,
            "torch_threads": _threads()}


def _threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    main()
