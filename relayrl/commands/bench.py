"""`relayrl bench sync|all`: how fast each weight transport moves a model between actors
(relayrl/placement/sync_bench.py), or the repository's whole benchmark suite (benchmarks/suite.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def register(commands) -> None:
    bench = commands.add_parser(
        "bench", help="benchmarks: `bench sync` times each weight transport; `bench all` runs benchmarks/suite.py"
    )
    targets = bench.add_subparsers(dest="target", required=True, help="what to benchmark")
    every = targets.add_parser(
        "all",
        help="benchmarks/suite.py: relayrl vs TRL, rollout overhead, MFU, controller "
        "overhead vs their targets (source checkout only)",
    )
    every.add_argument("--quick", action="store_true", help="every benchmark small: a smoke run")
    every.set_defaults(fn=_all)
    sync = targets.add_parser("sync", help="seconds and GB/s per transport, bucketed vs per-tensor, vs memcpy")
    sync.add_argument("--params", type=float, default=1e8, help="model size in parameters (default 1e8)")
    sync.add_argument("--transports", default="shm,broadcast,object_store,disk", help="comma-separated transports")
    sync.add_argument("--receivers", type=int, default=1, help="engines receiving each push (r)")
    sync.add_argument("--repeats", type=int, default=3, help="pushes timed per transport (the median is shown)")
    sync.add_argument("--bucket-mb", type=float, default=64.0, help="bucket size in MiB, as sync.bucket_mb")
    sync.add_argument("--wire-dtype", choices=["fp32", "bf16"], default="fp32", help="dtype on the wire")
    sync.add_argument("--no-checksum", action="store_true", help="skip the xxh3-64 checksum per bucket")
    sync.add_argument(
        "--no-adopt",
        action="store_true",
        help="shm: pack a copy per push instead of keeping the sender's weights in shared memory",
    )
    sync.add_argument("--json", help="also write the figures to this file")
    sync.set_defaults(fn=_sync)


def _sync(args) -> None:
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


def _all(args) -> None:
    """The repository's benchmarks/suite.py (a source checkout only: it is not part of the installed package)."""
    import subprocess

    from relayrl.errors import ConfigError

    suite = Path(__file__).resolve().parents[2] / "benchmarks" / "suite.py"
    if not suite.is_file():
        raise ConfigError(f"relayrl bench all: {suite} not found; it runs from a source checkout of relayrl")
    sys.exit(subprocess.call([sys.executable, str(suite), *(["--quick"] if args.quick else [])]))
