"""`relayrl data check FILE [--model DIR] [--max-prompt-tokens N] [--prompt-key COLUMN]`: every row of a prompt file checked now, as
training would read it, every image of a row with `images` opened (relayrl/data/check.py)."""

from __future__ import annotations

import argparse


def register(commands) -> None:
    data = commands.add_parser("data", help="check a prompt file (jsonl, parquet, datasets dir) row by row")
    actions = data.add_subparsers(dest="action", required=True, help="what to do with the file")
    check = actions.add_parser("check", help="read and check every row and image now (training reads lazily)")
    check.add_argument("file", metavar="FILE", help=".jsonl, .parquet or a datasets save_to_disk directory")
    check.add_argument("--model", help="model directory: also render and tokenise every prompt")
    check.add_argument("--max-prompt-tokens", type=int, default=256, help="with --model: data.max_prompt_tokens")
    check.add_argument("--no-chat-template", action="store_true", help="with --model: data.chat_template=false")
    check.add_argument("--prompt-key", default="prompt", help="the column holding the prompt (data.prompt_key)")
    check.set_defaults(fn=run)


def run(args: argparse.Namespace) -> None:
    from relayrl.data.check import check_file

    print(check_file(args.file, args.model, args.max_prompt_tokens, not args.no_chat_template, args.prompt_key))
