"""The agents' endpoint: a loopback HTTP server with an OpenAI-compatible API, and the event loop the agents run on.

One thread per run holds an asyncio loop; uvicorn serves a Starlette app on it, bound to 127.0.0.1 on a free
port, and the agents' coroutines run on the same loop (a plain function runs on a thread of the loop's
executor). Each trajectory has its own base URL, `http://127.0.0.1:PORT/t/KEY/v1`: the key in the path ties a
call to its trajectory, so any client library, and any number of agents at once, can call it. A route's
handler is registered per key by the pool that owns the trajectory (relayrl/agents/pool.py) and unregistered
when it ends; a call for a key that has ended is answered 400. A handler answers a JSON object, or a `Stream`
(relayrl/agents/streaming.py: a `stream=true` call) sent as server-sent events.

Why not vLLM's own server (`vllm serve`, its `OpenAIServingChat`): it needs an `AsyncLLM` engine client,
which runs its own engine-core process; the run's engines are the offline engines the learner pushes weights
into (in this process or in Ray actors), and every token must come back tagged with the policy version that
sampled it. The endpoint keeps what vLLM's server adds on top of generation: the chat template
(transformers' `apply_chat_template`, as vLLM renders for HF tokenizers) and vLLM's tool parsers.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from relayrl.agents.chat import error_body
from relayrl.agents.streaming import Stream

# (key, body, "chat" | "completions" | "responses") -> (status, a JSON reply or a stream of events)
Handler = Callable[[str, Any, str], Awaitable[tuple[int, dict[str, Any] | Stream]]]
START_TIMEOUT_S = 30.0


class AgentServer:
    """Serves `/t/{key}/v1/chat/completions`, `/v1/responses`, `/v1/completions` (and `/v1/models`) on loopback;
    `loop` runs the agents."""

    def __init__(self):
        import uvicorn
        from starlette.applications import Starlette
        from starlette.routing import Route

        self._handlers: dict[str, Handler] = {}
        self._lock = threading.Lock()
        app = Starlette(
            routes=[
                Route("/t/{key}/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/t/{key}/v1/completions", self._completions, methods=["POST"]),
                Route("/t/{key}/v1/responses", self._responses, methods=["POST"]),
                Route("/t/{key}/v1/models", self._models, methods=["GET"]),
                Route("/t/{key}/v1/{rest:path}", self._not_served, methods=["GET", "POST"]),
            ]
        )
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=60)
        self._server = uvicorn.Server(config)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="relayrl-agents", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the agents' endpoint did not start on 127.0.0.1")
            time.sleep(0.01)

    def base_url(self, key: str) -> str:
        return f"http://127.0.0.1:{self.port}/t/{key}/v1"

    def register(self, key: str, handler: Handler) -> None:
        with self._lock:
            self._handlers[key] = handler

    def unregister(self, key: str) -> None:
        with self._lock:
            self._handlers.pop(key, None)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        # not the main thread: uvicorn leaves the process's signal handlers alone (the run's own stay in charge)
        self.loop.run_until_complete(self._server.serve(sockets=[self._socket]))

    async def _chat(self, request):
        return await self._call(request, "chat")

    async def _completions(self, request):
        return await self._call(request, "completions")

    async def _responses(self, request):
        return await self._call(request, "responses")

    async def _call(self, request, kind: str):
        from starlette.responses import JSONResponse, StreamingResponse

        key = request.path_params["key"]
        with self._lock:
            handler = self._handlers.get(key)
        if handler is None:
            return JSONResponse(error_body(f"trajectory {key!r} is not running (it ended, or never started)"), 400)
        try:
            body = json.loads(await request.body())
        except json.JSONDecodeError as err:
            return JSONResponse(error_body(f"the request body is not JSON: {err}"), 400)
        status, payload = await handler(key, body, kind)
        if isinstance(payload, Stream):
            return StreamingResponse(payload.frames(), status, media_type="text/event-stream")
        return JSONResponse(payload, status)

    async def _models(self, request):
        from starlette.responses import JSONResponse

        model = {"id": "policy", "object": "model", "created": 0, "owned_by": "relayrl"}
        return JSONResponse({"object": "list", "data": [model]})

    async def _not_served(self, request):
        from starlette.responses import JSONResponse

        path = request.path_params["rest"]
        return JSONResponse(
            error_body(
                f"/v1/{path} is not served: the agents' endpoint serves /v1/chat/completions, /v1/responses and "
                "/v1/completions"
            ),
            404,
        )
