"""`relayrl serve` route by route, through the unchanged `tinker` SDK (ServiceClient, TrainingClient,
SamplingClient) against one service on the tiny random model: capabilities, sessions, create_model and get_info,
forward_backward with each served loss (its value checked against the Tinker docs' formula, by hand), optim_step's Adam
parameters, save_weights_for_sampler -> sample (seeds, stops, log-probs equal to forward's on the same weights),
compute_logprobs, save_state/load_state and a training client made from a saved state."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import tinker
import torch
from tinker import types

from tests.unit import service_fixtures
from tests.unit.service_fixtures import datum

client, service = service_fixtures.client, service_fixtures.service  # this module's own service (module-scoped)

RANK = 4


@pytest.fixture(scope="module")
def trainer(client):
    return client.create_lora_training_client(base_model="tiny", rank=RANK, seed=0).result()


@pytest.fixture(scope="module")
def tokens(trainer):
    return trainer.get_tokenizer().encode("3+4=7")


def forward_logprobs(trainer, tokens) -> np.ndarray:
    out = trainer.forward([datum(tokens)], "cross_entropy").result()
    return out.loss_fn_outputs[0]["logprobs"].to_numpy()


def test_capabilities_list_the_served_base_with_its_context(service):
    caps = tinker.RestClient(base_url=service.url, api_key=service.api_key).get_server_capabilities().result()
    assert [(m.model_name, m.max_context_length, m.trainable) for m in caps.supported_models] == [("tiny", 256, True)]


def test_create_model_makes_a_lora_adapter_of_the_asked_rank_and_get_info_names_it(trainer, random_model_dir):
    info = trainer.get_info()
    assert (info.model_data.model_name, info.is_lora, info.lora_rank) == ("tiny", True, RANK)
    assert info.model_data.tokenizer_id == str(random_model_dir)  # the cookbook's get_tokenizer loads this path


def test_cross_entropy_loss_is_the_weighted_sum_of_the_target_logprobs_and_training_lowers_it(trainer, tokens):
    weights = [0.0] + [1.0] * (len(tokens) - 2)
    losses = []
    for _ in range(4):
        out = trainer.forward_backward([datum(tokens, weights=weights)], "cross_entropy").result()
        logprobs = out.loss_fn_outputs[0]["logprobs"].to_numpy()
        assert out.metrics["loss:sum"] == pytest.approx(-float(np.dot(logprobs, weights)), rel=1e-5)
        losses.append(out.metrics["loss:sum"])
        trainer.optim_step(types.AdamParams(learning_rate=3e-3)).result()
    assert losses[-1] < losses[0] - 0.5, losses


def test_importance_sampling_and_ppo_follow_their_formulas(trainer, tokens):
    logprobs = forward_logprobs(trainer, tokens)
    advantages = np.linspace(0.5, 1.5, len(tokens) - 1).astype(np.float32)
    same = trainer.forward([datum(tokens, logprobs=logprobs, advantages=advantages)], "importance_sampling").result()
    assert same.metrics["loss:sum"] == pytest.approx(-advantages.sum(), rel=1e-4)  # ratio 1
    doubled = datum(tokens, logprobs=logprobs - math.log(2.0), advantages=advantages)  # ratio 2 everywhere
    ppo = trainer.forward([doubled], "ppo").result()
    assert ppo.metrics["loss:sum"] == pytest.approx(-1.2 * advantages.sum(), rel=1e-4)  # clipped at 1 + 0.2
    wide = trainer.forward([doubled], "ppo", loss_fn_config={"clip_high_threshold": 3.0}).result()
    assert wide.metrics["loss:sum"] == pytest.approx(-2.0 * advantages.sum(), rel=1e-4)


def test_cispo_weighs_logp_by_the_clipped_ratio(trainer, tokens):
    """Tinker's cispo: -(sg(clip(r, low, high)) * logp * A).sum(); at r = 2 the weight is the clip, 1.2."""
    logprobs = forward_logprobs(trainer, tokens)
    advantages = np.linspace(0.5, 1.5, len(tokens) - 1).astype(np.float32)
    doubled = datum(tokens, logprobs=logprobs - math.log(2.0), advantages=advantages)
    out = trainer.forward([doubled], "cispo").result()
    assert out.metrics["loss:sum"] == pytest.approx(-1.2 * float(np.dot(logprobs, advantages)), rel=1e-4)
    wide = trainer.forward([doubled], "cispo", loss_fn_config={"clip_high_threshold": 3.0}).result()
    assert wide.metrics["loss:sum"] == pytest.approx(-2.0 * float(np.dot(logprobs, advantages)), rel=1e-4)


