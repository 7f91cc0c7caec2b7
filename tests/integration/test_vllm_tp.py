"""A tensor-parallel vLLM engine (rollout.tensor_parallel=2, CPU backend, one core per rank): the same greedy
tokens and log-probs as one rank, and weight pushes that reach both ranks' shards (relayrl/rollout/vllm_tp.py).

The tiny model has 2 attention and 2 KV heads, so each rank holds one head, half of every MLP and half of
the (tied) vocabulary: a rank that kept its old shard would change every log-prob checked here. One
two-rank engine for the module (its start is the cost); it also serves LoRA adapters, which its start-up
check (a random adapter must change its log-probs) and the last test exercise through the ranks.
"""

import pytest
import torch

from relayrl.types import Prompt, Sampling

pytestmark = pytest.mark.vllm

IDS = [3, 4, 5, 6, 7, 8, 9, 10]


@pytest.fixture(scope="module")
def config(random_model_dir):
    from relayrl.config import load_config

    lora = ["model.lora.rank=4", "model.lora.alpha=8", "train.lr=1e-2", "sync.lora=adapter"]
    return load_config(None, [f"model.path={random_model_dir}", "rollout.tensor_parallel=2", *lora])


@pytest.fixture(scope="module")
def engines(config):
    from relayrl.placement.sections import engine_settings
    from relayrl.rollout.vllm_engine import VLLMEngine

    path = str(config.model.path)
    one = VLLMEngine(path, max_model_len=64, seed=0)
    two = VLLMEngine(path, max_model_len=64, seed=0, adapter=engine_settings(config).adapter(), tensor_parallel=2)
    yield one, two
    # the rank processes (and their KV caches) end with this module: told now, not waited for (vLLM's own
    # shutdown waits up to 5 s for them; at exit it finds them gone)
    for worker in two.llm.llm_engine.engine_core.engine_core.model_executor.workers:
        worker.death_writer.close()


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
    assert two.llm.collective_rpc("relayrl_unlink_shm") == [0, 0]  # the ranks' segments lost their names at start
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
    before = torch.tensor(two.prompt_logprobs(IDS))
    torch.testing.assert_close(before, hf_logprobs(hf_model, IDS), atol=1e-4, rtol=0)

    new = perturbed(hf_model, 1.3)
    named = [(n, p.detach()) for n, p in new.named_parameters()]
    two.load_base_weights(iter(named))  # what a full or merged push runs (this engine also serves adapters)
    one.load_weights(iter(named), version=1)
    after = torch.tensor(two.prompt_logprobs(IDS))
    assert (after - before).abs().max() > 0.05
    torch.testing.assert_close(after, hf_logprobs(new, IDS), atol=1e-4, rtol=0)
    greedy = Sampling.greedy(max_tokens=8)
    assert [r.response_ids for r in two.generate(prompts, greedy, 1)] == [
        r.response_ids for r in one.generate(prompts, greedy, 1)
    ]

    newer = perturbed(hf_model, 0.7)
    load_weights_tp(two.llm, ((n, p.detach()) for n, p in newer.named_parameters()), bucket_bytes=4096)
    torch.testing.assert_close(torch.tensor(two.prompt_logprobs(IDS)), hf_logprobs(newer, IDS), atol=1e-4, rtol=0)
    two.load_base_weights((n, p.detach()) for n, p in hf_model.named_parameters())  # the base back


