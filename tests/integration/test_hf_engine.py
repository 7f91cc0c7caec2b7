"""The HF `generate` fallback engine: same contract as vLLM's, behaviour log-probs of the sampled distribution."""

import torch

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
    from relayrl.sync.inprocess import InProcessSync

    config = Config.model_validate(
        {"model": {"path": str(random_model_dir)}, "rollout": {"engine": "hf"}, "sync": {"parity_probe": True}}
    )
    engine, learner = HFEngine(str(random_model_dir)), LearnerRole(config)
    probe = engine.tokenizer("12+7=19 3+45=48", add_special_tokens=False)["input_ids"]
    theirs = engine.prompt_logprobs(probe)
    assert len(theirs) == len(probe) - 1
    torch.testing.assert_close(torch.tensor(theirs), torch.tensor(learner.sequence_logprobs(probe)), atol=1e-5, rtol=0)
    sync = InProcessSync(probe_ids=probe)
    sync.push(learner, LocalEngineGroup(engine))
    assert sync.last["sync/parity_abs_max"] < 1e-5
