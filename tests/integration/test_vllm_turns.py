"""Multi-turn turns through vLLM's own request/step loop (`VLLMTurns`, relayrl/sources/turn_requests.py) on a real tiny
engine (CPU build): a local vLLM engine declares the loop (`EngineGroup.request_loop`), a turn submitted while
another is generating joins the running batch, and under greedy decoding every turn's tokens are exactly what
the engine's batch `generate` gives for the same prompt ids."""

import pytest

from relayrl.types import Prompt, Sampling

pytestmark = pytest.mark.vllm


def test_turns_interleave_in_the_request_loop_and_match_generate(random_model_dir):
    from transformers import AutoTokenizer

    from relayrl.rollout.local_group import LocalEngineGroup
    from relayrl.rollout.vllm_engine import VLLMEngine
    from relayrl.sources.turn_requests import VLLMTurns, turn_requests

    engine = VLLMEngine(str(random_model_dir), max_model_len=64, seed=0)
    group = LocalEngineGroup(engine)
    assert group.request_loop is engine
    turns = turn_requests(group)
    assert isinstance(turns, VLLMTurns)
    tokenizer = AutoTokenizer.from_pretrained(random_model_dir)
    a, b = (tokenizer(text, add_special_tokens=False)["input_ids"] for text in ("12+7=", "3+45="))
    greedy = Sampling.greedy(max_tokens=8)

    turns.submit("a", a, greedy)
    first = turns.step()  # one decode step: "a" is running, not finished
    turns.submit("b", b, greedy)  # joins the running batch between two steps
    assert first == [] and turns.pending == 2
    done = {}
    while turns.pending:
        done.update(turns.step())
    # the second turn of "a": its prompt is the first prompt, the first turn's tokens and an observation
    a2 = a + done["a"].token_ids + tokenizer(" 1+1=", add_special_tokens=False)["input_ids"]
    turns.submit("a2", a2, greedy)
    while turns.pending:
        done.update(turns.step())

    reference = engine.generate([Prompt(k, "", ids) for k, ids in (("a", a), ("b", b), ("a2", a2))], greedy, 0)
    for key, rollout in zip(("a", "b", "a2"), reference):
        assert done[key].token_ids == rollout.response_ids
        assert len(done[key].logprobs) == len(done[key].token_ids) and done[key].versions == [0] * len(
            rollout.response_ids
        )


def test_a_turns_seed_follows_its_trajectory_not_the_order_turns_arrive(random_model_dir):
    """Environment steps return in any order, so turns reach the engine in any order: a sampled turn's seed
    is its trajectory's and turn's, and two runs that submit the same turns in opposite orders draw the same
    tokens. (Each turn runs alone here, so only the seeds can differ.)"""
    from transformers import AutoTokenizer

    from relayrl.rollout.local_group import LocalEngineGroup
    from relayrl.rollout.vllm_engine import VLLMEngine
    from relayrl.sources.turn_requests import turn_requests

    engine = VLLMEngine(str(random_model_dir), max_model_len=64, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(random_model_dir)
    prompt = tokenizer("12+7=", add_special_tokens=False)["input_ids"]
    sampled = Sampling(n=1, temperature=1.0, max_tokens=12, seed=5)

    def draw(order):
        turns, drawn = turn_requests(LocalEngineGroup(engine)), {}
        for key in order:
            turns.submit(key, prompt, sampled)
            while turns.pending:
                drawn.update((k, out.token_ids) for k, out in turns.step())
        return drawn

    forward, backward = draw([0, 1, 2]), draw([2, 1, 0])
    assert forward == backward
    assert len({tuple(tokens) for tokens in forward.values()}) > 1  # three trajectories, three streams
