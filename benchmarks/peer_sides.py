"""peer_trl.py's two sides: one relayrl run, one TRL `GRPOTrainer` run, one held-out evaluation, and their numbers.

Owns: running `relayrl train` in a subprocess and reading its metrics.jsonl (`run_relayrl`), running TRL in
this process with the same settings (`run_trl`, `trl_arguments`), the per-step summary both return
(`summarize`), the held-out score of a saved model (`held_out_score`, `relayrl eval` in a subprocess), and
the checks and listed differences between the two sides (`trl_differences`, `check_length`,
`check_samples`). What a regime builds is peer_regimes.py's; seeds, the table and the JSON are peer_trl.py's.

How TRL is configured to do the same work per step (TRL 1.16 semantics):
    per_device_train_batch_size = prompts_per_step * n      (= relayrl train.micro_batch: one forward/backward)
    gradient_accumulation_steps = 1, steps_per_generation = 1
      -> generation_batch_size = prompts_per_step * n = prompts_per_step groups of num_generations = n
      -> one TRL "global step" = one generation batch = one optimizer step (relayrl: mini_batch = rollout batch)
    num_iterations = 1 (relayrl train.epochs = 1); since the generation and the optimizer step are aligned,
      neither side runs a separate old-log-prob pass (the ratio is exp(logp - logp.detach()))
    loss_type = "dapo": sum of per-token losses / active tokens in the batch (relayrl loss_agg = token_mean)
    scale_rewards = "group" (relayrl std_normalize), beta = 0 (relayrl kl.coef = 0: no reference model),
    epsilon = clip_eps, max_grad_norm = grad_clip, temperature/top_p/top_k, max_completion_length = max_tokens,
    seed = train.seed
    generation_kwargs = {"min_new_tokens": min_tokens} when rollout.min_tokens > 0 (regime b)
    optimizer + schedule: relayrl's own AdamW and warmup/constant LambdaLR, handed to TRL through
      `optimizers=`, because HF's `constant_with_warmup` starts at lr 0 where relayrl starts at lr/warmup.

Known differences (also printed at run time):
* TRL generates with transformers `generate` (use_vllm=False); relayrl generates with vLLM and copies the
  weights into it after every update (`--engine hf`: relayrl also uses transformers `generate`, its HF engine).
* Prompt order and sampling random streams differ, so the two runs see different prompts and completions
  (same data, same seed value).
* TRL divides group-centred rewards by (std + 1e-4), relayrl by (std + 1e-6).
* relayrl settings with no TRL counterpart here (other policy losses, loss aggregations, entropy bonus,
  rollout correction, DAPO options) must be at their defaults; otherwise they are listed as not mirrored.
* relayrl trains in a subprocess (`relayrl train`), TRL in peer_trl.py's process; each evaluation is its
  own subprocess, so no two vLLM engines ever share a process.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

from peer_regimes import Regime, regime_notes, regime_of

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# TRL imports vLLM at import time and warns about its version; TRL's vLLM path is not used here.
warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions")

LENGTH_TOLERANCE = 1.0  # tokens: a fixed-length regime fails when a side's mean completion length is further off


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


def eval_command(model_dir: Path, args: argparse.Namespace, eval_path: Path, temperature: float) -> list[str]:
    """`relayrl eval` of one model at one temperature with the regime's lengths and held-out prompt count."""
    regime = regime_of(args)
    command = [sys.executable, "-m", "relayrl.cli", "eval", str(model_dir), str(eval_path)]
    command += [f"reward.fn={regime.reward}", "rollout.engine=vllm", f"rollout.max_tokens={args.max_tokens}"]
    if temperature:  # greedy unless eval.temperature is given
        command += [f"eval.temperature={temperature:g}"]
    if args.min_tokens:
        command += [f"rollout.min_tokens={args.min_tokens}"]
    if regime.eval_prompts:
        command += [f"eval.max_prompts={regime.eval_prompts}"]
    return command


