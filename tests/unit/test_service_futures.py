"""The SDK's batch poller (`/api/v1/retrieve_futures`, relayrl/service/futures.py `Completions`): the service turns
it on, the unchanged SDK waits on it for each sample, and a poll answers the sampling session's finished, failed
and cancelled requests after its cursor, trimming those before it; a waiting poll is woken by the completion."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

from tinker import types

from tests.unit.service_fixtures import sdk_client


def done(result=None, cancelled: bool = False) -> Future:
    future: Future = Future()
    if cancelled:
        future.cancel()
    else:
        future.set_result(result)
    return future


def test_a_poll_answers_the_targets_completions_after_its_cursor():
    from relayrl.service.futures import Completions

    completions = Completions()
    mine, other = ("s-1:sample:0", 0), ("s-1:sample:1", 0)
    completions.add(mine, "req-1", done(b"proto"))
    completions.add(other, "req-2", done(b"proto"))
    completions.add(mine, "req-3", done({"error": "prompt: no tokens", "category": "user"}))
    completions.add(mine, "req-4", done(cancelled=True))
    first = asyncio.run(completions.retrieve(mine, 0, timeout=0))
    assert [(c["request_id"], c["state"]) for c in first["completions"]] == [
        ("req-1", "finished"),
        ("req-3", "failed"),
        ("req-4", "failed"),
    ]
    assert first["cursor"] == 4
    assert asyncio.run(completions.retrieve(mine, first["cursor"], timeout=0)) == {"completions": [], "cursor": 4}
    assert [c["request_id"] for c in asyncio.run(completions.retrieve(other, 0, timeout=0))["completions"]] == ["req-2"]
    completions.add(other, "req-5", done(b"proto"))
    completions.drop_session("s-1:")  # the session ended: its samplers' queues go
    assert completions.events == {}


def test_a_waiting_poll_is_woken_by_the_completion_instead_of_waiting_out_its_time():
    """A completion added on another thread (the worker's) wakes the poll waiting for it; a poll nothing comes for
    answers empty after its timeout and leaves no waiter behind."""
    import threading
    import time

    from relayrl.service.futures import WAIT_S, Completions

    completions, target = Completions(), ("s-1:sample:0", 0)

    async def poll() -> tuple[dict, float]:
        worker = threading.Thread(target=completions.add, args=(target, "req-1", done(b"proto")))
        asyncio.get_running_loop().call_later(0.05, worker.start)
        start = time.monotonic()
        answer = await completions.retrieve(target, 0, timeout=None)
        return answer, time.monotonic() - start

    answer, waited = asyncio.run(poll())
    assert [c["request_id"] for c in answer["completions"]] == ["req-1"]
    assert waited < WAIT_S  # woken, not timed out
    assert asyncio.run(completions.retrieve(target, answer["cursor"], timeout=0.1)) == {"completions": [], "cursor": 1}
    assert not completions.waiting.get(target)


def test_the_sdk_waits_on_the_sessions_poller_for_its_samples(random_model_dir, tmp_path):
    from relayrl.service import server

    running = server.start({"tiny": str(random_model_dir)}, tmp_path)
    polled = []
    retrieve = running.service.completions.retrieve

    async def spy(target, prev_cursor, timeout):
        polled.append(target)
        return await retrieve(target, prev_cursor, timeout)

    running.service.completions.retrieve = spy
    try:
        client = sdk_client(running)
        sampler = client.create_sampling_client(base_model="tiny").result()
        params = types.SamplingParams(max_tokens=3, temperature=1.0, seed=0)
        out = sampler.sample(types.ModelInput.from_ints([5, 6]), 2, params).result()
        assert len(out.sequences) == 2
        assert polled and set(polled) == {(sampler._sampling_session_id, 0)}  # one poller for the session
    finally:
        running.stop()