def test_dro_adds_half_beta_times_the_squared_log_ratio(trainer, tokens):
    """Tinker's dro: -(logp * A - beta / 2 * (logp - q) ** 2).sum(); here logp - q = 0.5 on every token."""
    logprobs = forward_logprobs(trainer, tokens)
    advantages = np.linspace(-1.0, 1.0, len(tokens) - 1).astype(np.float32)
    shifted = datum(tokens, logprobs=logprobs - 0.5, advantages=advantages)
    out = trainer.forward([shifted], "dro", loss_fn_config={"beta": 0.1}).result()
    expected = -float(np.dot(logprobs, advantages)) + 0.5 * 0.1 * 0.25 * len(advantages)
    assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-5)


def test_gspo_gives_every_token_the_sequence_ratio_over_the_masked_tokens(trainer, tokens):
    """Tinker's gspo (GSPO-token): every token's ratio is s = exp(mean of logp - q over sequence_ratio_mask), then
    the ppo surrogate. The mask marks the last two tokens, log-ratios 0 and 2 log 2: s = 2 whatever the unmasked
    tokens' own log-ratio (3 here), so the loss is -1.2 * A.sum() clipped and -2 * A.sum() with a wide clip."""
    logprobs = forward_logprobs(trainer, tokens)
    n = len(tokens) - 1
    log_ratio = np.full(n, 3.0, dtype=np.float32)
    log_ratio[-2:] = [0.0, 2 * math.log(2.0)]
    mask = np.zeros(n, dtype=np.float32)
    mask[-2:] = 1.0
    advantages = np.linspace(0.5, 1.5, n).astype(np.float32)
    seq = datum(tokens, logprobs=logprobs - log_ratio, advantages=advantages, sequence_ratio_mask=mask)
    out = trainer.forward([seq], "gspo").result()
    assert out.metrics["loss:sum"] == pytest.approx(-1.2 * advantages.sum(), rel=1e-4)
    wide = trainer.forward([seq], "gspo", loss_fn_config={"clip_high_threshold": 3.0}).result()
    assert wide.metrics["loss:sum"] == pytest.approx(-2.0 * advantages.sum(), rel=1e-4)


def test_forward_backward_custom_runs_the_callers_loss_over_served_logprobs(trainer, tokens):
    """The SDK runs a custom loss client-side: forward, the caller's loss on the log-probs, then cross_entropy with
    weights = -dC/dlogprobs. Here C = -2 * sum(logprobs): twice the cross-entropy of all-ones weights."""

    def doubled_nll(data, logprobs_list):
        loss = sum(-2.0 * lp.sum() for lp in logprobs_list)
        return loss, {"doubled_nll": float(loss)}

    expected = -2.0 * float(forward_logprobs(trainer, tokens).sum())
    out = trainer.forward_backward_custom([datum(tokens)], doubled_nll).result()
    assert out.metrics["doubled_nll"] == pytest.approx(expected, rel=1e-5)
    assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert -2.0 * float(forward_logprobs(trainer, tokens).sum()) < expected


def test_optim_step_takes_adam_parameters_per_call(trainer, tokens):
    start = forward_logprobs(trainer, tokens)
    trainer.forward_backward([datum(tokens)], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=0.0)).result()
    np.testing.assert_array_equal(forward_logprobs(trainer, tokens), start)  # lr 0: the weights did not move
    trainer.forward_backward([datum(tokens)], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=1e-2, grad_clip_norm=1.0)).result()
    assert not np.allclose(forward_logprobs(trainer, tokens), start)


