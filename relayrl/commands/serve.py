"""`relayrl serve --model NAME=PATH [--host H] [--port P] [--api-key tml-...] [--state-dir DIR]`: a Tinker-compatible
service (relayrl/service/, docs/tinker.md). It binds 127.0.0.1 unless `--host` says wider, prints the base URL
and the API key the SDK must send (TINKER_BASE_URL, TINKER_API_KEY), and serves until interrupted."""

from __future__ import annotations


def register(commands) -> None:
    serve = commands.add_parser("serve", help="serve the Tinker SDK's API on local models (docs/tinker.md)")
    serve.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a base model: a local HF directory (repeatable)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=0, help="the port (0: a free one, printed)")
    serve.add_argument(
        "--api-key", default=None, help="the key clients must send (default: a generated tml-... key, printed)"
    )
    serve.add_argument("--state-dir", default="relayrl-service", help="where save_state writes checkpoints")
    serve.set_defaults(fn=run)


def run(args) -> None:
    import signal
    import time

    from relayrl.service import server

    running = server.start(server.parse_models(args.model), args.state_dir, args.host, args.port, args.api_key)
    signal.signal(signal.SIGTERM, lambda *_: setattr(running.server, "should_exit", True))  # stop as Ctrl-C does
    print(f"TINKER_BASE_URL={running.url}", flush=True)
    print(f"TINKER_API_KEY={running.api_key}", flush=True)
    try:
        while running.thread.is_alive():
            time.sleep(0.5)
    finally:
        running.stop()
