"""`relayrl report RUN_DIR`: one self-contained HTML page describing a run (relayrl/metrics/report.py)."""

from __future__ import annotations


def register(commands) -> None:
    report = commands.add_parser("report", help="write RUN_DIR/report/index.html: reward, phase times, staleness")
    report.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (log.dir), finished or running")
    report.set_defaults(fn=run)


def run(args) -> None:
    from relayrl.metrics.report import write_report

    print(f"wrote {write_report(args.run_dir)}")