def held_out_score(model_dir: Path, args: argparse.Namespace, eval_path: Path, log_path: Path) -> dict:
    """The regime's held-out score of a saved model, each temperature in its own `relayrl eval` process (vLLM,
    seed 0, a failing sample scored 0): {"score": greedy mean, "sampled": temperature-1 mean of one sample per
    prompt, or None when the regime does not ask for it}."""
    score = float(json.loads(run_logged(eval_command(model_dir, args, eval_path, 0.0), log_path))["reward_mean"])
    sampled = None
    if regime_of(args).sampled_eval:
        sampled_log = log_path.with_name(log_path.stem + "_sampled" + log_path.suffix)
        sampled = float(
            json.loads(run_logged(eval_command(model_dir, args, eval_path, 1.0), sampled_log))["reward_mean"]
        )
    return {"score": score, "sampled": sampled}


def check_length(who: str, length_mean: float, min_tokens: int, max_tokens: int) -> None:
    """Fail loudly when a fixed-length regime's completions are not that long (min_tokens == max_tokens)."""
    if min_tokens == max_tokens and abs(length_mean - min_tokens) > LENGTH_TOLERANCE:
        raise RuntimeError(
            f"{who}: mean completion length {length_mean:.2f} tokens, expected {min_tokens} "
            f"(+-{LENGTH_TOLERANCE:g}): the length floor is not applied; the timings would not compare"
        )


def summarize(
    step_times: list[float], tokens: list[float], rewards: list[float], generate_s: list[float], batch: int
) -> dict:
    """Per-step numbers of one framework's run(s); `tokens` = completion tokens per step, `batch` completions
    per step, `generate_s` the rollout phase's times (one per step for relayrl, one per call for TRL)."""
    return {
        "per_step": {
            "time_s": step_times,
            "completion_tokens": tokens,
            "train_reward": rewards,
            "generate_s": generate_s,
        },
        "steps": len(step_times),
        "median_step_s": statistics.median(step_times),
        "min_step_s": min(step_times),  # least disturbed step: a guide when the CPUs are shared
        "first_step_s": step_times[0],
        "generate_median_s": statistics.median(generate_s),
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
    return {**relayrl_summary(config, rows, wall, run_dir), "own_eval": result}


def relayrl_summary(config, rows: list[dict], wall: float, run_dir: Path) -> dict:
    """One relayrl run's figures from its per-step metrics rows (metrics.jsonl's, or `Trainer.step`'s)."""
    times = [row["time/step"] for row in rows]
    tokens = [row["response/length_mean"] * config.rollout_batch for row in rows]
    rewards = [row["reward/mean"] for row in rows]
    generate = [row["time/generate"] for row in rows]
    return {
        **summarize(times, tokens, rewards, generate, config.rollout_batch),
        "wall_s": wall,
        "phase_median_s": phase_medians(rows),
        "run_dir": str(run_dir),
    }


def phase_medians(rows: list[dict]) -> dict[str, float]:
    phases = sorted({key for row in rows for key in row if key.startswith("time/") and key != "time/step"})
    return {key.split("/", 1)[1]: statistics.median(row[key] for row in rows) for key in phases}


# ---------------------------------------------------------------------------- TRL


def trl_arguments(config, out_dir: Path):
    """GRPOConfig doing relayrl's step: one generation batch of prompts_per_step * n, one optimizer step."""
    from trl import GRPOConfig

    r, a, t = config.rollout, config.algorithm, config.train
    args = GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        max_steps=t.steps,
        seed=t.seed,
        learning_rate=t.lr,
        weight_decay=t.weight_decay,
        adam_beta1=t.betas[0],
        adam_beta2=t.betas[1],
        max_grad_norm=t.grad_clip,
        warmup_steps=t.warmup_steps,
        num_generations=r.n,
        per_device_train_batch_size=config.rollout_batch,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=t.epochs,
        max_completion_length=r.max_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=max(r.top_k, 0),
        beta=a.kl.coef,
        epsilon=a.clip_eps,
        loss_type="dapo",
        scale_rewards="group" if a.std_normalize else "none",
        use_vllm=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        shuffle_dataset=config.data.shuffle,
        dataloader_num_workers=0,
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


def run_trl(config, out_dir: Path, extra_callbacks: tuple = ()) -> tuple[dict, list[tuple[str, str, str]]]:
    """TRL GRPOTrainer with `config`'s settings (its seed included) in this process; the model in <out_dir>/model.
    `extra_callbacks` run after the step clock's (peer_interleave.py steps relayrl there)."""
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
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=recording_reward(config.reward.fn, samples),
        args=trl_arguments(config, out_dir),
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[clock, *extra_callbacks],
        optimizers=(optimizer, scheduler),
    )
    trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    trainer.save_model(str(out_dir / "model"))
    tokens = [log["completions/mean_length"] * config.rollout_batch for log in clock.logs]
    rewards = [log["reward"] for log in clock.logs]
    stats = {
        **summarize(clock.times, tokens, rewards, generate_s, config.rollout_batch),
        "wall_s": wall,
        "trl_step_time_median_s": statistics.median(log["step_time"] for log in clock.logs if "step_time" in log),
    }
    return stats, samples


