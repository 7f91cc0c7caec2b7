"""Several clients of one `relayrl serve` at once (issue 48 item 3), through the unchanged SDK: two LoRA adapters on
one base train and sample without mixing weights, a teacher sampler on a second base stays the base while a student
trains beside it, and the SDK's async use (awaiting its futures, eight samples in flight) gives what the same
requests give one at a time; a service restarted on the same state directory resumes a saved state."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from tinker import types

from tests.unit.service_fixtures import datum, sdk_client

TOKENS = [5, 6, 7, 8, 9, 10]


@pytest.fixture(scope="module")
def client(random_model_dir, tmp_path_factory):
    from relayrl.service import server

    bases = {"student": str(random_model_dir), "teacher": str(random_model_dir)}
    running = server.start(bases, tmp_path_factory.mktemp("service_state"))
    yield sdk_client(running)
    running.stop()


def forward(trainer) -> np.ndarray:
    return trainer.forward([datum(TOKENS)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()


def train(trainer, steps: int = 2) -> None:
    for _ in range(steps):
        trainer.forward_backward([datum(TOKENS)], "cross_entropy").result()
        trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()


def served(sampler) -> np.ndarray:
    return np.array(sampler.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()[1:])


def test_two_adapters_on_one_base_keep_their_own_weights(client):
    first = client.create_lora_training_client(base_model="student", rank=4, seed=1).result()
    second = client.create_lora_training_client(base_model="student", rank=4, seed=2).result()
    untouched = forward(second)
    train(first)
    np.testing.assert_array_equal(forward(second), untouched)  # the first's steps did not reach the second
    first_sampler = first.save_weights_and_get_sampling_client().result()
    second_sampler = second.save_weights_and_get_sampling_client().result()
    for _ in range(2):  # alternating: the engine swaps the weights each time
        np.testing.assert_allclose(served(first_sampler), forward(first), atol=1e-4)
        np.testing.assert_allclose(served(second_sampler), untouched, atol=1e-4)


def test_a_teacher_on_a_second_base_stays_the_base_beside_a_training_student(client):
    teacher = client.create_sampling_client(base_model="teacher").result()
    before = served(teacher)
    student = client.create_lora_training_client(base_model="student", rank=4).result()
    base = forward(student)  # B = 0: the fresh adapter is the base
    np.testing.assert_allclose(before, base, atol=1e-4)
    train(student)
    student_sampler = student.save_weights_and_get_sampling_client().result()
    assert not np.allclose(served(student_sampler), before, atol=1e-3)
    np.testing.assert_allclose(served(teacher), before, atol=1e-6)


def test_async_use_and_eight_samples_in_flight_match_one_at_a_time(client):
    trainer = client.create_lora_training_client(base_model="student", rank=4).result()

    async def loop():
        fwd = await trainer.forward_backward([datum(TOKENS)], "cross_entropy")
        await trainer.optim_step(types.AdamParams(learning_rate=1e-2))
        sampler = await trainer.save_weights_and_get_sampling_client()
        prompt = types.ModelInput.from_ints(TOKENS[:2])
        params = [types.SamplingParams(max_tokens=5, temperature=1.0, seed=s, stop=[]) for s in range(8)]
        together = await asyncio.gather(*(sampler.sample(prompt, 2, p) for p in params))
        return fwd, sampler, prompt, params, together

    fwd, sampler, prompt, params, together = asyncio.run(loop())
    assert fwd.metrics["loss:sum"] > 0
    alone = [sampler.sample(prompt, 2, p).result() for p in params]
    assert [[s.tokens for s in r.sequences] for r in together] == [[s.tokens for s in r.sequences] for r in alone]
    assert len({tuple(r.sequences[0].tokens) for r in alone}) > 1  # the seeds differ, so do the samples


def test_a_restarted_service_resumes_from_save_state_on_the_same_state_dir(random_model_dir, tmp_path):
    from relayrl.service import server

    first = server.start({"student": str(random_model_dir)}, tmp_path)
    trainer = sdk_client(first).create_lora_training_client(base_model="student", rank=4)
    trainer = trainer.result()
    train(trainer)
    path = trainer.save_state("before-restart").result().path
    saved, first_id = forward(trainer), trainer.get_info().model_id
    first.stop()  # the process that held the model is gone
    second = server.start({"student": str(random_model_dir)}, tmp_path)
    try:
        client = sdk_client(second)
        resumed = client.create_training_client_from_state_with_optimizer(path).result()
        np.testing.assert_array_equal(forward(resumed), saved)
        assert resumed.get_info().model_id != first_id  # its own saves cannot overwrite the first's checkpoints
        train(resumed, steps=1)  # and it trains on from there
        assert not np.array_equal(forward(resumed), saved)
    finally:
        second.stop()


def test_sample_requests_queued_together_share_an_engine_call_and_each_gets_what_it_gets_alone(
    random_model_dir, tmp_path
):
    """The cookbook sends a step's prompts as one request each: those waiting on the worker together run in one
    engine call per sampling (their prompts of different lengths, each request's seed and stops its own), and each
    answers what it answers alone; one with other settings (max_tokens) gets a call of its own."""
    import threading
    import time

    from relayrl.service import server

    running = server.start({"student": str(random_model_dir)}, tmp_path)
    try:
        sampler = sdk_client(running).create_sampling_client(base_model="student").result()
        prompts = [[5, 6], [7, 8, 9, 10], [11], [5, 6]]
        params = [types.SamplingParams(max_tokens=6, temperature=1.0, seed=s, stop=[]) for s in range(4)]
        params[1] = types.SamplingParams(max_tokens=6, temperature=1.0, seed=1, stop=[9])
        params.append(types.SamplingParams(max_tokens=3, temperature=1.0, seed=9, stop=[]))
        prompts.append([6, 7])
        asks = [(types.ModelInput.from_ints(p), 2, q) for p, q in zip(prompts, params)]
        alone = [sampler.sample(*ask).result() for ask in asks]  # the engine is built by the first
        engine, calls = running.service.engines.served["student"].engine, []
        generate = engine.generate
        spy = lambda prompts, *rest: calls.append(len(prompts)) or generate(prompts, *rest)  # noqa: E731
        engine.generate = spy  # pyright: ignore[reportAttributeAccessIssue]
        gate = threading.Event()
        running.service.futures.run(gate.wait)  # the worker waits while the requests queue behind it
        futures = [sampler.sample(*ask) for ask in asks]
        deadline = time.monotonic() + 30
        while len(running.service.sample_queue.waiting) < len(asks) and time.monotonic() < deadline:
            time.sleep(0.01)
        gate.set()
        together = [future.result() for future in futures]
    finally:
        running.stop()
    assert sorted(calls) == [1, 4]  # max_tokens=3 alone; the other four in one call
    assert [[(s.tokens, s.stop_reason) for s in r.sequences] for r in together] == [
        [(s.tokens, s.stop_reason) for s in r.sequences] for r in alone
    ]
    for shared, single in zip(together, alone):
        for a, b in zip(shared.sequences, single.sequences):
            np.testing.assert_allclose(a.logprobs or [], b.logprobs or [], atol=1e-5)
    assert len({tuple(r.sequences[0].tokens) for r in alone}) > 1
