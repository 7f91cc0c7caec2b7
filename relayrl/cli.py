"""`relayrl <command>`: the dispatcher. Each command is a module of relayrl/commands/ with its parser and its run.

A user mistake (`RelayError`) prints one line naming the file/row/key/sample and exits with status 2. A run
stopped by SIGTERM/SIGINT prints one line with the command that resumes it and exits with 128 + the signal.
Overrides (`key=value`) may stand anywhere after the command: before, between or after its flags.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from relayrl.commands import COMMANDS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relayrl", description="online RL post-training of LLMs: train, eval, reward, sft, demo, plan, ..."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="what to run")
    for command in COMMANDS:
        command.register(commands)
    return parser


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Parse, letting a command's `key=value` overrides stand anywhere after it (argparse alone takes a positional
    list only in one piece, so `train CONFIG --resume DIR k=v` would be refused as unrecognized)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and all("=" in item and not item.startswith("-") for item in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.parse_args(argv)  # the usual error, naming what was not recognized
    return args


def resume_command(args, run_dir: str | Path) -> str:
    """The command that continues an interrupted run: the user's own `train` line, or the saved config."""
    if args.command == "train":
        return shlex.join(["relayrl", "train", args.config, *args.overrides, "--resume", str(run_dir)])
    return shlex.join(["relayrl", "train", str(Path(run_dir) / "config.yaml"), "--resume", str(run_dir)])


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from transformers.utils import logging as hf_logging

    from relayrl.errors import RelayError, install_warning_format
    from relayrl.run.preemption import Interrupted, exit_on_next_signal

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
            if stop.checkpoint is not None and stop.run_dir is not None  # a checkpoint lives in a run dir
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
