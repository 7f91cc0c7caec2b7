"""`relayrl train|eval|sft|demo|config|report|plan|bench`: thin entry points. Heavy modules are imported only by the command run.

A user mistake (`RelayError`) prints one line naming the file/row/key/sample and exits with status 2. A run
stopped by SIGTERM/SIGINT prints one line with the command that resumes it and exits with 128 + the signal.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from relayrl.data.check import add_data_command  # stdlib imports only
from relayrl.export import register as add_export_command  # stdlib imports only


def _train(args) -> None:
    from relayrl.api import train

    result = train(args.config, overrides=args.overrides, resume=args.resume, overwrite=args.overwrite)
    print(
        json.dumps(
            {
                when: {f"eval/{key}": value for key, value in scores.items()}
                for when, scores in (("before", result.before), ("after", result.after))
            }
        )
    )


def _eval(args) -> None:
    from relayrl.evaluate import evaluate_model, parse_reward_kwargs

    if args.env:  # multi-turn: the environment scores the trajectories (relayrl/envs/evaluate.py)
        return _eval_env(args)
    if not args.reward:
        from relayrl.errors import ConfigError

        raise ConfigError("relayrl eval: give --reward (a reward function) or --env (an environment)")
    kwargs = parse_reward_kwargs(args.reward_kwargs)
    print(
        json.dumps(
            evaluate_model(
                args.model,
                args.data,
                args.reward,
                n=args.n,
                temperature=args.temperature,
                max_tokens=args.max_tokens,
                min_tokens=args.min_tokens,
                engine=args.engine,
                max_prompts=args.max_prompts,
                reward_kwargs=kwargs,
                on_error=args.on_error,
                reward_workers=args.reward_workers,
                reward_timeout_s=args.reward_timeout_s,
            )
        )
    )


def _eval_env(args) -> None:
    from relayrl.envs.evaluate import evaluate_env_model
    from relayrl.evaluate import parse_reward_kwargs

    kwargs = parse_reward_kwargs(args.env_kwargs, "relayrl eval: --env-kwargs")
    print(
        json.dumps(
            evaluate_env_model(
                args.model,
                args.data,
                args.env,
                kwargs,
                max_turns=args.max_turns,
                max_total_tokens=args.max_total_tokens,
                max_tokens=args.max_tokens or 64,
                n=args.n,
                temperature=args.temperature,
                engine=args.engine,
                max_prompts=args.max_prompts,
                seed=0,
            )
        )
    )


def _sft(args) -> None:
    from relayrl.sft import SFTSettings, run_sft

    settings = SFTSettings(epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, seed=args.seed)
    out = run_sft(args.data, args.out, init=args.init, model_path=args.model, settings=settings)
    print(f"saved {out}")


def _demo(args) -> None:
    from relayrl.demo import run_demo

    run_demo(args.dir, args.overrides)


def _config(args) -> None:
    from relayrl import config_docs

    if args.explain is not None:
        print(config_docs.explain(args.explain))
    elif args.write_docs is not None:
        print(f"wrote {config_docs.write_reference(args.write_docs)}")
    elif problem := config_docs.check_reference(args.check_docs):
        print(f"relayrl: {problem}", file=sys.stderr)
        sys.exit(1)  # stale docs are a failed check, not a user error (status 2)
    else:
        print(f"{args.check_docs} is up to date")


def _report(args) -> None:
    from relayrl.metrics.report import write_report

    print(f"wrote {write_report(args.run_dir)}")


def _plan(args) -> None:
    from relayrl.planner.command import run_plan

    run_plan(args)


def _bench_sync(args) -> None:
    from relayrl.placement.sync_bench import run, table

    result = run(
        int(args.params),
        args.transports.split(","),
        receivers=args.receivers,
        repeats=args.repeats,
        checksum=not args.no_checksum,
        bucket_mb=args.bucket_mb,
        wire_dtype=args.wire_dtype,
        adopt=not args.no_adopt,
    )
    print(table(result))
    if args.json:
        rows = [vars(r) for r in result.pop("rows")]
        Path(args.json).write_text(json.dumps({**result, "rows": rows}, indent=1) + "\n")


def _bench_all(args) -> None:
    """The repository's benchmarks/suite.py (a source checkout only: it is not part of the installed package)."""
    import subprocess

    from relayrl.errors import ConfigError

    suite = Path(__file__).resolve().parents[1] / "benchmarks" / "suite.py"
    if not suite.is_file():
        raise ConfigError(f"relayrl bench all: {suite} not found; it runs from a source checkout of relayrl")
    sys.exit(subprocess.call([sys.executable, str(suite), *(["--quick"] if args.quick else [])]))