# ---------------------------------------------------------------------------- what differs


# relayrl settings the TRL side is configured for; any other value is reported as not mirrored
MIRRORED_AS = {
    "algorithm.advantage": "grpo",
    "algorithm.policy_loss": "ppo_clip",
    "algorithm.loss_agg": "token_mean",
    "algorithm.entropy_coef": 0.0,
    "algorithm.clip_eps_low": None,
    "algorithm.clip_eps_high": None,
    "algorithm.dual_clip_c": None,
    "algorithm.correction.mode": "none",
    "algorithm.dapo.dynamic_sampling": False,
    "algorithm.dapo.overlong_filter": False,
    "rollout.stop": [],
}


def unmirrored(config) -> list[str]:
    notes = []
    for key, expected in MIRRORED_AS.items():
        value = config
        for part in key.split("."):
            value = getattr(value, part, expected)  # a key this relayrl version lacks is at its old behaviour
        if value != expected:
            notes.append(f"relayrl {key}={value!r} is not mirrored on the TRL side (it runs as if {expected!r})")
    return notes


def generation_note(engine: str) -> str:
    if engine == "hf":
        return (
            "generation: both sides sample with transformers (TRL generate, use_vllm=False; relayrl rollout.engine=hf: "
            "generate's loop written out, the same draws, with an in-process weight copy per step)"
        )
    return "generation: TRL uses transformers generate (use_vllm=False); relayrl uses vLLM + a weight sync per step"


def trl_differences(config, rows_path: Path, regime: Regime, args: argparse.Namespace) -> list[str]:
    """Check the inputs TRL will see against relayrl's; list what cannot be made identical (and, for a regime
    without a warm start, what the benchmark simplifies)."""
    from transformers import AutoTokenizer
    from trl.data_utils import is_conversational

    tokenizer = AutoTokenizer.from_pretrained(config.model.path)
    first = json.loads(rows_path.read_text().splitlines()[0])
    if is_conversational(first):
        raise RuntimeError("TRL would apply a chat template to these prompts; the benchmark expects plain strings")
    notes = [
        generation_note(config.rollout.engine),  # `auto` is resolved by now
        "advantages: TRL divides by (group std + 1e-4), relayrl by (group std + 1e-6)",
        "prompt order and sampling RNG differ (TRL RepeatSampler vs relayrl PromptSampler, same seed value per "
        "run): different prompts/completions per step",
        f"data.max_prompt_tokens={config.data.max_prompt_tokens}: no TRL equivalent (no prompt here is that long)",
    ]
    notes += unmirrored(config) + regime_notes(config, regime)
    trl_ids = tokenizer(text=[first["prompt"]])["input_ids"][0]
    ours = tokenizer(first["prompt"], add_special_tokens=False)["input_ids"]
    if trl_ids != ours:
        notes.append(f"prompt tokens differ: TRL {trl_ids} vs relayrl {ours} (special tokens added by TRL)")
    return notes


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
