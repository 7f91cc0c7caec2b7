"""peer_trl.py's regimes: what each one builds (model, data, reward, held-out score) and the relayrl config.

Owns: the `Regime` settings (`REGIMES`), the inputs (`prepare_inputs`: toy data, regime a's warm start,
regime b's random-init model, regime b's held-out subset), where a regime's runs go (`work_dir`), the
relayrl config and `relayrl train` command of one run (`build_config`), the regime's printed
simplifications (`regime_notes`) and the settings recorded in the JSON (`settings_of`). Running the
frameworks is peer_sides.py's; the command line, seeds and report are peer_trl.py's.

Both regimes use the demo task's data (two-number addition prompts) and `relayrl/configs/demo.yaml` with the
regime's settings (each overridable on peer_trl.py's command line):

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
               held-out prompts, 128 tokens (`relayrl eval MODEL DATA rollout.min_tokens=128 eval.max_prompts=64`), plus the
               temperature-1 mean of one sample per prompt, which keeps moving where the greedy one saturates.
  c            small batch (issue 18): regime a's warm start and score, 30 steps x 8 prompts x n=8, completions
               of at most 8 tokens; fixed per-step costs dominate. Its runs default to relayrl's own default
               engine, `rollout.engine=auto` (`--engine auto`), which is what a new user's config gets.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

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
    sampled_eval: bool  # also score one temperature-1 sample per held-out prompt
    warm_start: bool  # False: a random init of MODEL_B
    held_out: str  # what the held-out number is, for the table and the JSON
    engine: str = "vllm"  # relayrl's rollout.engine unless --engine says otherwise


REGIMES = {
    "a": Regime(
        "a",
        steps=20,
        quick_steps=3,
        prompts_per_step=32,
        n=8,
        max_tokens=6,
        min_tokens=0,
        lr=1e-4,
        reward="exact_match",
        eval_prompts=0,
        sampled_eval=False,
        warm_start=True,
        held_out="greedy exact match on the 500 held-out problems",
    ),
    "c": Regime(
        "c",
        steps=30,
        quick_steps=3,
        prompts_per_step=8,
        n=8,
        max_tokens=8,
        min_tokens=0,
        lr=1e-4,
        reward="exact_match",
        eval_prompts=0,
        sampled_eval=False,
        warm_start=True,
        held_out="greedy exact match on the 500 held-out problems",
        engine="auto",
    ),
    "b": Regime(
        "b",
        steps=8,
        quick_steps=2,
        prompts_per_step=8,
        n=4,
        max_tokens=128,
        min_tokens=128,
        lr=1e-4,
        reward=f"{BENCH / 'rewards.py'}:digit_fraction",
        eval_prompts=64,
        sampled_eval=True,
        warm_start=False,
        held_out="greedy digit_fraction on the first 64 held-out prompts, 128 tokens",
    ),
}
MODEL_B = dict(hidden=512, layers=8, heads=8, intermediate=1536)  # ~27M parameters with the task's vocabulary


def regime_of(args: argparse.Namespace) -> Regime:
    """The regime of a namespace; callers with their own arguments (phases.py, schedules.py) get regime a."""
    return REGIMES[getattr(args, "regime", "a")]


def engine_of(args: argparse.Namespace) -> str:
    """relayrl's rollout engine of a namespace (--engine, else the regime's; `auto`: relayrl decides)."""
    return getattr(args, "engine", None) or regime_of(args).engine


def regime_dir(args: argparse.Namespace) -> Path:
    """A regime's inputs (regime b's model and held-out subset): <dir> for regime a, <dir>/regime_b."""
    regime = regime_of(args)
    return Path(args.dir) if regime.name == "a" else Path(args.dir) / f"regime_{regime.name}"


def work_dir(args: argparse.Namespace) -> Path:
    """Where a regime's runs and logs go: its regime_dir, or <regime_dir>/engine_hf when relayrl runs the HF
    engine (so a vLLM run and an HF run of the same regime never share a directory)."""
    engine = engine_of(args)
    return regime_dir(args) if engine == "vllm" else regime_dir(args) / f"engine_{engine}"


# ---------------------------------------------------------------------------- inputs


def prepare_inputs(args: argparse.Namespace) -> dict[str, Path]:
    """Toy data in <dir>/data; the initial model ("init"): regime a's warm start (--warmstart, the demo's cache,
    or built in <dir>), regime b's random init; regime b's held-out subset ("eval", used by relayrl's own
    before/after evaluation; "eval_full" is the whole file)."""
    from relayrl.data.toy import write_toy_task

    regime, inputs = regime_of(args), regime_dir(args)
    paths = write_toy_task(Path(args.dir) / "data", seed=0)
    if not regime.warm_start:
        init = build_random_model(paths["sft"], inputs / "model")
    elif getattr(args, "warmstart", None):
        init = Path(args.warmstart)
    elif all((DEMO_WARMSTART / name).is_file() for name in ("config.json", "model.safetensors")):
        init = DEMO_WARMSTART
    else:
        init = build_warmstart(paths["sft"], Path(args.dir) / "warmstart")
    paths["eval_full"] = paths["eval"]
    if regime.eval_prompts:
        paths["eval"] = first_rows(paths["eval"], inputs / f"eval_{regime.eval_prompts}.jsonl", regime.eval_prompts)
    print(f"initial model: {init}")
    return {**paths, "init": init}


def build_warmstart(sft: Path, warm: Path) -> Path:
    """The demo's supervised warm start, cached in `warm` and rebuilt when sft.jsonl has changed."""
    from relayrl.commands.demo import DEMO_SFT_EPOCHS
    from relayrl.learner.sft import SFTSettings, run_sft

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


