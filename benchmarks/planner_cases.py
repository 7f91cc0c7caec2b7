"""The cases of benchmarks/planner_validation.py: each one's model shape, data and config overrides, and how a
case's data, model (random init, character tokenizer, built locally) and config are written."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

# "suite": the configs the planner was developed against (its formulas and the probe were written looking at
# these two). "held out": written for this validation, run after the planner's code was fixed, nothing tuned to
# them: other prompt lengths (the planner reads them from data.train), group sizes, micro-batching and shapes.
CASES = {
    "demo": dict(split="suite", data="toy", model=dict(hidden=128, layers=3, heads=4, intermediate=512), overrides=[]),
    "large": dict(
        split="suite",
        data="toy",
        model=dict(hidden=512, layers=8, heads=8, intermediate=1536),
        overrides=[
            "rollout.prompts_per_step=8",
            "rollout.max_tokens=16",
            "train.mini_batch=64",
            "train.micro_batch=64",
        ],
    ),
    # issue 18's case: a 0.49M-param Llama, 8 x 8 samples, <= 4-token answers, ~6-token prompts
    "issue": dict(
        split="held out",
        data="toy",
        model=dict(hidden=128, layers=2, heads=4, intermediate=464),
        overrides=["rollout.prompts_per_step=8", "rollout.max_tokens=4", "train.mini_batch=64", "train.micro_batch=64"],
    ),
    # prompts of 12-60 tokens, groups of 4, count micro-batches of 16 (4 per step), a deeper narrow model
    "long_prompt": dict(
        split="held out",
        data="long",
        model=dict(hidden=96, layers=4, heads=3, intermediate=256),
        overrides=[
            "rollout.prompts_per_step=16",
            "rollout.n=4",
            "rollout.max_tokens=8",
            "data.max_prompt_tokens=64",
            "train.mini_batch=64",
            "train.micro_batch=16",
        ],
    ),
    # groups of 16, a token budget of 512 positions, a wider shallow model
    "wide_group": dict(
        split="held out",
        data="toy",
        model=dict(hidden=192, layers=2, heads=6, intermediate=512),
        overrides=[
            "rollout.prompts_per_step=4",
            "rollout.n=16",
            "rollout.max_tokens=12",
            "train.mini_batch=64",
            "train.micro_batch_tokens=512",
        ],
    ),
    # written after the probe of the model's passes, the reload's cost per byte and the mean response went in
    # (which were made looking at the five cases above), and run once: a second held-out set
    "deep_narrow": dict(
        split="held out 2",
        data="toy",
        model=dict(hidden=64, layers=6, heads=2, intermediate=192),
        overrides=[
            "rollout.prompts_per_step=12",
            "rollout.n=8",
            "rollout.max_tokens=10",
            "train.mini_batch=96",
            "train.micro_batch=32",
        ],
    ),
    "wide_pairs": dict(
        split="held out 2",
        data="long",
        model=dict(hidden=256, layers=1, heads=4, intermediate=1024),
        overrides=[
            "rollout.prompts_per_step=32",
            "rollout.n=2",
            "rollout.max_tokens=6",
            "data.max_prompt_tokens=64",
            "train.mini_batch=64",
            "train.micro_batch_tokens=1024",
        ],
    ),
}
FILLERS = (
    "",
    "Add:",
    "What is the sum?",
    "Please add the two numbers and answer with digits only:",
    "Compute",
    "Here is an addition problem for you, answer it:",
)


def write_long_prompts(out: Path, seed: int = 0) -> Path:
    """Addition problems behind a preamble of 0-55 characters: prompts of ~5-60 tokens (character tokenizer)."""
    import random

    path = out / "train.jsonl"
    if not path.is_file():
        out.mkdir(parents=True, exist_ok=True)
        rng = random.Random(seed)
        rows = []
        for _ in range(4000):
            a, b = rng.randrange(100), rng.randrange(100)
            rows.append({"prompt": f"{rng.choice(FILLERS)} {a}+{b}=".lstrip(), "answer": str(a + b)})
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def base_config(name: str, root: Path) -> Path:
    """relayrl/configs/demo.yaml, less train.micro_batch for a case that sets a token budget instead."""
    import yaml

    demo = Path(str(resources.files("relayrl") / "configs" / "demo.yaml"))
    if not any(o.startswith("train.micro_batch_tokens=") for o in CASES[name]["overrides"]):
        return demo
    config = yaml.safe_load(demo.read_text())
    del config["train"]["micro_batch"]
    path = root / name / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def build_case(name: str, root: Path) -> tuple[Path, dict]:
    """The case's data and a random-init model + character tokenizer under root/name."""
    from relayrl.data.toy import write_toy_task
    from relayrl.models.tiny import build_tiny

    paths = write_toy_task(root / "data", seed=0)
    if CASES[name]["data"] == "long":
        paths = {"train": write_long_prompts(root / "data_long")}
    model_dir = root / name / "model"
    if not (model_dir / "config.json").is_file():
        rows = [json.loads(line) for line in paths["train"].read_text().splitlines()]
        build_tiny([r["prompt"] + r["answer"] for r in rows], model_dir, seed=0, **CASES[name]["model"])
    return model_dir, paths


def overrides_for(name: str, model_dir: Path, paths: dict, run_dir: Path, steps: int) -> list[str]:
    return [
        f"model.path={model_dir}",
        f"data.train={paths['train']}",
        f"log.dir={run_dir}",
        f"train.steps={steps}",
        "log.progress=false",
        "log.save_model=false",
        *CASES[name]["overrides"],
    ]
