"""Planner validation: `relayrl plan plan.measure=true`'s predicted vs measured median time/generate, time/update and
time/sync.

One run, seven cases (`CASES`, benchmarks/planner_cases.py), on this machine. The suite's, which the planner
was developed against:
  demo         relayrl/configs/demo.yaml on a demo-shaped model (hidden 128, 3 layers, ~0.8M params)
  large        the demo config with 8 prompts x 8 samples, 16-token responses, on a ~27M-param model
               (hidden 512, 8 layers, 8 heads, MLP 1536)
Held out (written for this check, before the probes of the model's passes and of the reload's bytes, which were
made looking at their misses):
  issue        issue 18's: a 0.49M-param Llama (hidden 128, 2 layers), 8 x 8 samples, <= 4-token answers,
               ~6-token prompts
  long_prompt  prompts of ~5-60 tokens, groups of 4, four count micro-batches a step, hidden 96 x 4 layers
  wide_group   groups of 16, train.micro_batch_tokens=512, hidden 192 x 2 layers
Held out 2 (written after the planner's code was final, run once):
  deep_narrow  hidden 64 x 6 layers, 12 prompts x 8, three count micro-batches
  wide_pairs   hidden 256 x 1 layer, 32 prompts x 2, long prompts, train.micro_batch_tokens=1024
For each case: build the model and a character tokenizer locally (nothing is downloaded), train STEPS steps
in a subprocess (`relayrl train`, vLLM engine), then plan the same config with `--measure` (bandwidth, peak,
the model's passes and matmuls at the plan's shapes, the engine's fixed costs) and compare the medians over steps
1..STEPS-1 (step 0 warms up) with the prediction.

Simplifications, stated: the models are randomly initialised (time depends on shapes and lengths, not on the
weights, so the demo's supervised warm start is skipped); the planner is told nothing about prompts (it reads
their lengths from data.train itself) and is given the median longest and mean response of the run's
batches (`--response-tokens`, `--mean-response-tokens`: inputs a user takes from a previous run). Timings on a
shared 2-core machine swing 10-20x under load: the busiest other processes and the load average are printed; rerun on a quiet machine.

--interleaved: no training runs; the update phase alone, predicted and measured alternately in one process
(best of 3 each), which a shared machine's load moves together.

Run: .venv/bin/python benchmarks/planner_validation.py [--steps 10] [--out runs/planner_validation]
     [--cases demo large issue long_prompt wide_group deep_narrow wide_pairs] [--quiet-s 600] [--interleaved]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from relayrl.placement.sections import learner_settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
import contextlib

from planner_cases import CASES, base_config, build_case, overrides_for  # noqa: E402

PHASES = ("generate", "update", "sync")
LOADED = 3.0  # a 1-minute load average above this on 2 cores: other processes share the cores, times swing 10x


def background_load(seconds: float = 1.0, top: int = 4) -> tuple[str, float]:
    """Machine CPU % over `seconds` and the busiest processes other than this one and its children, as text,
    and the CPU % (of one core) those other processes used together."""
    import psutil

    mine = {os.getpid(), *(c.pid for c in psutil.Process().children(recursive=True))}
    procs = [p for p in psutil.process_iter(["pid", "name", "cmdline"]) if p.pid not in mine]
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.cpu_percent(None)
    total = psutil.cpu_percent(interval=seconds)
    busy = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            busy.append((proc.cpu_percent(None), proc.pid, " ".join(proc.info["cmdline"] or [proc.info["name"]])))
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


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def measured_medians(run_dir: Path) -> dict[str, float]:
    rows = read_rows(run_dir)[1:]  # step 0 warms up
    keys = [f"time/{phase}" for phase in PHASES] + ["response/length_max", "response/length_mean"]
    keys += ["learner/positions", "learner/micro_batches"]  # what the planner's inputs imply, load or not
    return {key: statistics.median(row[key] for row in rows) for key in keys}


def predict(config_path: Path, overrides: list[str], model_dir: Path, response: float, mean_response: float):
    """`relayrl plan plan.hardware=cpu plan.measure=true`, given the run's median longest and mean response (prompt
    lengths the planner reads from data.train itself)."""
    from relayrl.build import resolve
    from relayrl.config import load_config
    from relayrl.planner import get_profile, load_shape, make_plan

    config = resolve(load_config(config_path, overrides))
    return make_plan(
        config,
        load_shape(str(model_dir)),
        get_profile("cpu", measure=True),
        longest_response_tokens=response,
        mean_response_tokens=mean_response,
        measure=True,
    )


def train_case(config_path: Path, overrides: list[str], quiet_s: float) -> dict:
    """One training run in its own process, with the machine's load sampled before and after."""
    waited = wait_for_quiet(timeout_s=quiet_s)
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
        loadavg_training=os.getloadavg()[0],
    )


