"""`relayrl train CONFIG [key=value ...] [--resume RUN_DIR | --overwrite]`: an RL run from a config."""

from __future__ import annotations

import json


def register(commands) -> None:
    train = commands.add_parser("train", help="run RL training from a YAML config plus key=value overrides")
    train.add_argument("config", help="the run's YAML config (a saved <run>/config.yaml re-runs as it is)")
    train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=1e-5 rollout.n=16")
    run_dir = train.add_mutually_exclusive_group()
    run_dir.add_argument("--resume", metavar="RUN_DIR", help="continue from the newest valid checkpoint in RUN_DIR")
    run_dir.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in log.dir (without it, a log.dir holding a run is an error)",
    )
    train.set_defaults(fn=run)


def run(args) -> None:
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
