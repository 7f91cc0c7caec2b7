"""FSDP2 learner ranks on CPU/gloo: the update does not depend on W or on the micro-batch split, a sync from
shards reaches an engine intact within two buckets of extra memory, and checkpoints resume at another W.

Two ranks are spawned once (torch.multiprocessing) and run every scenario in one process group
(test_sharded_scenarios.py); the single-process learner runs here. With train.micro_batch=4 on 16 ragged
responses the single learner does 4 micro-batches and each rank 2 (its 8 rows): (W, micro-batches) =
(1, 4) and (2, 2).
"""

from __future__ import annotations

import queue
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from relayrl.placement.sections import learner_settings
from relayrl.sync.remote import free_port
from tests.unit.test_sharded_scenarios import (
    FORKED,
    LOGGED_ROWS,
    OBJECTIVES,
    WORLD,
    assert_same_first_step,
    config,
    experience,
    forked_experience,
    rank_main,
    with_advantages,
)


def run_ranks(target, args: tuple, finished) -> None:
    """WORLD spawned ranks `target(rank, *args, results)`; returns once `finished(set of what they put on
    results)`, failing at once, with its exit code, when a rank dies."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, *args, results)) for r in range(WORLD)]
    for p in procs:
        p.start()
    done = set()
    try:
        while not finished(done):
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


def single_step(learner, exp) -> dict:
    return learner.update(0, learner.prepare(exp)).metrics


def params(learner) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in learner.policy.model.named_parameters()}


@pytest.fixture(scope="module")
def single_checkpoint(random_model_dir, tmp_path_factory):
    """One learner step at W=1, checkpointed today's way, then the uninterrupted second step."""
    from relayrl.learner.role import LearnerRole

    learner = LearnerRole(learner_settings(config(random_model_dir, OBJECTIVES["kl_entropy"])))
    single_step(learner, experience(seed=0))
    run_dir = tmp_path_factory.mktemp("single_run")
    path = learner.checkpoint(run_dir, 0, {"version": 1}, keep=1)
    stats = single_step(learner, experience(seed=1))
    return path, stats["loss/total"], params(learner)


@pytest.fixture(scope="module")
def ranks(random_model_dir, single_checkpoint, tmp_path_factory):
    """Every scenario's results, written by rank 0 as {name}.pt under one directory."""
    out_dir = tmp_path_factory.mktemp("sharded")
    args = (free_port(), str(random_model_dir), str(single_checkpoint[0]), str(out_dir))
    run_ranks(rank_main, args, lambda done: "end" in done)
    return lambda name: torch.load(out_dir / f"{name}.pt", weights_only=False)


@pytest.mark.parametrize("objective", list(OBJECTIVES))
def test_one_step_matches_single_learner(random_model_dir, ranks, objective):
    from relayrl.learner.role import LearnerRole

    single = LearnerRole(learner_settings(config(random_model_dir, OBJECTIVES[objective])))
    before = params(single)
    stats = single_step(single, experience())
    sharded, loss, grad_norm = ranks(objective)
    # a wrong normaliser that scales every rank alike leaves AdamW's first step unchanged, but not these
    assert loss == pytest.approx(stats["loss/policy"], rel=1e-5, abs=1e-7)
    assert grad_norm == pytest.approx(stats["actor/grad_norm"], rel=1e-5)
    assert_same_first_step(sharded, params(single), before)
    moved = max(float((param - before[name]).abs().max()) for name, param in params(single).items())
    assert moved > 5e-4  # the step did move the weights (lr 1e-3)


@pytest.mark.parametrize("scenario", list(FORKED))
def test_a_step_with_forks_matches_single_learner(random_model_dir, ranks, scenario):
    """Groups of 5, 4, 6 and 4 rows: rank 0 takes 9 rows and a padding row, rank 1 10. The joined batch, losses,
    metrics, logged rows, adaptive KL coefficient and weights are one learner's on the 19 rows."""
    from relayrl.learner.role import LearnerRole

    single = LearnerRole(learner_settings(config(random_model_dir, FORKED[scenario])))
    before = params(single)
    exp, rollouts = forked_experience()
    exp = with_advantages(single.prepare(exp), rollouts)
    want = single.update(0, exp, LOGGED_ROWS)
    joined, got, weights, coef = ranks(scenario)
    trained = exp.loss_mask.bool()
    for name in ("loss/policy", "loss/total", "actor/grad_norm", "actor/entropy", "actor/ratio_mean"):
        assert got.metrics[name] == pytest.approx(want.metrics[name], rel=1e-5, abs=1e-7), name
    if scenario == "forks_packed":
        assert got.metrics["learner/packed_frac"] == want.metrics["learner/packed_frac"] == 1.0
    else:
        for name in ("old_logprobs", "ref_logprobs", "reward_penalty"):
            torch.testing.assert_close(getattr(joined, name)[trained], getattr(exp, name)[trained], atol=1e-5, rtol=0)
        assert got.metrics["actor/kl"] == pytest.approx(want.metrics["actor/kl"], abs=1e-7)
        assert got.metrics["actor/kl_coef"] == want.metrics["actor/kl_coef"]
        # the controller counts the batch's 19 rows, not the padding row: 0.1 * (1 - 0.2 * 19 / 100)
        assert coef == pytest.approx(single.policy.objective.kl_controller.coef, rel=1e-9)
        assert coef == pytest.approx(0.1 * (1 - 0.2 * 19 / 100), rel=1e-6)
    assert got.mismatch.keys() == want.mismatch.keys()
    for version, (gap_sum, gap_max, tokens) in want.mismatch.items():
        assert got.mismatch[version][2] == tokens
        assert got.mismatch[version][:2] == pytest.approx((gap_sum, gap_max), rel=1e-5), version
    assert got.sample_logprobs is not None and want.sample_logprobs is not None
    assert len(got.sample_logprobs) == len(want.sample_logprobs) == LOGGED_ROWS
    for row, (g, w) in enumerate(zip(got.sample_logprobs, want.sample_logprobs)):  # a rank's rows: its width
        mask = trained[row, : len(g)]
        assert int(mask.sum()) == int(trained[row].sum()) > 0
        torch.testing.assert_close(torch.tensor(g)[mask], torch.tensor(w)[: len(g)][mask], atol=1e-5, rtol=0)
    assert_same_first_step(weights, params(single), before)