TRAINING_KEYS = (
    "train_s",
    "load_before_training",
    "load_after_training",
    "waited_for_quiet_s",
    "others_cpu_pct",
    "loadavg_training",
)


def run_case(name: str, root: Path, steps: int, previous: dict | None, quiet_s: float) -> dict:
    """Train (or, with `previous`, reuse that run and its load record) and predict with --measure."""
    from relayrl.planner.estimate import sync_params
    from relayrl.planner.timing import sync_time

    config_path = base_config(name, root)
    model_dir, paths = build_case(name, root)
    run_dir = root / name / "run"
    overrides = overrides_for(name, model_dir, paths, run_dir, steps)
    training = (
        train_case(config_path, overrides, quiet_s)
        if previous is None
        else {key: previous.get(key, 0.0) for key in TRAINING_KEYS}
    )
    wait_for_quiet(timeout_s=quiet_s)
    measured = measured_medians(run_dir)
    plan = predict(config_path, overrides, model_dir, measured["response/length_max"], measured["response/length_mean"])
    load_measuring, others_measuring = background_load()
    t, w, prompts = plan.time, plan.workload, plan.prompts
    sync_bytes = sync_params(plan.shape, w) * plan.precision.infer_bytes
    return dict(
        case=name,
        split=CASES[name]["split"],
        params=plan.shape.params,
        inferred=dict(
            prompt_mean=w.prompt_mean,
            prompt_p95=getattr(prompts, "p95", None),
            batch_longest_prompt=w.prompt,
            response=w.response,
            packed=w.packed,
            micro_positions=plan.memory.learner.positions,
            positions=w.tokens,
            micro_batches=w.micro_batches,
        ),
        **measured,
        **training,
        load_after_measuring=load_measuring,
        others_cpu_pct_measuring=others_measuring,
        loadavg_measuring=os.getloadavg()[0],
        steps=[{k: row[k] for k in (f"time/{phase}" for phase in PHASES)} for row in read_rows(run_dir)],
        predicted={
            "generate": t.generate,
            "prefill": t.prefill,
            "decode": t.decode,
            "engine_fixed": t.engine_overhead,
            "update": t.update_phase,
            "update_flops": t.update,
            "optimizer": t.optimizer,
            "update_fixed": t.update_fixed,
            "sync": t.sync,
            "reload": t.sync - sync_time(sync_bytes, plan.hardware, None),  # the engine's reload (fixed + bytes)
        },
        rates={
            "update_gflops": plan.rates.update / 1e9,
            "decode_gflops": plan.rates.decode / 1e9,
            "engine": vars(plan.rates.engine),
            "learner": vars(plan.rates.learner) if plan.rates.learner else {},
            "peak_gflops": plan.hardware.peak_tflops * 1e3,
            "mem_bw_gbs": plan.hardware.mem_bw_gbs,
        },
    )


def parts(r: dict) -> dict[str, str]:
    p = r["predicted"]
    return {
        "generate": f"prefill {p['prefill']:.3f} + decode {p['decode']:.3f} + engine fixed {p['engine_fixed']:.3f}",
        "update": f"FLOPs {p['update_flops']:.3f} + optimizer {p['optimizer']:.3f} + fixed {p.get('update_fixed', 0):.3f}",
        "sync": f"bytes {p['sync'] - p.get('reload', 0.0):.4f} + engine reload {p.get('reload', 0.0):.4f}",
    }


