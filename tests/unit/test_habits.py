"""Habits the code keeps, checked on every `make test`: a size budget per file and per function, and a README
that cannot drift from the code (its example files are the ones in examples/, its commands table and
docs/commands.md's are the CLI's). Its length and links: test_docs_links.py.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
# The budget is a prompt to look, not a target to squeeze under: a file past it is read again for two cohesive
# parts with names of their own (split by what belongs together, never to get under the line count), and a
# function past it for the steps it is made of. A file that is one thing and must be long is listed here with
# the reason; so is a function. At most three, each kept short by its reason.
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 70
BUDGET_EXCEPTIONS: dict[str, str] = {}  # "relayrl/x.py" or "relayrl/x.py:LINE name()" -> why it stays whole


def _sources() -> list[Path]:
    return sorted(p for p in (ROOT / "relayrl").rglob("*.py"))


def test_every_file_and_function_fits_the_budget():
    offenders = []
    for path in _sources():
        name = str(path.relative_to(ROOT))
        text = path.read_text()
        lines = text.count("\n")
        if lines > MAX_FILE_LINES and name not in BUDGET_EXCEPTIONS:
            offenders.append(f"{name}: {lines} lines (budget {MAX_FILE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                where = f"{name}:{node.lineno} {node.name}()"
                if length > MAX_FUNCTION_LINES and where not in BUDGET_EXCEPTIONS:
                    offenders.append(f"{where}: {length} lines (budget {MAX_FUNCTION_LINES})")
    assert len(BUDGET_EXCEPTIONS) <= 3 and all(BUDGET_EXCEPTIONS.values()), "each exception needs its reason"
    assert not offenders, (
        "over the size budget (find the cohesive parts and split there, or list the file in BUDGET_EXCEPTIONS "
        "with why it is one thing):\n  " + "\n  ".join(offenders)
    )


def test_the_readme_example_files_are_the_ones_in_examples():
    for name in ("examples/own_task/reward.py", "examples/own_task/config.yaml"):
        text = (ROOT / name).read_text()
        assert text in README, f"README.md does not show {name} as it is; paste the file into its code block"


def _subcommands() -> set[str]:
    from relayrl.cli import build_parser

    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(actions[0].choices)


def _documented(table: str) -> set[str]:
    return set(re.findall(r"^\| `relayrl (\w+)", table, flags=re.M))


def test_the_readme_commands_table_is_the_cli():
    documented = _documented(README.split("## Commands", 1)[1].split("\n## ", 1)[0])
    assert documented == _subcommands(), (
        f"README commands table vs the CLI: missing {sorted(_subcommands() - documented)}, "
        f"not commands {sorted(documented - _subcommands())}"
    )


def test_the_commands_page_is_the_cli():
    documented = _documented((ROOT / "docs/commands.md").read_text())
    assert documented == _subcommands(), (
        f"docs/commands.md vs the CLI: missing {sorted(_subcommands() - documented)}, "
        f"not commands {sorted(documented - _subcommands())}"
    )
