"""A tensor-parallel vLLM engine (rollout.tensor_parallel=2, CPU backend, one core per rank): the same greedy
tokens and log-probs as one rank, and weight pushes that reach both ranks' shards (relayrl/rollout/vllm_tp.py).

The tiny model has 2 attention and 2 KV heads, so each rank holds one head, half of every MLP and half of
the (tied) vocabulary: a rank that kept its old shard would change every log-prob checked here.
"""

import pytest
import torch

from relayrl.rollout.base import Sampling
from relayrl.types import Prompt

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def engines(random_model_dir):
    from relayrl.rollout.vllm_engine import VLLMEngine

    one = VLLMEngine(str(random_model_dir), max_model_len=64, seed=0)
    two = VLLMEngine(str(random_model_dir), max_model_len=64, seed=0, tensor_parallel=2)
    yield one, two
    two.llm.llm_engine.engine_core.shutdown()  # the rank processes (and their KV caches) end with this module


@pytest.fixture(scope="module")
def hf_model(random_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts():
    return [Prompt(id=str(i), text="", token_ids=ids) for i, ids in enumerate([[3, 4, 5], [7, 8, 9, 10], [11, 3]])]


def hf_logprobs(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


def perturbed(model, scale: float):
    """A copy of `model` with every tensor changed (so every rank's shard of it changes)."""
    new = type(model)(model.config)
    new.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(int(scale * 100))
    with torch.no_grad():
        for param in new.parameters():
            param.mul_(scale).add_(0.02 * torch.randn(param.shape, generator=generator))
    return new.eval()


def test_two_ranks_generate_what_one_does(engines, prompts):
    one, two = engines
    assert two.llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size == 2
    greedy = Sampling.greedy(max_tokens=8)
    a, b = one.generate(prompts, greedy, 0), two.generate(prompts, greedy, 0)
    assert [r.response_ids for r in a] == [r.response_ids for r in b]
    for x, y in zip(a, b):
        torch.testing.assert_close(
            torch.tensor(y.behaviour_logprobs), torch.tensor(x.behaviour_logprobs), atol=1e-4, rtol=0
        )


def test_pushed_weights_reach_every_rank(engines, hf_model, prompts):
    """The parity probe's check (engine prompt log-probs = the learner's) after pushes of new weights, both in
    one RPC bucket and in many small ones (a fused qkv / gate_up layer then arrives across several calls)."""
    from relayrl.rollout.vllm_tp import load_weights_tp

    one, two = engines
    ids = [3, 4, 5, 6, 7, 8, 9, 10]
    before = torch.tensor(two.prompt_logprobs(ids))
    torch.testing.assert_close(before, hf_logprobs(hf_model, ids), atol=1e-4, rtol=0)

    new = perturbed(hf_model, 1.3)
    named = [(n, p.detach()) for n, p in new.named_parameters()]
    two.load_weights(iter(named), version=1)
    one.load_weights(iter(named), version=1)
    after = torch.tensor(two.prompt_logprobs(ids))
    assert (after - before).abs().max() > 0.05 and two.version == 1
    torch.testing.assert_close(after, hf_logprobs(new, ids), atol=1e-4, rtol=0)
    greedy = Sampling.greedy(max_tokens=8)
    assert [r.response_ids for r in two.generate(prompts, greedy, 1)] == [
        r.response_ids for r in one.generate(prompts, greedy, 1)
    ]

    newer = perturbed(hf_model, 0.7)
    load_weights_tp(two.llm, ((n, p.detach()) for n, p in newer.named_parameters()), bucket_bytes=4096)
    torch.testing.assert_close(torch.tensor(two.prompt_logprobs(ids)), hf_logprobs(newer, ids), atol=1e-4, rtol=0)
