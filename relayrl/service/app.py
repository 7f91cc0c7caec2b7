"""The HTTP routes the `tinker` SDK (0.38) calls, as its own resources send them (`tinker/resources/*.py`):
JSON bodies validated with the SDK's request types, `forward_backward` as a proto (relayrl/service/wire.py), the
`X-API-Key` header checked against the service's key. A route that queues work answers an `UntypedAPIFuture`
(`request_id`); `/api/v1/retrieve_future` answers its result, `/api/v1/retrieve_futures` which samples of a sampling
session are done (relayrl/service/futures.py).

Errors: bad input on a synchronous route answers 400 or 404 with `x-should-retry: false` (the SDK raises
`BadRequestError` / `NotFoundError` with the message); a route not served here answers 404 naming it; a wrong key
401. Queued work that fails answers its future with the error (relayrl/service/futures.py).
"""

# no `from __future__ import annotations`: FastAPI reads the routes' `Request` annotations at runtime
import pydantic
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from relayrl.service import wire
from relayrl.service.errors import Unsupported, UserError
from relayrl.service.state import Service

NO_RETRY = {"x-should-retry": "false"}


def build_app(service: Service, api_key: str) -> FastAPI:
    app = FastAPI(title="relayrl Tinker service")

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if request.headers.get("x-api-key") != api_key:
            return JSONResponse({"error": "X-API-Key: not this service's key"}, status_code=401, headers=NO_RETRY)
        try:
            return await call_next(request)
        except UserError as err:
            return error(err)

    session_routes(app, service)
    training_routes(app, service)
    sampling_routes(app, service)

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def unsupported(path: str):
        return error(Unsupported(f"/{path}"))

    return app


def error(err: UserError) -> JSONResponse:
    return JSONResponse({"error": str(err), "detail": str(err)}, status_code=err.status, headers=NO_RETRY)


async def read(request: Request, model: type):
    """The body as the SDK's request type; a body it does not validate is the caller's mistake."""
    try:
        return model.model_validate(await request.json())  # pyright: ignore[reportAttributeAccessIssue]
    except pydantic.ValidationError as err:
        raise UserError(f"{request.url.path}: {err}") from None


def future(request_id: str, **extra) -> dict:
    """An `UntypedAPIFuture`: the SDK polls /api/v1/retrieve_future with its request_id."""
    return {"request_id": request_id, **extra}


def session_routes(app: FastAPI, service: Service) -> None:
    from tinker import types

    @app.get("/api/v1/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities():
        return {"supported_models": service.capabilities()}

    @app.post("/api/v1/client/config")
    async def client_config():
        return {"proto_compress_fwdbwd": False, "use_pyqwest_transport": False, "sample_use_retrieve_futures": True}

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config():
        return {}

    @app.post("/api/v1/telemetry")
    async def telemetry():
        return {"status": "accepted"}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request):
        await read(request, types.CreateSessionRequest)
        return {"type": "create_session", "session_id": service.create_session()}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request):
        service.heartbeat((await read(request, types.SessionHeartbeatRequest)).session_id)
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str):
        service.end_session(session_id, "finished by its client")
        return {}

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request):
        body = await read(request, types.FutureRetrieveRequest)
        result = await service.futures.retrieve(body.request_id)
        if isinstance(result, bytes):
            return Response(result, media_type="application/x-protobuf")
        return result

    @app.post("/api/v1/retrieve_futures")
    async def retrieve_futures(request: Request):
        body = await read(request, types.FuturesRetrieveRequest)
        target = (body.target.sampling_session_id, body.target.cloned_sampler_id)
        return await service.completions.retrieve(target, body.prev_cursor, body.timeout)


def training_routes(app: FastAPI, service: Service) -> None:
    from tinker import types

    @app.post("/api/v1/create_model")
    async def create_model(request: Request):
        body = await read(request, types.CreateModelRequest)
        request_id = service.create_model(body)
        return future(request_id, model_id=f"{body.session_id}:train:{body.model_seq_id}")

    @app.post("/api/v1/get_info")
    async def get_info(request: Request):
        return service.info((await read(request, types.GetInfoRequest)).model_id)

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request):
        call = wire.read_forward_backward(await request.body(), request.headers.get("content-encoding"))
        return future(service.forward_backward(call), model_id=call.model_id)

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request):
        body = await read(request, types.OptimStepRequest)
        return future(service.optim_step(body), model_id=body.model_id)

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request):
        body = await read(request, types.SaveWeightsRequest)
        return future(service.save_state(body), model_id=body.model_id)

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request):
        body = await read(request, types.LoadWeightsRequest)
        return future(service.load_state(body), model_id=body.model_id)


def sampling_routes(app: FastAPI, service: Service) -> None:
    from tinker import types

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_weights_for_sampler(request: Request):
        body = await read(request, types.SaveWeightsForSamplerRequest)
        return future(service.save_weights_for_sampler(body), model_id=body.model_id)

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request):
        body = await read(request, types.CreateSamplingSessionRequest)
        return {"type": "create_sampling_session", "sampling_session_id": service.create_sampling_session(body)}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str):
        sampler = service.sampler(sampler_id)
        return {"sampler_id": sampler_id, "base_model": sampler.base_name, "model_path": sampler.weights_key}

    @app.post("/api/v1/asample")
    async def asample(request: Request):
        request_id, sequence_ids = service.sample(await read(request, types.SampleRequest))
        return future(request_id, sample_sequence_ids=sequence_ids)