def test_engine_logprobs_equal_learner_after_sync_from_shards(ranks):
    found = ranks("sync")
    for transport in ("disk", "shm"):
        learner, engine, before = found[transport]
        assert max(abs(a - b) for a, b in zip(learner, engine)) < 1e-5, transport
        assert max(abs(a - b) for a, b in zip(before, engine)) > 1e-4, transport  # the weights did change
    # rank 0 held at most the reused bucket buffer and one bucket's gathered tensors, of a model much larger
    assert found["peak_bytes"] <= 2 * found["bucket_bytes"]
    assert found["model_bytes"] > 4 * found["bucket_bytes"]


def test_resume_at_another_world_size(random_model_dir, ranks, single_checkpoint):
    """1 -> 2 (today's checkpoint into two ranks) and 2 -> 1 (sharded into one plain process): the first
    resumed step's loss and weights match the uninterrupted run's."""
    from relayrl.learner.dist_checkpoint import load_any
    from relayrl.learner.role import LearnerRole
    from relayrl.models.loading import load_causal_lm

    _, loss, weights = single_checkpoint
    found = ranks("resume")
    for label in ("1->2", "2->2"):
        got_loss, got_weights = found[label]
        assert got_loss == pytest.approx(loss, rel=1e-5, abs=1e-7), label
        assert all(torch.allclose(got_weights[n], w, atol=1e-5, rtol=0) for n, w in weights.items()), label
    final = load_causal_lm(Path(found["sharded_checkpoint"]).parents[2] / "final_run" / "model")
    assert all(torch.allclose(p.detach(), weights[n], atol=1e-5, rtol=0) for n, p in final.named_parameters())
    learner = LearnerRole(learner_settings(config(random_model_dir, OBJECTIVES["kl_entropy"])))
    path = found["sharded_checkpoint"]
    load_any(learner, path, torch.load(f"{path}/trainer_state.pt", weights_only=False))
    stats = single_step(learner, experience(seed=1))
    assert stats["loss/total"] == pytest.approx(loss, rel=1e-5, abs=1e-7)
    assert all(torch.allclose(params(learner)[n], w, atol=1e-5, rtol=0) for n, w in weights.items())


def test_export_of_a_sharded_checkpoint_is_the_single_learners_model(
    random_model_dir, ranks, single_checkpoint, tmp_path
):
    from relayrl.learner.dist_checkpoint import export_sharded
    from relayrl.models.loading import load_causal_lm

    exported = load_causal_lm(export_sharded(ranks("resume")["sharded_checkpoint"], tmp_path, random_model_dir))
    saved = load_causal_lm(f"{single_checkpoint[0]}/model")  # W=1 after the same first step
    for (name, got), (_, want) in zip(exported.named_parameters(), saved.named_parameters()):
        assert torch.allclose(got, want, atol=1e-5, rtol=0), name


def test_states_moved_out_and_back_between_steps_train_as_if_kept(random_model_dir, ranks):
    """learner.offload=between_phases on two FSDP2 ranks (CPU, gloo): the move out copies every shard and AdamW
    moment into new storage, the ranks together move the whole learner once (policy, fp32 reference, AdamW's m and
    v: 16 bytes a parameter), and the next step's loss, weights and a later forward equal those of ranks that kept
    their states (a forward reading a stale shard would differ)."""
    from relayrl.models.loading import load_causal_lm

    found = ranks("round_trip")
    assert found["left_storage"]
    parameters = sum(p.numel() for p in load_causal_lm(random_model_dir).parameters())
    assert found["moved_bytes"] == 16 * parameters
    (kept_loss, kept_weights, kept_logprobs), (loss, weights, logprobs) = found["kept"], found["moved"]
    assert loss == kept_loss and logprobs == kept_logprobs
    assert all(torch.equal(weights[name], kept) for name, kept in kept_weights.items())