def test_sample_serves_the_saved_weights_with_forwards_logprobs(trainer, client, tokens):
    """Token exactness (issue 48 item 4): at temperature 1 a sampled sequence's log-probs are what forward computes
    for it on the same weights."""
    trainer.forward_backward([datum(tokens)], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    path = trainer.save_weights_for_sampler("exact").result().path
    sampler = client.create_sampling_client(model_path=path).result()
    prompt = tokens[:3]
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=7, stop=[])
    result = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=3, sampling_params=params).result()
    assert len(result.sequences) == 3
    for seq in result.sequences:
        full = prompt + seq.tokens
        assert len(seq.logprobs) == len(seq.tokens) >= 1
        expected = forward_logprobs(trainer, full)[len(prompt) - 1 :]
        np.testing.assert_allclose(seq.logprobs, expected, atol=1e-4)
    again = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=3, sampling_params=params).result()
    assert [s.tokens for s in again.sequences] == [s.tokens for s in result.sequences]  # the seed fixes them


def test_compute_logprobs_equals_forward(trainer, client, tokens):
    sampler = trainer.save_weights_and_get_sampling_client().result()
    logprobs = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    assert logprobs[0] is None
    np.testing.assert_allclose(logprobs[1:], forward_logprobs(trainer, tokens), atol=1e-4)


def test_a_stop_token_or_string_ends_the_sequence_after_it(trainer, tokens):
    sampler = trainer.save_weights_and_get_sampling_client().result()
    free = types.SamplingParams(max_tokens=8, temperature=1.0, seed=3, stop=[])
    first = sampler.sample(types.ModelInput.from_ints(tokens[:2]), 1, free).result().sequences[0]
    stop_token = first.tokens[1]
    cut = first.tokens[: first.tokens.index(stop_token) + 1]
    stopped = types.SamplingParams(max_tokens=8, temperature=1.0, seed=3, stop=[stop_token])
    seq = sampler.sample(types.ModelInput.from_ints(tokens[:2]), 1, stopped).result().sequences[0]
    assert (seq.tokens, seq.stop_reason) == (cut, "stop")
    text = trainer.get_tokenizer().decode([stop_token])  # a character tokenizer: one token, one character
    by_string = types.SamplingParams(max_tokens=8, temperature=1.0, seed=3, stop=[text, "never"])
    seq = sampler.sample(types.ModelInput.from_ints(tokens[:2]), 1, by_string).result().sequences[0]
    assert (seq.tokens, seq.stop_reason) == (cut, "stop")
    assert first.stop_reason == "length" or first.tokens[-1] == trainer.get_tokenizer().eos_token_id


def test_base_model_sampling_is_the_base_not_the_trained_weights(client, trainer, tokens):
    base = client.create_sampling_client(base_model="tiny").result()
    trained = trainer.save_weights_and_get_sampling_client().result()
    base_lp = base.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    trained_lp = trained.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    assert not np.allclose(base_lp[1:], trained_lp[1:])  # the engine swapped weights between the two


