"""Sharded learner ranks built without loading the model on ranks > 0, the critic's global normaliser, and
FSDP2's mixed-precision policy (CPU/gloo, a tiny fp32 model).

Two ranks are spawned once and, in one process group: build a GAE learner with a KL reference (policy,
reference and critic all sharded) while rank 1 cannot read any weights file; gather its weights; take one
step; then take a step with bf16 parameters in the passes (FSDP2's MixedPrecisionPolicy over gloo). Rank 0
writes the results; the W=1 learner runs here. Token counts differ between the ranks (30 and 36), so a critic
loss averaged per rank instead of divided by the global count gives another loss and other gradients.
"""

from __future__ import annotations

import queue

import pytest
import torch
import torch.multiprocessing as mp

from tests.unit.test_sharded_learner import free_port
from tests.unit.test_sharded_scenarios import WORLD, config, experience

GAE = ["algorithm.advantage=gae", "algorithm.kl.coef=0.1", "critic.lr=1e-2"]


def gae_experience():
    exp = experience(seed=0)
    exp.returns = (exp.rewards[:, None] + 0.1 * torch.arange(exp.loss_mask.shape[1])) * exp.loss_mask
    return exp


def full_weights(learner) -> dict[str, dict[str, torch.Tensor]]:
    """policy, reference and critic: every parameter and buffer as a full tensor (a gather on sharded ranks)."""
    out = {}
    models = {"policy": learner.policy.model, "reference": learner.policy.reference, "critic": learner.critic.model}
    for role, model in models.items():
        tensors = {n: getattr(p, "full_tensor", p.detach)().detach().clone() for n, p in model.named_parameters()}
        tensors.update({f"buffer:{n}": b.clone() for n, b in model.named_buffers()})
        out[role] = tensors
    return out


def step(learner, exp) -> dict[str, float]:
    return learner.update(0, learner.prepare(exp))


def rank_main(rank, port, model_dir, out_dir, results):
    from transformers import PreTrainedModel

    from relayrl.learner import sharded
    from relayrl.learner.ranks import all_reduce_sum, leave_learner_group, split_by_groups

    torch.set_num_threads(1)
    if rank > 0:  # a rank other than 0 must build its models without reading the weights

        def refuse(cls, *args, **kwargs):
            raise AssertionError(f"learner rank {rank} read the weights of {cls.__name__}")

        PreTrainedModel.from_pretrained = classmethod(refuse)
    part = split_by_groups(gae_experience(), WORLD)[rank]
    learner = sharded.ShardedLearner(config(model_dir, GAE), rank, WORLD, "127.0.0.1", port, timeout_s=60)
    found = {"loaded": full_weights(learner), "tokens": all_reduce_sum(rank * float(part.loss_mask.sum()))}
    stats = step(learner, part)
    found["loss"] = all_reduce_sum(stats["loss/policy"])  # each rank's loss is its part of the global sum
    found["critic"] = (stats["critic/value_loss"], stats["critic/grad_norm"], full_weights(learner)["critic"])
    found["mixed"] = mixed_precision_step(sharded, rank, port, model_dir, part)
    if rank == 0:
        torch.save(found, f"{out_dir}/found.pt")
    leave_learner_group()
    results.put(rank)


def mixed_precision_step(sharded, rank, port, model_dir, part) -> dict:
    """One step with FSDP2 all-gathering bf16 parameters (what sharded_init.mixed_precision gives a GPU run)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    sharded.mixed_precision = lambda *_: MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    learner = sharded.ShardedLearner(config(model_dir, GAE), rank, WORLD, "127.0.0.1", port, timeout_s=60)
    seen = []
    layer = sharded.decoder_layers(learner.policy.model)[0]
    layer.register_forward_pre_hook(lambda module, _: seen.append(module.mlp.up_proj.weight.dtype))
    stats = step(learner, part)
    masters = {p.dtype for p in learner.policy.model.parameters()} | {
        v.dtype for s in learner.policy.optimizer.state.values() for v in s.values() if v.dim()
    }
    return {"pass_dtypes": set(seen), "master_dtypes": masters, "grad_norm": stats["actor/grad_norm"]}


@pytest.fixture(scope="module")
def found(random_model_dir, tmp_path_factory):
    ctx = mp.get_context("spawn")
    results, out_dir = ctx.Queue(), tmp_path_factory.mktemp("sharded_init")
    args = (free_port(), str(random_model_dir), str(out_dir), results)
    procs = [ctx.Process(target=rank_main, args=(r, *args)) for r in range(WORLD)]
    for p in procs:
        p.start()
    done = set()
    try:
        while len(done) < WORLD:
            try:
                done.add(results.get(timeout=1))
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                assert not dead, f"a learner rank exited with {dead[0]}"
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return torch.load(out_dir / "found.pt", weights_only=False)


@pytest.fixture(scope="module")
def single(random_model_dir):
    """The W=1 learner: its loaded weights, then one step on the whole batch."""
    from relayrl.learner.role import LearnerRole

    learner = LearnerRole(config(random_model_dir, GAE))
    loaded = full_weights(learner)
    return loaded, step(learner, gae_experience()), full_weights(learner)["critic"]


def test_ranks_hold_the_single_learners_weights_without_loading_them(found, single):
    """Rank 1 could not read a weights file, yet every rank holds exactly W=1's policy, reference and critic
    (buffers such as the rotary inv_freq included), and the first step's loss is W=1's."""
    loaded, stats, _ = single
    for role, tensors in loaded.items():
        assert found["loaded"][role].keys() == tensors.keys(), role
        for name, tensor in tensors.items():
            assert torch.equal(found["loaded"][role][name], tensor), f"{role} {name}"
    assert found["loss"] == pytest.approx(stats["loss/policy"], abs=1e-6)


def test_critic_update_does_not_depend_on_the_number_of_ranks(found, single):
    _, stats, critic = single
    assert found["tokens"] == 36.0  # rank 1's response tokens; rank 0 holds 30: a per-rank mean would differ
    loss, grad_norm, weights = found["critic"]
    assert loss == pytest.approx(stats["critic/value_loss"], rel=1e-5)
    assert grad_norm == pytest.approx(stats["critic/grad_norm"], rel=1e-5)
    for name, tensor in critic.items():
        assert torch.allclose(weights[name], tensor, atol=1e-5, rtol=0), name


def test_mixed_precision_passes_run_bf16_over_fp32_master_shards(found, single):
    mixed = found["mixed"]
    assert mixed["pass_dtypes"] == {torch.bfloat16}
    assert mixed["master_dtypes"] == {torch.float32}
    assert mixed["grad_norm"] == pytest.approx(single[1]["actor/grad_norm"], rel=0.05)  # W=1's, in bf16


def test_mixed_precision_policy_is_gpu_only():
    from relayrl.config import load_config
    from relayrl.learner.sharded_init import mixed_precision

    gpu = mixed_precision(load_config(None, []), "cuda")
    assert (gpu.param_dtype, gpu.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert mixed_precision(load_config(None, ["model.dtype=bfloat16"]), "cuda").param_dtype == torch.bfloat16
    assert mixed_precision(load_config(None, ["model.dtype=float32"]), "cuda") is None
    assert mixed_precision(load_config(None, []), "cpu") is None
