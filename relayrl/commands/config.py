"""`relayrl config --explain KEY | --write-docs [PATH] | --check-docs [PATH]`: a key's meaning, and the reference
page docs/config.md generated from the config tree (relayrl/config/docs.py)."""

from __future__ import annotations

import sys


def register(commands) -> None:
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
    cfg.set_defaults(fn=run)


def run(args) -> None:
    from relayrl.config import docs

    if args.explain is not None:
        print(docs.explain(args.explain))
    elif args.write_docs is not None:
        print(f"wrote {docs.write_reference(args.write_docs)}")
    elif problem := docs.check_reference(args.check_docs):
        print(f"relayrl: {problem}", file=sys.stderr)
        sys.exit(1)  # stale docs are a failed check, not a user error (status 2)
    else:
        print(f"{args.check_docs} is up to date")
