"""The HF `generate` fallback engine: same contract as vLLM's, behaviour log-probs of the sampled distribution."""

from dataclasses import replace

import torch

from relayrl.placement.sections import learner_settings
from relayrl.rollout.hf_engine import HFEngine
from relayrl.types import Prompt, Sampling


def test_hf_engine_rollouts_and_logprob_parity(random_model_dir):
    engine = HFEngine(str(random_model_dir))
    tok = engine.tokenizer
    prompts = [
        Prompt(id=str(i), text=t, token_ids=tok(t, add_special_tokens=False)["input_ids"])
        for i, t in enumerate(["12+7=", "3+45="])
    ]  # different lengths: left padding is exercised
    rollouts = engine.generate(prompts, Sampling(n=3, temperature=0.7, max_tokens=5, seed=0), version=2)
    assert [r.prompt.id for r in rollouts] == ["0"] * 3 + ["1"] * 3
    for r in rollouts:
        ids = torch.tensor([r.prompt.token_ids + r.response_ids])
        with torch.no_grad():
            logits = engine.model(ids).logits[0, len(r.prompt.token_ids) - 1 : -1] / 0.7
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.response_ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(r.behaviour_logprobs), expected, atol=1e-4, rtol=0)
        assert r.versions == [2] * len(r.response_ids)
        if r.finish_reason == "stop":
            assert r.response_ids[-1] == tok.eos_token_id


def test_hf_engine_load_weights_changes_outputs(random_model_dir):
    engine = HFEngine(str(random_model_dir))
    ids = engine.tokenizer("12+7=", add_special_tokens=False)["input_ids"]
    prompt = Prompt(id="0", text="12+7=", token_ids=ids)
    before = engine.generate([prompt], Sampling.greedy(4), 0)[0].behaviour_logprobs
    scaled = ((n, p.detach() * 2) for n, p in engine.model.named_parameters())
    engine.load_weights(list(scaled), version=1)
    after = engine.generate([prompt], Sampling.greedy(4), 1)[0].behaviour_logprobs
    assert engine.version == 1 and before != after


def test_generate_leaves_the_global_rng_alone(random_model_dir):
    """A local learner shares torch's global generator with this engine: a generate must not reseed it."""
    engine = HFEngine(str(random_model_dir))
    ids = engine.tokenizer("12+7=", add_special_tokens=False)["input_ids"]
    prompt = Prompt(id="0", text="12+7=", token_ids=ids)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = engine.generate([prompt], Sampling(n=4, temperature=1.0, max_tokens=5, seed=7), 0)
    assert torch.equal(torch.get_rng_state(), state)
    unseeded = engine.generate([prompt], Sampling(n=4, temperature=1.0, max_tokens=5), 0)
    assert torch.equal(torch.get_rng_state(), state) and len(unseeded) == 4
    again = engine.generate([prompt], Sampling(n=4, temperature=1.0, max_tokens=5, seed=7), 0)
    assert [r.response_ids for r in again] == [r.response_ids for r in first]  # the request's seed still rules


def test_parity_probe_runs_with_the_hf_engine(random_model_dir):
    from relayrl.config import Config
    from relayrl.learner.role import LearnerRole
    from relayrl.rollout.local_group import LocalEngineGroup
    from relayrl.sync.guard import PushGuard
    from relayrl.sync.inprocess import InProcessSync

    config = Config.model_validate({"model": {"path": str(random_model_dir)}, "rollout": {"engine": "hf"}})
    engine, learner = HFEngine(str(random_model_dir)), LearnerRole(learner_settings(config))
    probe = engine.tokenizer("12+7=19 3+45=48", add_special_tokens=False)["input_ids"]
    theirs = engine.prompt_logprobs(probe)
    assert len(theirs) == len(probe) - 1
    torch.testing.assert_close(torch.tensor(theirs), torch.tensor(learner.sequence_logprobs(probe)), atol=1e-5, rtol=0)
    sync, engines, guard = InProcessSync(), LocalEngineGroup(engine), PushGuard(0.05, probe)
    guard.before_push(learner)
    sync.push(learner, engines)
    guard.after_push(engines, sync)
    assert guard.last["sync/parity_abs_max"] < 1e-5


def test_a_sampled_row_draws_the_same_tokens_whatever_batch_it_shares(random_model_dir):
    """Each row samples from its own stream, seeded per request: a prompt's samples are the same alone or
    batched beside another prompt (of another length: other padding), given the same request seeds."""
    engine = HFEngine(str(random_model_dir))
    a, b = (Prompt(t, t, engine.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in ("12+7=", "3+45+6="))
    sampling = Sampling(n=3, temperature=1.0, max_tokens=10)
    together = engine.generate([a, b], replace(sampling, seeds=(11, 29)), version=0)
    alone = engine.generate([b], replace(sampling, seeds=(29,)), version=0)
    assert [r.response_ids for r in together[3:]] == [r.response_ids for r in alone]
    assert len({tuple(r.response_ids) for r in together}) > 2  # six rows, six streams


def test_batched_turns_draw_by_trajectory_and_turn_not_by_arrival(random_model_dir):
    """BatchTurns (HF generate, Ray engines) batches whatever turns are queued: the same turns queued in other
    orders and batchings draw the same tokens (the multi-turn driver's keys are trajectory numbers)."""
    from relayrl.rollout.local_group import LocalEngineGroup
    from relayrl.sources.turn_requests import turn_requests

    engine = HFEngine(str(random_model_dir))
    prompt = engine.tokenizer("12+7=", add_special_tokens=False)["input_ids"]
    sampled = Sampling(n=1, temperature=1.0, max_tokens=10, seed=5)

    def draw(batches):
        turns, drawn = turn_requests(LocalEngineGroup(engine)), {}
        for batch in batches:
            for key in batch:
                turns.submit(key, prompt, sampled)
            drawn.update((k, tuple(out.token_ids)) for k, out in turns.step())
        return drawn

    assert draw([[0, 1, 2]]) == draw([[2], [1, 0]]) == draw([[1], [2], [0]])
    assert len(set(draw([[0, 1, 2]]).values())) == 3  # three trajectories, three streams
