"""`relayrl serve [CONFIG] [key=value ...] --model NAME=PATH [--host H] [--port P] [--api-key tml-...] [--state-dir DIR]`:
a Tinker-compatible service (relayrl/service/, docs/tinker.md). CONFIG and the overrides are relayrl's config, as
`relayrl train` reads it: the sampling engine and its memory (`rollout.*`), `model.path` as one more base, `log.dir`
as the service's run directory (relayrl/service/settings.py says what else it leaves out). It binds 127.0.0.1
unless `--host` says wider, prints the base URL and the API key the SDK must send (TINKER_BASE_URL,
TINKER_API_KEY), and serves until interrupted."""

from __future__ import annotations


def register(commands) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve the Tinker SDK's API on local models (docs/tinker.md)",
        usage="%(prog)s [-h] [CONFIG] [key=value ...] [--model NAME=PATH] [--host H] [--port P] ...",
    )
    serve.add_argument("config", nargs="?", help="relayrl's YAML config (rollout.*, model.path, log.dir)")
    serve.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.engine=vllm log.dir=runs/svc")
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

    from relayrl.commands.old_flags import is_override
    from relayrl.service import server
    from relayrl.service.settings import load_service_config, served_bases, service_settings

    if args.config is not None and is_override(args.config):  # `relayrl serve k=v ...`: no file, all overrides
        args.config, args.overrides = None, [args.config, *args.overrides]
    config = load_service_config(args.config, args.overrides)
    bases = server.parse_models(served_bases(args.model, config))
    settings = service_settings(config)
    running = server.start(bases, args.state_dir, args.host, args.port, args.api_key, settings)
    signal.signal(signal.SIGTERM, lambda *_: setattr(running.server, "should_exit", True))  # stop as Ctrl-C does
    print(f"TINKER_BASE_URL={running.url}", flush=True)
    print(f"TINKER_API_KEY={running.api_key}", flush=True)
    try:
        while running.thread.is_alive():
            time.sleep(0.5)
    finally:
        running.stop()