def _add_bench(commands) -> None:
    bench = commands.add_parser(
        "bench", help="benchmarks: `bench sync` times each weight transport; `bench all` runs benchmarks/suite.py"
    )
    targets = bench.add_subparsers(dest="target", required=True)
    every = targets.add_parser(
        "all",
        help="benchmarks/suite.py: relayrl vs TRL, rollout overhead, MFU, controller "
        "overhead vs their targets (source checkout only)",
    )
    every.add_argument("--quick", action="store_true", help="every benchmark small: a smoke run")
    every.set_defaults(fn=_bench_all)
    sync = targets.add_parser("sync", help="seconds and GB/s per transport, bucketed vs per-tensor, vs memcpy")
    sync.add_argument("--params", type=float, default=1e8, help="model size in parameters (default 1e8)")
    sync.add_argument("--transports", default="shm,broadcast,object_store,disk")
    sync.add_argument("--receivers", type=int, default=1, help="engines receiving each push (r)")
    sync.add_argument("--repeats", type=int, default=3)
    sync.add_argument("--bucket-mb", type=float, default=64.0)
    sync.add_argument("--wire-dtype", choices=["fp32", "bf16"], default="fp32")
    sync.add_argument("--no-checksum", action="store_true", help="skip the xxh3-64 checksum per bucket")
    sync.add_argument(
        "--no-adopt",
        action="store_true",
        help="shm: pack a copy per push instead of keeping the sender's weights in shared memory",
    )
    sync.add_argument("--json", help="also write the figures to this file")
    sync.set_defaults(fn=_bench_sync)


def _add_eval(commands) -> None:
    ev = commands.add_parser(
        "eval",
        help="mean reward of a model on a prompt file; prints one JSON line: "
        "reward_mean, n, and the samples the reward failed on (errors, timeouts, skipped)",
    )
    ev.add_argument("--model", required=True)
    ev.add_argument("--data", required=True)
    ev.add_argument("--reward", help="built-in name, module:function or file.py:function")
    ev.add_argument("--env", help="multi-turn: an environment (retry, calculator, module:Class); no --reward needed")
    ev.add_argument("--env-kwargs", default="{}", metavar="JSON", help="with --env: keyword arguments of the class")
    ev.add_argument("--max-turns", type=int, default=4, help="with --env: model turns per trajectory")
    ev.add_argument("--max-total-tokens", type=int, default=512, help="with --env: tokens after the first prompt")
    ev.add_argument(
        "--reward-kwargs",
        default="{}",
        metavar="JSON",
        help="keyword arguments bound to the reward, "
        """as reward.kwargs, e.g. '{"pattern": ".*done"}' for regex""",
    )
    ev.add_argument(
        "--on-error",
        choices=["error", "zero", "skip"],
        default="zero",
        help="a sample the reward "
        "fails on: stop naming it, score it 0 (default), or leave it out of reward_mean; all are counted",
    )
    ev.add_argument(
        "--reward-workers",
        type=int,
        default=0,
        help="score in N worker processes, each sample with a deadline (0 = in this process, no deadline)",
    )
    ev.add_argument("--reward-timeout-s", type=float, help="with --reward-workers: seconds per sample (default 60)")
    ev.add_argument("--n", type=int, default=1, help="samples per prompt")
    ev.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ev.add_argument(
        "--max-tokens",
        type=int,
        help="response tokens per sample (default: the model's generation "
        "config max_new_tokens, else 64, capped so the longest prompt plus the response fits its context)",
    )
    ev.add_argument("--min-tokens", type=int, default=0, help="end-of-sequence ignored before this many tokens")
    ev.add_argument("--max-prompts", type=int, default=0, help="score only the first N prompts (0 = all)")
    ev.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    ev.set_defaults(fn=_eval)


