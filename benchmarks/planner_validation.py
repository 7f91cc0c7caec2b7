"""Planner validation: `relayrl plan --measure`'s predicted vs measured median time/generate and time/update.

One run, two cases, on this machine:
  demo   relayrl/configs/demo.yaml on a demo-shaped model (hidden 128, 3 layers, ~0.8M params)
  large  the demo config with 8 prompts x 8 samples, 16-token responses, on a ~27M-param model
         (hidden 512, 8 layers, 8 heads, MLP 1536)
For each case: build the model and a character tokenizer locally (nothing is downloaded), train STEPS steps
in a subprocess (`relayrl train`, vLLM engine), then plan the same config with `--measure` (bandwidth, peak,
the model's matmuls at the plan's shapes, the engine's fixed costs) and compare the medians over steps
1..STEPS-1 (step 0 warms up) with the prediction.

Simplifications, stated: the models are randomly initialised (time depends on shapes and lengths, not on the
weights, so the demo's supervised warm start is skipped); the planner is given the longest prompt of the data
and the median longest response of the run's batches (`--prompt-tokens`, `--response-tokens`, inputs a user
takes from the data or a previous run). Timings on a shared 2-core machine swing 10-20x under load: the
busiest other processes are printed before and after; rerun on a quiet machine.

Run: .venv/bin/python benchmarks/planner_validation.py [--steps 10] [--out runs/planner_validation]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

CASES = {
    "demo": dict(model=dict(hidden=128, layers=3, heads=4, intermediate=512), overrides=[]),
    "large": dict(
        model=dict(hidden=512, layers=8, heads=8, intermediate=1536),
        overrides=[
            "rollout.prompts_per_step=8",
            "rollout.max_tokens=16",
            "train.mini_batch=64",
            "train.micro_batch=64",
        ],
    ),
}


def background_load(seconds: float = 1.0, top: int = 4) -> tuple[str, float]:
    """Machine CPU % over `seconds` and the busiest processes other than this one and its children, as text,
    and the CPU % (of one core) those other processes used together."""
    import psutil

    mine = {os.getpid(), *(c.pid for c in psutil.Process().children(recursive=True))}
    procs = [p for p in psutil.process_iter(["pid", "name", "cmdline"]) if p.pid not in mine]
    for proc in procs:
        try:
            proc.cpu_percent(None)
        except psutil.Error:
            pass
    total = psutil.cpu_percent(interval=seconds)
    busy = []
    for proc in procs:
        try:
            busy.append((proc.cpu_percent(None), proc.pid, " ".join(proc.info["cmdline"] or [proc.info["name"]])))
        except psutil.Error:
            pass
    others = sum(cpu for cpu, _, _ in busy)
    busy = sorted(busy, reverse=True)[:top]
    lines = [f"machine CPU {total:.0f}% of {psutil.cpu_count()} cores; others {others:.0f}% of a core; busiest:"]
    lines += [f"  {cpu:5.0f}%  pid {pid}  {cmd[:100]}" for cpu, pid, cmd in busy if cpu >= 1] or ["  none"]
    return "\n".join(lines), others


def wait_for_quiet(threshold: float = 15.0, timeout_s: float = 600.0) -> float:
    """Wait until the machine's CPU use over one second is under `threshold` %; returns the seconds waited.
    (After a run exits, its engine's threads can spin on for a few seconds.)"""
    import psutil

    start = time.perf_counter()
    while psutil.cpu_percent(interval=1.0) >= threshold and time.perf_counter() - start < timeout_s:
        pass
    return time.perf_counter() - start


def build_case(name: str, root: Path) -> tuple[Path, dict]:
    """Toy data and a random-init model + tokenizer for the case under root/name."""
    from relayrl.data.toy import write_toy_task
    from relayrl.models.tiny import build_tiny

    paths = write_toy_task(root / "data", seed=0)
    model_dir = root / name / "model"
    if not (model_dir / "config.json").is_file():
        texts = [row["prompt"] + row["completion"] for row in map(json.loads, paths["sft"].read_text().splitlines())]
        build_tiny(texts, model_dir, seed=0, **CASES[name]["model"])
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


def longest_prompt(model_dir: Path, train_path: Path) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [json.loads(line)["prompt"] for line in train_path.read_text().splitlines()]
    return max(len(tokenizer(p)["input_ids"]) for p in prompts)


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def measured_medians(run_dir: Path) -> dict[str, float]:
    rows = read_rows(run_dir)[1:]  # step 0 warms up
    return {
        key: statistics.median(row[key] for row in rows)
        for key in ("time/generate", "time/update", "response/length_max", "response/length_mean")
    }


def predict(config_path: Path, overrides: list[str], model_dir: Path, prompt: float, response: float):
    from relayrl.config import load_config
    from relayrl.planner import get_profile, load_shape, make_plan

    config = load_config(config_path, overrides)
    return make_plan(
        config,
        load_shape(str(model_dir)),
        get_profile("cpu", measure=True),
        longest_prompt_tokens=prompt,
        longest_response_tokens=response,
        measure=True,
    )


def train_case(config_path: Path, overrides: list[str]) -> dict:
    """One training run in its own process, with the machine's load sampled before and after."""
    waited = wait_for_quiet()
    load_before, others_before = background_load()
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "relayrl.cli", "train", str(config_path), *overrides, "--overwrite"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    train_s = time.perf_counter() - start
    load_after, others_after = background_load()
    return dict(
        train_s=train_s,
        load_before_training=load_before,
        load_after_training=load_after,
        waited_for_quiet_s=waited,
        others_cpu_pct=max(others_before, others_after),
    )


def run_case(name: str, root: Path, steps: int, previous: dict | None) -> dict:
    """Train (or, with `previous`, reuse that run and its load record) and predict with --measure."""
    config_path = Path(str(resources.files("relayrl") / "configs" / "demo.yaml"))
    model_dir, paths = build_case(name, root)
    run_dir = root / name / "run"
    overrides = overrides_for(name, model_dir, paths, run_dir, steps)
    training = (
        train_case(config_path, overrides)
        if previous is None
        else {
            key: previous[key]
            for key in (
                "train_s",
                "load_before_training",
                "load_after_training",
                "waited_for_quiet_s",
                "others_cpu_pct",
            )
        }
    )
    wait_for_quiet()
    measured = measured_medians(run_dir)
    prompt = longest_prompt(model_dir, paths["train"])
    plan = predict(config_path, overrides, model_dir, prompt, measured["response/length_max"])
    load_measuring, others_measuring = background_load()
    t = plan.time
    return dict(
        case=name,
        params=plan.shape.params,
        longest_prompt=prompt,
        **measured,
        **training,
        load_after_measuring=load_measuring,
        others_cpu_pct_measuring=others_measuring,
        steps=[{k: row[k] for k in ("time/generate", "time/update")} for row in read_rows(run_dir)],
        predicted={
            "generate": t.generate,
            "prefill": t.prefill,
            "decode": t.decode,
            "engine_fixed": t.engine_overhead,
            "update": t.update_phase,
            "update_flops": t.update,
            "optimizer": t.optimizer,
        },
        rates={
            "update_gflops": plan.rates.update / 1e9,
            "decode_gflops": plan.rates.decode / 1e9,
            "engine": vars(plan.rates.engine),
            "peak_gflops": plan.hardware.peak_tflops * 1e3,
            "mem_bw_gbs": plan.hardware.mem_bw_gbs,
        },
    )


def print_table(results: list[dict]) -> None:
    for r in results:
        print(
            f"\n{r['case']}: waited {r['waited_for_quiet_s']:.0f}s for a quiet machine; load before training: "
            f"{r['load_before_training']}\n{r['case']}: load after training: {r['load_after_training']}\n"
            f"{r['case']}: load after measuring: {r['load_after_measuring']}"
        )
        print(
            f"{r['case']}: per step generate "
            + " ".join(f"{s['time/generate']:.3f}" for s in r["steps"])
            + "; update "
            + " ".join(f"{s['time/update']:.3f}" for s in r["steps"])
        )
    print(
        f"\n{'case':6} {'params':>8} {'phase':9} {'predicted':>10} {'measured':>10} {'pred/meas':>9}  predicted parts"
    )
    for r in results:
        p = r["predicted"]
        parts = {
            "generate": f"prefill {p['prefill']:.3f} + decode {p['decode']:.3f} + engine fixed {p['engine_fixed']:.3f}",
            "update": f"FLOPs {p['update_flops']:.3f} + optimizer {p['optimizer']:.3f}",
        }
        for phase in ("generate", "update"):
            measured = r[f"time/{phase}"]
            loaded = (
                "  LOADED: others used {:.0f}% of a core".format(r["others_cpu_pct"])
                if r["others_cpu_pct"] > 20
                else ""
            )
            if r["others_cpu_pct_measuring"] > 20:
                loaded += "  LOADED while measuring: {:.0f}%".format(r["others_cpu_pct_measuring"])
            print(
                f"{r['case']:6} {r['params'] / 1e6:7.2f}M {phase:9} {p[phase]:9.3f}s {measured:9.3f}s "
                f"{p[phase] / measured:8.2f}x  {parts[phase]}{loaded}"
            )
    for r in results:
        e = r["rates"]["engine"]
        print(
            f"{r['case']}: update rate {r['rates']['update_gflops']:.1f} GFLOP/s, decode rate "
            f"{r['rates']['decode_gflops']:.1f} GFLOP/s (peak {r['rates']['peak_gflops']:.1f}, BW "
            f"{r['rates']['mem_bw_gbs']:.1f} GB/s); engine per call {e['per_call'] * 1e3:.1f} ms, per step "
            f"{e['per_step'] * 1e3:.2f} ms, per token {e['per_token'] * 1e6:.1f} us, per sequence "
            f"{e['per_sequence'] * 1e6:.1f} us; longest prompt {r['longest_prompt']}, longest response "
            f"{r['response/length_max']:g} (mean {r['response/length_mean']:.1f}); train {r['train_s']:.0f}s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="runs/planner_validation")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument(
        "--predict-only",
        action="store_true",
        help="reuse the runs of the last results.json "
        "(e.g. when the machine was busy while measuring, not while training)",
    )
    args = parser.parse_args()
    root = Path(args.out)
    previous = {r["case"]: r for r in json.loads((root / "results.json").read_text())} if args.predict_only else {}
    print("background load before:\n" + background_load()[0])
    results = [
        run_case(name, root, args.steps, previous.get(name) if args.predict_only else None) for name in args.cases
    ]
    after = background_load()[0]
    print_table(results)
    print("background load after:\n" + after)
    (root / "results.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {root / 'results.json'}")


if __name__ == "__main__":
    main()