# ---------------------------------------------------------------------------- relayrl config


def config_overrides(args: argparse.Namespace, seed: int = 0) -> list[str]:
    """`relayrl train` overrides of one run: the benchmark's sizes (one optimizer step per rollout batch), the
    length floor, the seed and the rollout engine."""
    batch = args.prompts_per_step * args.n
    overrides = [
        f"train.steps={args.steps}",
        f"rollout.prompts_per_step={args.prompts_per_step}",
        f"rollout.n={args.n}",
        f"rollout.max_tokens={args.max_tokens}",
        f"train.lr={args.lr}",
        f"train.mini_batch={batch}",
        f"train.micro_batch={batch}",
    ]
    if getattr(args, "min_tokens", 0):
        overrides.append(f"rollout.min_tokens={args.min_tokens}")
    if seed:
        overrides.append(f"train.seed={seed}")
    if getattr(args, "threads", 0):
        overrides.append(f"train.threads={args.threads}")
    if engine_of(args) != "vllm":
        overrides.append(f"rollout.engine={engine_of(args)}")
    return overrides


def build_config(
    args: argparse.Namespace, paths: dict[str, Path], run_dir: Path, seed: int = 0
) -> tuple[object, list[str]]:
    """The demo config with the benchmark's settings (`config_overrides`), and the `relayrl train` command
    that runs it: the tree as <run_dir>/bench_config.yaml plus the overrides."""
    import yaml

    from relayrl.config import load_config, read_yaml

    regime = regime_of(args)
    tree = read_yaml(resources.files("relayrl") / "configs" / "demo.yaml")
    tree.update(
        model={"path": str(paths["init"])},
        data={**tree.get("data", {}), "train": str(paths["train"]), "eval": str(paths["eval"])},
        log={"dir": str(run_dir), "progress": False},
        reward={**tree.get("reward", {}), "fn": regime.reward},
    )
    overrides = config_overrides(args, seed)
    config = load_config(None, overrides, base=tree)  # validates here, before anything runs
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "bench_config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    # --overwrite: a benchmark's run directory is rebuilt on every invocation (first: callers append overrides)
    return config, [
        sys.executable,
        "-m",
        "relayrl.cli",
        "train",
        "--overwrite",
        str(run_dir / "bench_config.yaml"),
        *overrides,
    ]


def regime_notes(config, regime: Regime) -> list[str]:
    """The regime's own simplifications, printed with the differences."""
    if regime.warm_start:
        return []
    notes = [
        f"model: randomly initialised ({config.model.path}), no warm start: supervised training of a model "
        "this size would take longer than the benchmark on this machine",
        f"reward: {regime.reward} on both sides (exact match is always 0 for a random model at this length)",
        f"held-out score: {regime.held_out}, `relayrl eval` (vLLM, rollout.min_tokens) for the initial and both final models",
    ]
    if config.rollout.min_tokens:
        notes.append(
            f"length: end-of-sequence suppressed before {config.rollout.min_tokens} tokens on both sides "
            "(vLLM min_tokens / HF min_new_tokens); each side's mean training length is checked"
        )
    return notes


def settings_of(config) -> dict:
    import torch

    r, t = config.rollout, config.train
    return {
        "steps": t.steps,
        "prompts_per_step": r.prompts_per_step,
        "n": r.n,
        "max_tokens": r.max_tokens,
        "min_tokens": getattr(r, "min_tokens", 0),
        "reward": config.reward.fn,
        "lr": t.lr,
        "warmup_steps": t.warmup_steps,
        "temperature": r.temperature,
        "model": config.model.path,
        "engine": r.engine,
        "torch_threads": torch.get_num_threads(),
    }