def _reward(args) -> None:
    from relayrl.reward_cmd import run

    run(args)


def _add_reward(commands) -> None:
    rw = commands.add_parser(
        "reward",
        help="a reward dry-run: score the `completion` of each row of a jsonl/parquet "
        "file through the reward service; one JSON line per row, then reward_mean, n, skipped, "
        "errors, timeouts",
    )
    rw.add_argument("file", metavar="FILE", help="rows with `completion` plus `prompt` or `messages` and any columns")
    rw.add_argument("--reward", required=True, help="built-in name, module:function or file.py:function")
    rw.add_argument(
        "--kwargs", default="{}", metavar="JSON", help="keyword arguments bound to the reward, as reward.kwargs"
    )
    rw.add_argument(
        "--style",
        choices=["auto", "relayrl", "trl", "verl"],
        default="auto",
        help="the reward's calling convention, as reward.style (auto: read from its signature)",
    )
    rw.add_argument(
        "--on-error",
        choices=["error", "zero", "skip"],
        default="zero",
        help="a row the reward fails "
        "on: stop naming it, score it 0 (default), or leave it out (reward null); all are counted",
    )
    rw.add_argument(
        "--workers",
        type=int,
        default=0,
        help="score in N worker processes, each sample with a deadline (0 = in this process, no deadline)",
    )
    rw.add_argument("--timeout-s", type=float, help="with --workers: seconds per sample (default 60)")
    rw.add_argument(
        "--max-error-frac",
        type=float,
        default=1.0,
        help="stop, naming the first failure, when the reward fails on this share of the rows or more, as "
        "reward.max_error_frac does in training (default 1: only when every row fails)",
    )
    rw.set_defaults(fn=_reward)


def _add_plan(commands) -> None:
    plan = commands.add_parser("plan", help="memory per role, placement and step time of a config on a device")
    plan.add_argument("config")
    plan.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.n=16")
    plan.add_argument("--hardware", default="H100-80GB", help="H100-80GB, H200, A100-80GB, A10G, L4 or cpu")
    plan.add_argument(
        "--measure",
        action="store_true",
        help="measure this CPU (--hardware cpu): bandwidth, peak "
        "FLOP/s, the model's matmuls at the plan's shapes, the engine's fixed costs (~30 s)",
    )
    for flag in ("params", "layers", "hidden", "kv-heads", "head-dim", "vocab"):  # override model.path's config.json
        plan.add_argument(f"--{flag}", type=float, help=f"model {flag.replace('-', ' ')} (e.g. --params 7e9)")
    plan.add_argument("--no-master", action="store_true", help="no fp32 master copy: 12 instead of 16 B/param (GPU)")
    plan.add_argument(
        "--infer-dtype",
        choices=["bf16", "fp8", "fp32"],
        help="engine/reference weights (default: bf16 on GPU, fp32 on CPU)",
    )
    plan.add_argument("--offload", action="store_true", help="trainer states leave the device while generating")
    plan.add_argument("--learner-ranks", type=int, metavar="W", help="learner ranks (default placement.learner_ranks)")
    plan.add_argument(
        "--prompt-tokens",
        type=float,
        help="expected longest prompt of a batch (default "
        "data.max_prompt_tokens): the learner pads every row to the batch's longest sequence",
    )
    plan.add_argument(
        "--response-tokens",
        type=float,
        help="expected longest response of a batch (default "
        "rollout.max_tokens); e.g. a previous run's response/length_max",
    )
    plan.add_argument(
        "--mean-response-tokens",
        type=float,
        help="expected mean response (default the longest): compute-bound decode and the engine's per-token "
        "costs scale with it as the batch thins; e.g. a previous run's response/length_mean",
    )
    plan.set_defaults(fn=_plan)