def print_table(results: list[dict]) -> None:
    for r in results:
        print(
            f"\n{r['case']}: waited {r['waited_for_quiet_s']:.0f}s for a quiet machine; load before training: "
            f"{r['load_before_training']}\n{r['case']}: load after training: {r['load_after_training']}\n"
            f"{r['case']}: load after measuring: {r['load_after_measuring']}"
        )
        for phase in PHASES:
            print(f"{r['case']}: per step {phase} " + " ".join(f"{s[f'time/{phase}']:.3f}" for s in r["steps"]))
    print(
        f"\n{'case':11} {'split':8} {'params':>8} {'phase':9} {'predicted':>10} {'measured':>10} {'pred/meas':>9}"
        "  within 1.5x  predicted parts"
    )
    for r in results:
        busy = max(r.get("loadavg_training", 0), r.get("loadavg_measuring", 0)) > LOADED
        loaded = f"  (loadavg {r.get('loadavg_training', 0):.1f} training, {r.get('loadavg_measuring', 0):.1f} probing)"
        loaded += "  LOADED: timings not comparable" if busy else ""
        for phase in PHASES:
            predicted, measured = r["predicted"][phase], r[f"time/{phase}"]
            ratio = predicted / measured
            ok = "yes" if 1 / 1.5 <= ratio <= 1.5 else "NO"
            print(
                f"{r['case']:11} {r['split']:8} {r['params'] / 1e6:7.2f}M {phase:9} {predicted:9.4f}s {measured:9.4f}s "
                f"{ratio:8.2f}x  {ok:11} {parts(r)[phase]}{loaded if phase == 'generate' else ''}"
            )
    for r in results:
        e, i = r["rates"]["engine"], r["inferred"]
        print(
            f"{r['case']}: inferred prompt mean {i['prompt_mean']:.1f}, p95 {i['prompt_p95']}, a batch's longest "
            f"{i['batch_longest_prompt']:g}; response {i['response']:g} (the run's median longest; mean "
            f"{r['response/length_mean']:.1f}); packing {'on' if i['packed'] else 'off'}; largest micro-batch "
            f"{i['micro_positions']} positions; positions per pass {i.get('positions', 0):,} (measured "
            f"{r.get('learner/positions', 0):,.0f}), micro-batches {i.get('micro_batches', 0)} (measured "
            f"{r.get('learner/micro_batches', 0):g}); update rate {r['rates']['update_gflops']:.1f} GFLOP/s, decode "
            f"{r['rates']['decode_gflops']:.1f} GFLOP/s; engine per call {e['per_call'] * 1e3:.1f} ms, per step "
            f"{e['per_step'] * 1e3:.2f} ms, per token {e['per_token'] * 1e6:.1f} us, per sequence "
            f"{e['per_sequence'] * 1e6:.1f} us, reload {e.get('reload', 0) * 1e3:.1f} ms + "
            f"{e.get('reload_per_byte', 0) * 1e12:.1f} ms/GB; train {r['train_s']:.0f}s"
        )


