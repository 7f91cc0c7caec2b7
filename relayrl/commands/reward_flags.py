"""`relayrl reward`'s reward flags: one name each, as the `reward.*` key it sets (`relayrl eval` takes the keys
themselves; its former flags of these names map to them, relayrl/commands/eval.py, and `parse_kwargs` reads its
former JSON flags).

`--reward SPEC`, `--reward-kwargs JSON`, `--reward-style`, `--on-error`, `--reward-workers N`, `--reward-timeout-s`
and `--max-error-frac` become one `RewardConfig`, checked as training checks `reward.*`. The names `relayrl reward`
took before (`--kwargs`, `--style`, `--workers`, `--timeout-s`) still work, with one deprecation line each.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

# old flag -> the flag it became (relayrl reward's names before the two commands shared one set)
DEPRECATED = {"--kwargs": "--reward-kwargs", "--style": "--reward-style", "--workers": "--reward-workers",
              "--timeout-s": "--reward-timeout-s"}  # fmt: skip


class _Renamed(argparse.Action):
    """Stores the value; an old name also prints one line saying the new one."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string in DEPRECATED:
            print(f"relayrl: warning: {option_string} is deprecated; use {DEPRECATED[option_string]}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _names(flag: str, old: bool) -> list[str]:
    return [flag, *(name for name, new in DEPRECATED.items() if new == flag and old)]


def add_reward_flags(parser: argparse.ArgumentParser, required: bool, old_names: bool = False) -> None:
    """The shared flags on `parser`; `old_names` also accepts relayrl reward's former names (deprecated)."""
    parser.add_argument("--reward", required=required, help="built-in name, module:function or file.py:function")
    parser.add_argument(
        *_names("--reward-kwargs", old_names),
        action=_Renamed,
        default="{}",
        metavar="JSON",
        help="""keyword arguments bound to the reward, as reward.kwargs (e.g. '{"pattern": ".*done"}' for regex)""",
    )
    parser.add_argument(
        *_names("--reward-style", old_names),
        action=_Renamed,
        choices=["auto", "relayrl", "trl", "verl"],
        default="auto",
        help="the reward's calling convention, as reward.style (auto: read from its signature)",
    )
    parser.add_argument(
        "--on-error",
        choices=["error", "zero", "skip"],
        default="zero",
        help="a sample the reward fails on: stop naming it, score it 0 (default), or leave it out of "
        "reward_mean; every failure is counted",
    )
    parser.add_argument(
        *_names("--reward-workers", old_names),
        action=_Renamed,
        type=int,
        default=0,
        help="score in N worker processes, each sample with a deadline (0 = in this process, no deadline)",
    )
    parser.add_argument(
        *_names("--reward-timeout-s", old_names),
        action=_Renamed,
        type=float,
        help="with --reward-workers: seconds one sample may take (default 60)",
    )
    parser.add_argument(
        "--max-error-frac",
        type=float,
        default=1.0,
        help="stop, naming the first failure, when the reward fails on this share of the samples or more, as "
        "reward.max_error_frac does in training (default 1: only when every sample fails)",
    )


def reward_config(args, command: str):
    """The `RewardConfig` the flags give; a bad combination is one ConfigError naming `command` and the flags."""
    from relayrl.config import RewardConfig
    from relayrl.errors import ConfigError

    workers, timeout_s = args.reward_workers, args.reward_timeout_s
    if workers < 0 or (timeout_s is not None and (timeout_s <= 0 or not workers)):
        raise ConfigError(
            f"{command}: need --reward-workers >= 0, and --reward-timeout-s > 0 only with --reward-workers "
            f"(got {workers}, {timeout_s})"
        )
    if not 0 <= args.max_error_frac <= 1:
        raise ConfigError(f"{command}: --max-error-frac must be in [0, 1], got {args.max_error_frac:g}")
    return RewardConfig(
        fn=args.reward,
        kwargs=parse_kwargs(args.reward_kwargs, f"{command}: --reward-kwargs"),
        style=args.reward_style,
        on_error=args.on_error,
        workers=workers,
        max_error_frac=args.max_error_frac,
        **({} if timeout_s is None else {"timeout_s": timeout_s}),
    )


def parse_kwargs(text: str, flag: str) -> dict[str, Any]:
    """A JSON flag of keyword arguments (a reward's or an environment's); `flag` names the command and the flag in
    the message (`relayrl eval: --reward-kwargs`)."""
    from relayrl.errors import ConfigError

    example = f"""e.g. {flag.split(": ")[-1]} '{{"pattern": ".*done"}}'"""
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{flag} {text!r} is not valid JSON ({err}); write a JSON object, {example}") from None
    if not isinstance(kwargs, dict):
        raise ConfigError(f"{flag} {text!r} is not a JSON object of keyword arguments, {example}")
    return kwargs
