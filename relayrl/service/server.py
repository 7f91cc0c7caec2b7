"""Start and stop the service: uvicorn on a thread of this process (the tests and `relayrl serve` both use it).

`--port 0` binds a free port and the base URL says which; the key is the caller's or a generated `tml-...` one
(the SDK accepts keys of that form); models are `NAME=PATH` local HF directories (a bare PATH is named by itself).
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from relayrl.errors import ConfigError

if TYPE_CHECKING:
    from relayrl.service.settings import ServiceSettings
    from relayrl.service.state import Service


def parse_models(items: list[str]) -> dict[str, str]:
    bases = {}
    for item in items:
        name, _, path = item.rpartition("=") if "=" in item else (item, "", item)
        if not (Path(path) / "config.json").is_file():
            raise ConfigError(f"--model {item}: {path} is not a local HF model directory (no config.json)")
        bases[name] = path
    if not bases:
        raise ConfigError(
            "--model: name at least one local HF model directory (NAME=PATH or PATH), or model.path in the config"
        )
    return bases


def new_api_key() -> str:
    return f"tml-{secrets.token_hex(16)}"


@dataclass
class Running:
    url: str
    api_key: str
    server: object
    thread: threading.Thread
    service: Service

    def stop(self) -> None:
        self.server.should_exit = True  # pyright: ignore[reportAttributeAccessIssue]
        self.thread.join(timeout=30)
        self.service.futures.close()
        self.service.run_log.close()


def start(
    bases: dict[str, str],
    state_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    settings: ServiceSettings | None = None,
) -> Running:
    """The service on a thread; `settings`: what it reads of relayrl's config (None: the defaults)."""
    import uvicorn

    from relayrl.service.app import build_app
    from relayrl.service.settings import service_settings
    from relayrl.service.state import Service

    api_key = api_key or new_api_key()
    if not api_key.startswith("tml-"):
        raise ConfigError(f"--api-key: the SDK accepts keys starting with 'tml-' (got {api_key[:8]!r}...)")
    service = Service(bases, state_dir, settings or service_settings())
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    config = uvicorn.Config(
        build_app(service, api_key), log_level="warning", lifespan="off", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="relayrl-serve")
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if not server.started:
        raise RuntimeError("the service did not start (see its log above)")
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return Running(f"http://{shown}:{bound_port}", api_key, server, thread, service)