def interleaved_update(name: str, root: Path, rounds: int = 3) -> dict:
    """The update phase, load-robust: the planner's prediction (its matmul and learner probes) and relayrl's
    `PolicyLearner.update` on a batch of the case's shapes (prompts drawn from its data, every response
    rollout.max_tokens long), measured alternately in one process; the best of each over `rounds`."""
    import random
    import tempfile

    from relayrl.algorithms.advantages import grpo, make_inputs
    from relayrl.build import resolve
    from relayrl.config import load_config
    from relayrl.data.source import load_prompts
    from relayrl.learner.batching import make_experience
    from relayrl.learner.policy import PolicyLearner
    from relayrl.models.loading import load_tokenizer
    from relayrl.models.tiny import build_tiny
    from relayrl.planner import get_profile, load_shape, make_plan
    from relayrl.planner.learner_probe import probe_update_here
    from relayrl.planner.pass_probe import measure_pass_rates
    from relayrl.planner.probe import NULL_ALPHABET, measure_matmul_rates, null_shape
    from relayrl.planner.timing import estimate_time, measured_rates
    from relayrl.types import Rollout, Score

    config_path = base_config(name, root)
    model_dir, paths = build_case(name, root)
    config = resolve(load_config(config_path, overrides_for(name, model_dir, paths, root / name / "interleaved", 1)))
    n, length = config.rollout.n, config.rollout.max_tokens
    prompts, _ = load_prompts(paths["train"], load_tokenizer(model_dir), config.data.max_prompt_tokens)
    chosen = random.Random(0).sample(list(prompts), config.rollout.prompts_per_step)
    rollouts = [
        Rollout(p, i, [5] * length, "", [-1.0] * length, "length", [0] * length) for p in chosen for i in range(n)
    ]
    exp = make_experience(rollouts, [Score(float(i % 2)) for i in range(len(rollouts))], pad_id=0)
    exp.advantages, _ = grpo(make_inputs(exp.rewards, exp.loss_mask, exp.group_ids))
    shape, hardware = load_shape(str(model_dir)), get_profile("cpu", measure=True)
    plan = make_plan(config, shape, hardware, longest_response_tokens=length)
    learner = PolicyLearner(learner_settings(config))
    learner.update(exp)  # warm-up
    measured = predicted = float("inf")
    with tempfile.TemporaryDirectory() as null_dir:
        build_tiny([NULL_ALPHABET], null_dir, **null_shape(1))
        for _ in range(rounds):
            start = time.perf_counter()
            learner.update(exp)
            measured = min(measured, time.perf_counter() - start)
            w = plan.workload
            matmul = measure_matmul_rates(shape, prefill_rows=int(w.micro_batch * w.width), decode_rows=1)
            row = w.packed_width if w.packed else w.width
            passes = measure_pass_rates(str(model_dir), shape, w.tokens // w.micro_batches, int(row))
            rates = measured_rates(passes, matmul, None, probe_update_here(null_dir))
            t = estimate_time(shape, w, plan.memory, plan.placement, hardware, plan.precision, rates)
            if t.update_phase < predicted:
                predicted, best = t.update_phase, t
    print(
        f"{name}: update predicted {predicted:.4f}s (FLOPs {best.update:.4f} at {rates.update / 1e9:.1f} GFLOP/s + "
        f"optimizer {best.optimizer:.4f} + fixed {best.update_fixed:.4f}), measured {measured:.4f}s (best of "
        f"{rounds}, alternating), "
        f"{predicted / measured:.2f}x; positions per pass {w.tokens}; load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    return dict(case=name, predicted=predicted, measured=measured, loadavg=os.getloadavg()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="runs/planner_validation")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--quiet-s", type=float, default=600.0, help="wait at most this long for a quiet machine")
    parser.add_argument(
        "--predict-only",
        action="store_true",
        help="reuse the runs of the last results.json "
        "(e.g. when the machine was busy while measuring, not while training)",
    )
    parser.add_argument(
        "--interleaved", action="store_true", help="only the load-robust update check (no training runs)"
    )
    args = parser.parse_args()
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    if args.interleaved:
        for name in args.cases:
            interleaved_update(name, root)
        return
    previous = {r["case"]: r for r in json.loads((root / "results.json").read_text())} if args.predict_only else {}
    print("background load before:\n" + background_load()[0])
    results = []
    for name in args.cases:
        results.append(run_case(name, root, args.steps, previous.get(name), args.quiet_s))
        (root / "results.json").write_text(json.dumps(results, indent=2))  # a case at a time: a long run keeps them
    after = background_load()[0]
    print_table(results)
    print("background load after:\n" + after)
    print(f"wrote {root / 'results.json'}")


if __name__ == "__main__":
    main()
