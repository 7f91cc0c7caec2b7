"""FSDP2 learner ranks on CPU/gloo: one step's update does not depend on W or on the micro-batch split.

Two ranks are spawned once (torch.multiprocessing) and build one sharded learner per objective in the same
process group; the single-process learner runs here. With train.micro_batch=4 on 16 ragged responses the
single learner does 4 micro-batches and each rank 2 (its 8 rows): (W, micro-batches) = (1, 4) and (2, 2).
"""

from __future__ import annotations

import queue
import socket

import pytest
import torch
import torch.multiprocessing as mp

from relayrl.algorithms.advantages import grpo, make_inputs
from relayrl.config import load_config
from relayrl.learner.batching import make_experience
from relayrl.types import Prompt, Rollout, Score

WORLD = 2
OBJECTIVES = {
    "token_mean": [],
    "seq_mean_token_mean": ["algorithm.loss_agg=seq_mean_token_mean"],
    "seq_mean_token_sum_norm": ["algorithm.loss_agg=seq_mean_token_sum_norm", "rollout.max_tokens=8"],
    # the reference is sharded too; KL and entropy in the loss share the normaliser
    "kl_entropy": ["algorithm.kl.coef=0.1", "algorithm.entropy_coef=0.01", "algorithm.kl.controller=adaptive"],
}


def config(model_dir, extra=()):
    overrides = [f"model.path={model_dir}", "rollout.n=4", "rollout.prompts_per_step=4", "train.lr=1e-3"]
    return load_config(None, overrides + ["train.micro_batch=4", *extra])


def experience(groups=4, n=4, vocab=16):
    """Ragged prompts (3..6 tokens) and responses (1..7 tokens), rewards that vary within each group."""
    gen = torch.Generator().manual_seed(0)
    rollouts, scores = [], []
    for g in range(groups):
        prompt = Prompt(id=f"p{g}", text="", token_ids=torch.randint(4, vocab, (3 + g,), generator=gen).tolist())
        for i in range(n):
            length = 1 + (3 * g + 2 * i) % 7
            response = torch.randint(4, vocab, (length,), generator=gen).tolist()
            rollouts.append(Rollout(prompt, i, response, "", [-1.5] * length, "stop", [0] * length))
            scores.append(Score(float((g + i) % 2) + 0.1 * i))
    exp = make_experience(rollouts, scores, pad_id=0)
    exp.advantages, _ = grpo(make_inputs(exp.rewards, exp.loss_mask, exp.group_ids))
    return exp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, port, model_dir, out_dir, results):
    from relayrl.learner.ranks import all_reduce_sum, leave_learner_group, split_by_groups
    from relayrl.learner.sharded import ShardedLearner

    torch.set_num_threads(1)
    share = split_by_groups(experience(), WORLD)[rank]
    for name, extra in OBJECTIVES.items():
        learner = ShardedLearner(config(model_dir, extra), rank, WORLD, "127.0.0.1", port, timeout_s=60)
        stats = learner.update(0, learner.prepare(share))
        loss = all_reduce_sum(stats["loss/policy"])  # each rank's loss is its part of the global sum
        full = {n: t.clone() for n, t in learner.named_weights()}  # every rank gathers
        if rank == 0:
            torch.save(
                (full, loss, stats["actor/grad_norm"]), f"{out_dir}/{name}.pt"
            )  # (a queue would share memory with an exited process)
            results.put(name)
    leave_learner_group()


@pytest.fixture(scope="module")
def sharded_results(random_model_dir, tmp_path_factory):
    ctx = mp.get_context("spawn")
    results, out_dir = ctx.Queue(), tmp_path_factory.mktemp("sharded")
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, port, str(random_model_dir), str(out_dir), results))
        for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    out = {}
    try:
        while len(out) < len(OBJECTIVES):
            try:
                name = results.get(timeout=1)
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                assert not dead, f"a learner rank exited with {dead[0]}"
                continue
            out[name] = torch.load(out_dir / f"{name}.pt")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return out


@pytest.mark.parametrize("objective", list(OBJECTIVES))
def test_one_step_matches_single_learner(random_model_dir, sharded_results, objective):
    from relayrl.learner.role import LearnerRole

    torch.set_num_threads(1)
    single = LearnerRole(config(random_model_dir, OBJECTIVES[objective]))
    before = {n: p.detach().clone() for n, p in single.policy.model.named_parameters()}
    stats = single.update(0, single.prepare(experience()))
    sharded, loss, grad_norm = sharded_results[objective]
    # a wrong normaliser that scales every rank alike leaves AdamW's first step unchanged, but not these
    assert loss == pytest.approx(stats["loss/policy"], rel=1e-5, abs=1e-7)
    assert grad_norm == pytest.approx(stats["actor/grad_norm"], rel=1e-5)
    moved = 0.0
    for name, param in single.policy.model.named_parameters():
        assert torch.allclose(sharded[name], param.detach(), atol=1e-5, rtol=0), name
        moved = max(moved, float((param.detach() - before[name]).abs().max()))
    assert moved > 5e-4  # the step did move the weights (lr 1e-3)