def _add_config(commands) -> None:
    cfg = commands.add_parser("config", help="explain a config key; write or check the reference docs/config.md")
    action = cfg.add_mutually_exclusive_group(required=True)
    action.add_argument("--explain", metavar="KEY", help="a dotted key or section, e.g. rollout.n or algorithm.kl")
    action.add_argument(
        "--write-docs",
        nargs="?",
        const="docs/config.md",
        metavar="PATH",
        help="write the generated reference (default docs/config.md)",
    )
    action.add_argument(
        "--check-docs",
        nargs="?",
        const="docs/config.md",
        metavar="PATH",
        help="exit 1 if PATH differs from the generated reference (default docs/config.md)",
    )
    cfg.set_defaults(fn=_config)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relayrl", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="run RL training from a YAML config plus key=value overrides")
    train.add_argument("config")
    train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=1e-5")
    run_dir = train.add_mutually_exclusive_group()
    run_dir.add_argument("--resume", metavar="RUN_DIR", help="continue from the newest valid checkpoint in RUN_DIR")
    run_dir.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in log.dir (without it, a log.dir holding a run is an error)",
    )
    train.set_defaults(fn=_train)

    _add_eval(commands)
    _add_reward(commands)

    sft = commands.add_parser("sft", help="supervised warm start on prompt/completion pairs")
    sft.add_argument("--data", required=True)
    sft.add_argument("--out", required=True)
    group = sft.add_mutually_exclusive_group()
    group.add_argument("--init", choices=["tiny"], default="tiny", help="build a tiny model + tokenizer locally")
    group.add_argument("--model", help="start from this model directory instead")
    sft.add_argument("--epochs", type=float, default=3.0)
    sft.add_argument("--lr", type=float, default=1e-3)
    sft.add_argument("--batch-size", type=int, default=64)
    sft.add_argument("--seed", type=int, default=0)
    sft.set_defaults(fn=_sft)

    demo = commands.add_parser("demo", help="warm start -> GRPO -> held-out accuracy before/after")
    demo.add_argument("--dir", default="runs/demo")
    demo.add_argument("overrides", nargs="*", help="dotted overrides of the demo config")
    demo.set_defaults(fn=_demo)

    _add_plan(commands)

    _add_bench(commands)

    _add_config(commands)

    add_data_command(commands)  # relayrl/data/check.py: `relayrl data check FILE`

    add_export_command(commands)  # relayrl/export.py: `relayrl export CHECKPOINT --out DIR [--merge]`

    report = commands.add_parser("report", help="write RUN_DIR/report/index.html: reward, phase times, staleness")
    report.add_argument("run_dir", metavar="RUN_DIR")
    report.set_defaults(fn=_report)
    return parser


def resume_command(args, run_dir: str) -> str:
    """The command that continues an interrupted run: the user's own `train` line, or the saved config."""
    if args.command == "train":
        return shlex.join(["relayrl", "train", args.config, *args.overrides, "--resume", str(run_dir)])
    return shlex.join(["relayrl", "train", str(Path(run_dir) / "config.yaml"), "--resume", str(run_dir)])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from transformers.utils import logging as hf_logging

    from relayrl.errors import RelayError, install_warning_format
    from relayrl.preemption import Interrupted, exit_on_next_signal

    hf_logging.disable_progress_bar()  # per-shard load/save bars; the run has its own progress bar
    install_warning_format()  # relayrl's warnings as one `relayrl: warning: ...` line
    try:
        args.fn(args)
    except RelayError as err:
        print(f"relayrl: error: {err}", file=sys.stderr)
        return 2
    except Interrupted as stop:
        exit_on_next_signal()
        then = (
            f"resume with: {resume_command(args, stop.run_dir)}"
            if stop.checkpoint is not None
            else "nothing was saved; run the same command to start again"
        )
        print(f"relayrl: {stop.describe()}; {then}", file=sys.stderr, flush=True)
        return stop.exit_status
    except KeyboardInterrupt:  # Ctrl-C outside a training run (sft, eval, the demo's warm start)
        print("relayrl: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
