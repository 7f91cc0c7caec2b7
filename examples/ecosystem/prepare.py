"""A tiny character-level model for the ecosystem examples (untrained: the examples show the wiring, not learning).

Its vocabulary is ASCII letters, digits, punctuation and newline, enough for reasoning-gym's arithmetic questions,
skyrl-gym's gsm8k answers and gymnasium's ANSI boards. Written to runs/ecosystem_tiny (the examples' model.path).

  python examples/ecosystem/prepare.py [--out runs/ecosystem_tiny]
"""

from __future__ import annotations

import argparse
import string

from relayrl.models.tiny import build_tiny


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/ecosystem_tiny")
    out = parser.parse_args().out
    build_tiny([string.printable], out, seed=0, hidden=64, layers=2, heads=2, intermediate=128, max_positions=1024)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
