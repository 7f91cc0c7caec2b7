"""Bad input to `relayrl serve` (issue 48 item 5) through the unchanged `tinker` SDK: each mistake raises the SDK's
own error with a message naming the key, datum or route, and the service goes on serving (a good request after
each one succeeds)."""

from __future__ import annotations

import pytest
import tinker
from tinker import types

from tests.unit import service_fixtures

client, service = service_fixtures.client, service_fixtures.service  # this module's own service (module-scoped)


@pytest.fixture(scope="module")
def trainer(client):
    return client.create_lora_training_client(base_model="tiny", rank=2).result()


TOKENS = [5, 6, 7, 8, 9]


def datum(inputs: dict, tokens=TOKENS) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


GOOD = {"target_tokens": TOKENS[1:], "weights": [1.0] * 4}
RL = {"target_tokens": TOKENS[1:], "logprobs": [-1.0] * 4, "advantages": [1.0] * 4}
EVERY_KEY = {**GOOD, **RL, "sequence_ratio_mask": [1.0] * 4}  # a datum good for every served loss


def still_serves(trainer) -> None:
    out = trainer.forward([datum(GOOD)], "cross_entropy").result()
    assert out.metrics["loss:sum"] > 0


@pytest.mark.parametrize(
    ("inputs", "loss", "message"),
    [
        ({"target_tokens": TOKENS[1:]}, "cross_entropy", "data[1].loss_fn_inputs: cross_entropy needs 'weights'"),
        ({**GOOD, "weights": [1.0] * 3}, "cross_entropy", "data[1].loss_fn_inputs['weights']: 3 values for 4 input"),
        ({**GOOD, "target_tokens": [5, 6, 7, 10_000]}, "cross_entropy", "token 10000 is outside the vocabulary"),
        (GOOD, "importance_sampling", "importance_sampling needs 'logprobs'"),
        ({**RL, "sequence_ratio_mask": [0.0] * 4}, "gspo", "data[1].loss_fn_inputs['sequence_ratio_mask']: marks no"),
        (GOOD, "stable_reinforce", "loss_fn='stable_reinforce': not served here; its objective is not public"),
    ],
    ids=["missing-key", "wrong-length", "outside-vocab", "loss-needs-more", "gspo-empty-mask", "unpublished-loss"],
)
def test_a_bad_datum_fails_its_request_naming_it_and_adds_no_gradient(trainer, inputs, loss, message):
    before = trainer.forward([datum(GOOD)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    with pytest.raises(tinker.RequestFailedError, match=message.replace("[", r"\[").replace("]", r"\]")):
        trainer.forward_backward([datum(EVERY_KEY), datum(inputs)], loss).result()  # the good datum first
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after = trainer.forward([datum(GOOD)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    assert after == before  # the failed request's good datum added no gradient either
    still_serves(trainer)


@pytest.mark.parametrize(
    ("loss", "config", "message"),
    [
        ("dro", {}, "loss_fn_config: dro needs 'beta'"),
        ("cispo", {"clip_low_threshold": 1.5}, "needs 0 < clip_low_threshold <= 1 <= clip_high_threshold"),
        ("ppo", {"clip_high_threshold": "wide"}, "loss_fn_config['clip_high_threshold']='wide': must be a number"),
    ],
    ids=["dro-without-beta", "clip-outside-range", "clip-not-a-number"],
)
def test_a_bad_loss_fn_config_fails_its_request_naming_the_key(trainer, loss, config, message):
    with pytest.raises(tinker.RequestFailedError, match=message.replace("[", r"\[").replace("]", r"\]")):
        trainer.forward_backward([datum(RL)], loss, loss_fn_config=config).result()
    still_serves(trainer)


def test_an_unknown_base_model_is_refused_naming_the_served_ones(client, trainer):
    with pytest.raises(tinker.BadRequestError, match=r"base_model='nope': not served here \(served: tiny"):
        client.create_lora_training_client(base_model="nope", rank=2).result()
    still_serves(trainer)


def test_an_unknown_sampler_path_and_checkpoint_are_not_found(client, trainer):
    with pytest.raises(tinker.NotFoundError, match="no sampler weights saved under it"):
        client.create_sampling_client(model_path="tinker://s9:train:9/sampler_weights/x").result()
    with pytest.raises(tinker.NotFoundError, match="no checkpoint saved there"):
        client.create_training_client_from_state("tinker://s9:train:9/weights/x").result()
    still_serves(trainer)


def test_a_prompt_past_the_context_or_outside_the_vocabulary_fails_its_sample(trainer):
    sampler = trainer.save_weights_and_get_sampling_client().result()
    long = types.ModelInput.from_ints([5] * 250)
    with pytest.raises(tinker.RequestFailedError, match="exceed the model's context of 256 tokens"):
        sampler.sample(long, 1, types.SamplingParams(max_tokens=16)).result()
    with pytest.raises(tinker.RequestFailedError, match="prompt: token 99999 is outside the vocabulary"):
        sampler.sample(types.ModelInput.from_ints([5, 99999]), 1, types.SamplingParams(max_tokens=2)).result()
    seq = sampler.sample(types.ModelInput.from_ints([5, 6]), 1, types.SamplingParams(max_tokens=2)).result()
    assert len(seq.sequences[0].tokens) >= 1


def test_a_route_not_served_answers_the_sdks_not_found_naming_it(service):
    rest = tinker.RestClient(base_url=service.url, api_key=service.api_key)
    with pytest.raises(tinker.NotFoundError, match="/api/v1/training_runs: relayrl's Tinker service does not serve it"):
        rest.list_training_runs().result()


def test_a_wrong_api_key_is_refused(service):
    with pytest.raises(tinker.AuthenticationError, match="X-API-Key: not this service's key"):
        client = tinker.ServiceClient(base_url=service.url, api_key="tml-wrong")
        client.create_lora_training_client(base_model="tiny", rank=2).result()


def test_old_unnamed_sampler_weights_are_dropped_with_a_message_named_ones_stay(trainer):
    from relayrl.service.state import KEEP_EPHEMERAL

    named = trainer.save_weights_for_sampler("kept").result().path
    samplers = [trainer.save_weights_and_get_sampling_client().result() for _ in range(KEEP_EPHEMERAL + 1)]
    prompt, params = types.ModelInput.from_ints([5, 6]), types.SamplingParams(max_tokens=2)
    with pytest.raises(tinker.RequestFailedError, match=f"its weights were dropped .*newest {KEEP_EPHEMERAL} unnamed"):
        samplers[0].sample(prompt, 1, params).result()
    assert samplers[-1].sample(prompt, 1, params).result().sequences
    assert trainer.create_sampling_client(named).result().sample(prompt, 1, params).result().sequences