def test_a_broadcast_push_lands_in_every_worker(engines, hf_model):
    """`sync.transport=broadcast` into vLLM: this process is the learner (rank 0 of a gloo group under the strict
    device check), the one-rank engine's worker rank 1 and the two-rank engine's workers ranks 2 and 3; every
    worker receives and verifies the buckets itself, and every shard then serves the pushed weights."""
    from concurrent.futures import ThreadPoolExecutor

    from relayrl.sync.buckets import layout_of
    from relayrl.sync.group import join_group
    from relayrl.sync.remote import free_port
    from relayrl.sync.transports import WorkerMembership, make_sender

    one, two = engines
    new = perturbed(hf_model, 1.2)
    named = [(n, p.detach()) for n, p in new.named_parameters()]
    layout = layout_of(named, 0.05, "fp32")  # several buckets: a layer may arrive across two
    assert len(layout.bucket_sizes) > 2
    port, world = free_port(), 4
    with ThreadPoolExecutor(3) as pool:
        learner = pool.submit(join_group, "127.0.0.1", port, 0, world, 60.0)
        joins = [pool.submit(one.join_weight_group, WorkerMembership("127.0.0.1", port, 1, world, 60.0))]
        joins.append(pool.submit(two.join_weight_group, WorkerMembership("127.0.0.1", port, 2, world, 60.0)))
        group = learner.result(timeout=120)
        [join.result(timeout=120) for join in joins]
    assert group.device == torch.device("cpu") and group.backend == "gloo"
    sender = make_sender("broadcast", layout, True, group, 60.0)
    one.open_weight_receivers(layout, True)
    two.open_weight_receivers(layout, True)
    before = torch.tensor(two.prompt_logprobs(IDS))
    with ThreadPoolExecutor(2) as pool:
        sent = pool.submit(sender.send, iter(named), 7)
        received = pool.submit(one.receive_broadcast, 7)
        two.receive_broadcast(7)
        manifest, _ = sent.result(timeout=120), received.result(timeout=120)
    assert manifest.checksums is not None and len(manifest.checksums) == len(layout.bucket_sizes)
    assert one.version == two.version == 7
    expected = hf_logprobs(new, IDS)
    assert (torch.tensor(two.prompt_logprobs(IDS)) - before).abs().max() > 0.05
    torch.testing.assert_close(torch.tensor(two.prompt_logprobs(IDS)), expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(torch.tensor(one.prompt_logprobs(IDS)), expected, atol=1e-4, rtol=0)
    for engine in engines:  # the base back, and no group left in the workers
        engine.load_base_weights((n, p.detach()) for n, p in hf_model.named_parameters())
        engine.join_weight_group(None)


def test_an_adapter_on_two_ranks_serves_what_its_merged_weights_do(engines, hf_model, config):
    from relayrl.models import lora

    one, two = engines
    copy = type(hf_model)(hf_model.config)
    copy.load_state_dict(hf_model.state_dict())  # the base both engines hold now
    peft = lora.add_adapter(copy, config.model.lora)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    base = torch.tensor(two.prompt_logprobs(IDS))
    two.load_weights(lora.adapter_tensors(peft), version=3)  # a new adapter, registered on both ranks
    one.load_weights(lora.merged_tensors(peft), version=3)  # the same update as full weights, on one rank
    served = torch.tensor(two.prompt_logprobs(IDS))
    assert (served - base).abs().max() > 0.05 and two.version == 3
    torch.testing.assert_close(served, torch.tensor(one.prompt_logprobs(IDS)), atol=1e-3, rtol=0)


def test_a_corrupt_broadcast_push_breaks_the_engine_and_never_strands_the_learner(engines, hf_model, prompts):
    """A bucket whose bytes changed after the learner hashed them: the worker names it, the engine refuses to serve
    from then on (a push that failed part-way), and the learner's broadcast completes instead of waiting on a worker
    that stopped receiving. Last in the module: it breaks the one-rank engine."""
    from concurrent.futures import ThreadPoolExecutor

    from relayrl.errors import SyncError
    from relayrl.sync.buckets import checksum, layout_of
    from relayrl.sync.group import join_group
    from relayrl.sync.remote import free_port
    from relayrl.sync.transports import BroadcastSender, WorkerMembership

    class Corrupting(BroadcastSender):  # bucket 1 arrives other than the sender hashed it
        def checksum_of(self, index, bucket):
            return checksum(bucket) ^ (index == 1)

    one, _ = engines
    named = [(n, p.detach()) for n, p in hf_model.named_parameters()]
    layout = layout_of(named, 0.05, "fp32")
    port = free_port()
    with ThreadPoolExecutor(1) as pool:
        learner = pool.submit(join_group, "127.0.0.1", port, 0, 2, 60.0)
        one.join_weight_group(WorkerMembership("127.0.0.1", port, 1, 2, 60.0))
        sender = Corrupting(layout, True, learner.result(timeout=120), 60.0)
        one.open_weight_receivers(layout, True)
        sent = pool.submit(sender.send, iter(named), 9)
        with pytest.raises(SyncError, match=r"a weight push failed part-way .*bucket 1 of policy version 9 is corrupt"):
            one.receive_broadcast(9)
        sent.result(timeout=30)  # the learner's side finished: the worker received the rest of the push
    with pytest.raises(SyncError, match="this vLLM engine cannot serve: a weight push failed part-way"):
        one.generate(prompts, Sampling.greedy(max_tokens=4), 9)
