"""`relayrl demo`: the whole loop on a toy task, on a laptop-class CPU, in a few minutes.

toy data (seeded split) -> supervised warm start (cached in <dir>/warmstart) -> held-out eval -> GRPO
through vLLM -> held-out eval -> <dir>/model (save_pretrained) and <dir>/eval.json. Running it again replaces
the previous demo run in <dir> (as `relayrl train --overwrite` does) and reuses the cached warm start.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

DEMO_SFT_EPOCHS = 6.0


def register(commands) -> None:
    demo = commands.add_parser("demo", help="warm start -> GRPO -> held-out accuracy before/after")
    demo.add_argument("--dir", default="runs/demo", help="the demo's run directory (its warm start is cached there)")
    demo.add_argument("overrides", nargs="*", help="dotted overrides of the demo config, e.g. train.steps=20")
    demo.set_defaults(fn=lambda args: run_demo(args.dir, args.overrides))


def run_demo(run_dir: str | Path = "runs/demo", overrides: Sequence[str] = ()) -> dict:
    from relayrl.build import resolve, train
    from relayrl.config import dump_config, load_config, read_yaml
    from relayrl.data.toy import write_toy_task
    from relayrl.learner.sft import SFTSettings, run_sft

    run_dir = Path(run_dir)
    start = time.perf_counter()
    paths = write_toy_task(run_dir / "data", seed=0)
    warm = run_dir / "warmstart"
    if (warm / "config.json").is_file() and (warm / "model.safetensors").is_file():
        print(f"warm start: cached at {warm}")
    else:
        print("warm start: supervised training of a tiny model on the sloppy teacher's answers")
        run_sft(paths["sft"], warm, init="tiny", settings=SFTSettings(epochs=DEMO_SFT_EPOCHS, batch_size=128))
    with resources.as_file(resources.files("relayrl") / "configs" / "demo.yaml") as demo_yaml:  # a Path on disk
        base = read_yaml(demo_yaml)
    base.update(
        model={"path": str(warm)},
        data={**base.get("data", {}), "train": str(paths["train"]), "eval": str(paths["eval"])},
        log={"dir": str(run_dir)},
    )
    config = resolve(load_config(None, list(overrides), base=base))  # the dump notes each `auto` choice
    print(dump_config(config))
    result = train(config, overwrite=True)  # each demo is a fresh RL run; data/ and warmstart/ are kept
    before, after = result["before"], result["after"]
    print(json.dumps({"before": before, "after": after}))
    print(f"\nheld-out accuracy ({len(Path(paths['eval']).read_text().splitlines())} problems)")
    print(f"  greedy : {before['eval/greedy']:.3f} -> {after['eval/greedy']:.3f}")
    print(f"  sampled: {before['eval/sampled']:.3f} -> {after['eval/sampled']:.3f}")
    print(f"final model: {run_dir / 'model'}   total {time.perf_counter() - start:.0f}s")
    return result
