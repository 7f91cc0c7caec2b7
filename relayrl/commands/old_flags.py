"""The flags `relayrl eval` and `relayrl plan` took before they spoke config: each still works as the key=value it
stands for, listed in the command's `--help` under "deprecated flags", and a command line using any of them gets
one deprecation line naming the key=value forms to write instead."""

from __future__ import annotations

import argparse
import re
import sys

OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")  # `section.key=value`, not a path


def is_override(word: str) -> bool:
    return OVERRIDE.match(word) is not None


def dest(flag: str) -> str:
    """Where an old flag's value is kept: `--max-tokens` -> `old_max_tokens`."""
    return "old_" + flag.removeprefix("--").replace("-", "_")


def add_old_flags(parser: argparse.ArgumentParser, keys: dict[str, str], constants: dict[str, str]) -> None:
    """`keys`: old flag -> the key it sets; a flag in `constants` takes no value and sets that one."""
    group = parser.add_argument_group("deprecated flags (each prints the key=value that replaces it)")
    for flag, key in keys.items():
        if flag in constants:
            help_ = f"deprecated: {key}={constants[flag]}"
            group.add_argument(flag, dest=dest(flag), action="store_const", const=constants[flag], help=help_)
        else:
            group.add_argument(flag, dest=dest(flag), metavar="VALUE", help=f"deprecated: {key}=VALUE")


def warn_deprecated(command: str, replacements: list[str]) -> None:
    """The one deprecation line of a command line that used old flags (none: nothing)."""
    if replacements:
        print(f"relayrl: warning: {command}'s flags are deprecated; use {', '.join(replacements)}", file=sys.stderr)
