"""A client that disappears (issue 48 item 5): its session stops beating, and past SESSION_TIMEOUT_S the service
frees what it held (training models, sampling sessions, unnamed sampler weights, queued requests), keeps what other
clients may name (named sampler weights), and answers the session's late heartbeat 410 so the SDK stops beating."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import tinker
from tinker import types

from tests.unit import service_fixtures
from tests.unit.service_fixtures import datum, sdk_client

service = service_fixtures.service  # this module's own service (module-scoped)

TOKENS = [5, 6, 7, 8, 9]


def test_a_session_without_heartbeats_is_freed_but_its_named_weights_stay(service):
    from relayrl.service.errors import UserError
    from relayrl.service.state import SESSION_TIMEOUT_S

    gone_client = sdk_client(service)
    trainer = gone_client.create_lora_training_client(base_model="tiny", rank=2).result()
    trainer.save_weights_and_get_sampling_client().result()
    named = trainer.save_weights_for_sampler("kept").result().path
    session_id = gone_client.holder.get_session_id()
    served = service.service
    assert any(key.startswith(f"{session_id}:") for key in served.models)

    later = time.time() + SESSION_TIMEOUT_S + 1  # as if the client had stopped beating that long ago
    assert served.expire_sessions(now=later) == [session_id]
    served.futures.run(lambda: None).result()  # the freeing runs on the worker, after what was queued
    assert not [key for key in (*served.models, *served.samplers) if key.startswith(f"{session_id}:")]
    assert [key for key in served.snapshots if key.startswith(f"tinker://{session_id}:")] == [named]
    with pytest.raises(tinker.NotFoundError, match="no such model"):
        trainer.forward([datum(TOKENS)], "cross_entropy").result()
    with pytest.raises(UserError, match="ended .no heartbeat for 120 s") as late:
        served.heartbeat(session_id)
    assert late.value.status == 410  # the SDK's heartbeat loop stops on 410

    other = sdk_client(service)
    sampler = other.create_sampling_client(model_path=named).result()
    assert len(sampler.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()) == len(TOKENS)


def test_cancelling_a_sessions_requests_spares_the_running_one_and_other_sessions():
    from relayrl.service.futures import Futures

    futures = Futures()
    gate = threading.Event()
    running = futures.submit(lambda: {"ran": gate.wait(30)}, owner="a")
    queued = futures.submit(lambda: {"ran": True}, owner="a")
    other = futures.submit(lambda: {"ran": True}, owner="b")
    time.sleep(0.1)  # the worker has taken the first request
    assert futures.cancel_owned("a") == 1
    gate.set()
    answers = [asyncio.run(futures.retrieve(rid)) for rid in (running, queued, other)]
    assert answers[0] == {"ran": True} and answers[2] == {"ran": True}
    cancelled = answers[1]
    assert isinstance(cancelled, dict) and cancelled["category"] == "user"
    assert "cancelled (its session ended)" in cancelled["error"]
    futures.close()


def test_a_closed_service_client_ends_its_session(service):
    closing = sdk_client(service)
    closing.create_lora_training_client(base_model="tiny", rank=2).result()
    session_id = closing.holder.get_session_id()
    closing.close("success").result()  # the SDK posts /sessions/{id}/finish
    service.service.futures.run(lambda: None).result()
    assert session_id not in service.service.sessions
    assert service.service.expired[session_id] == "finished by its client"
    assert not [key for key in service.service.models if key.startswith(f"{session_id}:")]
