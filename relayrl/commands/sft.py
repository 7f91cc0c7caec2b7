"""`relayrl sft --data FILE --out DIR`: a supervised warm start on prompt/completion pairs (or `messages` rows),
from a tiny model built here or a model directory (relayrl/learner/sft.py)."""

from __future__ import annotations


def register(commands) -> None:
    sft = commands.add_parser("sft", help="supervised warm start on prompt/completion pairs")
    sft.add_argument("--data", required=True, help="prompt/completion pairs or messages rows (.jsonl, .parquet)")
    sft.add_argument("--out", required=True, help="where the trained model and its tokenizer are saved")
    group = sft.add_mutually_exclusive_group()
    group.add_argument("--init", choices=["tiny"], default="tiny", help="build a tiny model + tokenizer locally")
    group.add_argument("--model", help="start from this model directory instead")
    sft.add_argument("--epochs", type=float, default=3.0, help="passes over the data (a fraction is allowed)")
    sft.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    sft.add_argument("--batch-size", type=int, default=64, help="examples per optimizer step")
    sft.add_argument("--seed", type=int, default=0, help="the shuffling and initialisation seed")
    sft.set_defaults(fn=run)


def run(args) -> None:
    from relayrl.learner.sft import SFTSettings, run_sft

    settings = SFTSettings(epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, seed=args.seed)
    out = run_sft(args.data, args.out, init=args.init, model_path=args.model, settings=settings)
    print(f"saved {out}")