def test_save_state_then_load_state_restores_the_weights(trainer, client, tokens):
    path = trainer.save_state("ckpt").result().path
    saved = forward_logprobs(trainer, tokens)
    trainer.forward_backward([datum(tokens)], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert not np.allclose(forward_logprobs(trainer, tokens), saved)
    trainer.load_state(path).result()
    np.testing.assert_array_equal(forward_logprobs(trainer, tokens), saved)
    restored = client.create_training_client_from_state_with_optimizer(path).result()
    assert restored.get_info().lora_rank == RANK
    np.testing.assert_array_equal(forward_logprobs(restored, tokens), saved)


def test_the_sdks_session_heartbeat_reaches_the_service(client, service):
    """Late in the module: the SDK beats every 10 s, so by now one has come or comes within one period."""
    session_id = client.holder.get_session_id()
    seen = service.service.sessions[session_id]
    deadline = time.monotonic() + 25
    while service.service.sessions[session_id] == seen and time.monotonic() < deadline:
        time.sleep(0.2)
    assert service.service.sessions[session_id] > seen


def test_full_weight_training_steps_and_its_state_round_trips(random_model_dir, tmp_path):
    """relayrl's extension where a request names no LoRA (`lora_config` None): every weight trains, and its
    checkpoint holds them all."""
    from relayrl.service.training import TrainedModel
    from relayrl.service.wire import Example, ForwardBackwardCall

    model = TrainedModel("m", "tiny", str(random_model_dir), lora=None)
    ids = [5, 6, 7, 8]
    example = Example(ids[:-1], {"target_tokens": np.array(ids[1:]), "weights": np.ones(3, dtype=np.float32)})
    call = ForwardBackwardCall("m", "cross_entropy", {}, False, [example])
    first = model.forward_backward(call)[1]["loss:sum"]
    model.optim_step(types.AdamParams(learning_rate=1e-2))
    model.save_state(tmp_path / "ckpt")
    saved = model.target_logprobs(ids[:-1], np.array(ids[1:])).detach()
    assert model.forward_backward(call)[1]["loss:sum"] < first
    model.optim_step(types.AdamParams(learning_rate=1e-2))
    model.load_state(tmp_path / "ckpt", optimizer=True)
    assert (model.target_logprobs(ids[:-1], np.array(ids[1:])).detach() == saved).all()
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["meta.json", "model.safetensors", "optimizer.pt"]


def test_a_batched_forward_backward_equals_one_call_per_datum(random_model_dir):
    """Data of different lengths go through the model padded in one batch: each datum's log-probs, the summed loss
    and the gradient equal those of one call per datum."""
    from relayrl.service.training import TrainedModel, lora_settings
    from relayrl.service.wire import Example, ForwardBackwardCall

    model = TrainedModel("m", "tiny", str(random_model_dir), lora_settings(4), seed=0)
    rows = [[5, 6, 7, 8], [9, 5], [4, 4, 6, 7, 8, 9, 5]]
    advantages = [0.5, -1.0, 2.0]
    examples = [
        Example(ids[:-1], {"target_tokens": np.array(ids[1:]), "logprobs": np.full(len(ids) - 1, -2.0, np.float32)})
        for ids in rows
    ]
    for example, advantage in zip(examples, advantages):
        example.inputs["advantages"] = np.full(len(example.tokens), advantage, np.float32)

    def run(data: list) -> tuple[list, float, list]:
        outputs, metrics = model.forward_backward(ForwardBackwardCall("m", "importance_sampling", {}, False, data))
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.trainable]
        model.optimizer.zero_grad(set_to_none=True)
        return [out["logprobs"] for out in outputs], metrics["loss:sum"], grads

    batched = run(examples)
    singles = [run([example]) for example in examples]
    for logprobs, single in zip(batched[0], singles):
        np.testing.assert_allclose(logprobs, single[0][0], atol=1e-5)
    assert batched[1] == pytest.approx(sum(single[1] for single in singles), rel=1e-5)
    for i, grad in enumerate(batched[2]):
        torch.testing.assert_close(grad, sum(single[2][i] for single in singles), atol=1e-5, rtol=1e-4)


def test_forward_backward_batches_hold_consecutive_data_within_the_logits_budget():
    from relayrl.service.training import BATCH_LOGITS, batches

    vocab = BATCH_LOGITS // 100  # 100 padded tokens per batch
    assert batches([10, 20, 30], vocab) == [[0, 1, 2]]  # 3 x 30 = 90
    assert batches([30, 40, 10], vocab) == [[0, 1], [2]]  # 3 x 40 = 120: the third starts a batch
    assert batches([150, 10], vocab) == [[0], [1]]  # over the budget alone: a batch of its own
