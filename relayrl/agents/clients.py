"""The openai clients handed to agents: one per trajectory (its base URL names the trajectory), all over one HTTP
connection pool per agent pool.

Why one pool: building an httpx client loads the TLS certificate bundle (~40 ms, even for the endpoint's plain
http on loopback), and an async agent's client is built on the endpoint's own event loop, so 32 clients built per
step held every call's handling for a second (benchmarks/agent_endpoint.py: `building the clients`). A trajectory's
client closing (the pool's `async with`, or an agent's own) leaves the shared connections open; `close` ends them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import httpx
import openai

SETTINGS = {"api_key": "relayrl", "max_retries": 0, "timeout": None}  # a retried call would be a second sample
UNLIMITED = httpx.Limits(max_connections=None, max_keepalive_connections=None)  # every agent in flight at once


class _SharedAsync(httpx.AsyncClient):
    async def aclose(self) -> None:  # a trajectory's client closing: the pool's connections stay open
        return None

    async def close_pool(self) -> None:
        await super().aclose()


class _SharedSync(httpx.Client):
    def close(self) -> None:  # as above, for a plain function's client
        return None

    def close_pool(self) -> None:
        super().close()


class AgentClients:
    """Makes the trajectories' clients: `AsyncOpenAI` for a coroutine agent, `OpenAI` for a plain function (run on a
    thread), over the connections of one shared httpx client of each kind, made when first needed."""

    def __init__(self):
        self._async: _SharedAsync | None = None
        self._sync: _SharedSync | None = None
        self._lock = threading.Lock()

    def async_client(self, base_url: str) -> openai.AsyncOpenAI:
        with self._lock:
            if self._async is None:
                self._async = _SharedAsync(limits=UNLIMITED, timeout=None)
        return openai.AsyncOpenAI(base_url=base_url, http_client=self._async, **SETTINGS)

    def sync_client(self, base_url: str) -> openai.OpenAI:
        with self._lock:
            if self._sync is None:
                self._sync = _SharedSync(limits=UNLIMITED, timeout=None)
        return openai.OpenAI(base_url=base_url, http_client=self._sync, **SETTINGS)

    def close(self, loop: asyncio.AbstractEventLoop, after_s: float) -> None:
        """Ends the shared connections on `loop` (the endpoint's) `after_s` from now: the agents still running when
        their trajectories ended are cancelled by then, and a refusal sent to them arrives on an open connection."""
        with self._lock:
            shared, self._async, plain, self._sync = self._async, None, self._sync, None

        def close_now() -> None:
            if plain is not None:
                plain.close_pool()
            if shared is not None:
                loop.create_task(shared.close_pool())

        if loop.is_running():
            with contextlib.suppress(RuntimeError):  # the loop closed in between: its connections went with it
                loop.call_soon_threadsafe(loop.call_later, after_s, close_now)
