"""The trajectories' openai clients share one connection pool (relayrl/agents/clients.py): built in milliseconds, a
trajectory's client closing leaves the others' connections open, and the pool's close ends them after its delay."""

from __future__ import annotations

import asyncio
import threading
import time

from relayrl.agents.clients import AgentClients


def test_clients_share_one_connection_pool_that_outlives_a_trajectorys_client():
    clients = AgentClients()
    first, second = clients.async_client("http://127.0.0.1:1/t/a/v1"), clients.async_client("http://127.0.0.1:1/t/b/v1")
    assert first._client is second._client and str(first.base_url) != str(second.base_url)
    assert first.max_retries == 0  # a retried call would be a second sample
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:

        async def close_one():
            async with first:  # as the pool's own `async with`, or an agent's
                pass

        asyncio.run_coroutine_threadsafe(close_one(), loop).result(timeout=5)
        assert not second._client.is_closed  # the other trajectory's client still has its connections
        plain = clients.sync_client("http://127.0.0.1:1/t/c/v1")
        plain.close()
        assert not plain._client.is_closed
        clients.close(loop, after_s=0.2)
        assert not second._client.is_closed  # not before the delay: a late refusal still reaches its agent
        deadline = time.monotonic() + 5
        while not (second._client.is_closed and plain._client.is_closed) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert second._client.is_closed and plain._client.is_closed
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
