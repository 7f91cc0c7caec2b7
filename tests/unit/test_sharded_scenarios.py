"""The rank side of test_sharded_learner.py (no tests here): what each spawned learner rank runs, in order, in
one process group. Rank 0 writes each scenario's results to `{out_dir}/{name}.pt` and names it on the queue."""

from __future__ import annotations

from pathlib import Path

import torch

from relayrl.algorithms.advantages import grpo, make_inputs
from relayrl.config import load_config
from relayrl.learner.batching import make_experience
from relayrl.placement.sections import learner_settings
from relayrl.types import Prompt, Rollout, Score

WORLD = 2
OBJECTIVES = {
    "token_mean": [],
    "seq_mean_token_mean": ["algorithm.loss_agg=seq_mean_token_mean"],
    "seq_mean_token_sum_norm": ["algorithm.loss_agg=seq_mean_token_sum_norm", "rollout.max_tokens=8"],
    # the reference is sharded too; KL and entropy in the loss share the normaliser
    "kl_entropy": ["algorithm.kl.coef=0.1", "algorithm.entropy_coef=0.01", "algorithm.kl.controller=adaptive"],
    # the other forward layouts: each group packed into one row, the model's own logits
    "packed_logits": ["train.packing=groups", "train.logits_chunk=0"],
}
# a step whose trajectories forked (groups of 5, 4, 6 and 4 rows), rollout.n=5 so that its 19 rows are one
# mini-batch at W=1 (and 10 on each rank): the KL in the reward (old and reference log-probs and the penalty filled
# by prepare, joined before the advantages), its adaptive coefficient fast enough to show the rows it counts; and
# groups packed into rows within a token budget (the ranks' micro-batches evened out, a padding row packed too)
FORKED = {
    "forks_kl": [
        "rollout.n=5",
        "algorithm.kl.coef=0.1",
        "algorithm.kl.placement=reward",
        "algorithm.kl.controller=adaptive",
        "algorithm.kl.horizon=100",
    ],
    "forks_packed": ["rollout.n=5", "train.packing=groups", "train.micro_batch_tokens=40"],
}
FORKS_PER_GROUP = (1, 0, 2, 0)
LOGGED_ROWS = 12  # the step's logged rows: rank 0's 9 (not its padding row) and rank 1's first 3
BUCKET_MB = 0.02  # ~20 KiB buckets: the tiny model (~190 KiB) spans many


def config(model_dir, extra=()):
    overrides = [f"model.path={model_dir}", "rollout.n=4", "rollout.prompts_per_step=4", "train.lr=1e-3"]
    budget = any(o.startswith("train.micro_batch_tokens=") for o in extra)
    return load_config(None, overrides + ([] if budget else ["train.micro_batch=4"]) + list(extra))


def assert_same_first_step(got: dict, want: dict, before: dict, lr: float = 1e-3) -> None:
    """W ranks' weights after one AdamW step (`got`) equal one learner's (`want`), both from `before`. AdamW's first
    step moves an element by lr * g / (|g| + eps): by lr exactly (the sign of g) unless |g| is within ~10x of eps
    (1e-8), where the float noise of another reduction order moves it by more than 1e-5 (measured: one element of
    83k, 1.2e-5 apart). Those are compared at the step's own scale; every other element, and every weight that did
    not move, to 1e-5; and they must stay rare, so that a broken gradient (near zero everywhere) cannot hide."""
    elements, fragile = 0, 0
    for name, param in want.items():
        step = (param - before[name]).abs()
        settled = (step > 0.9 * lr) | (step < 1e-7)
        assert torch.allclose(got[name][settled], param[settled], atol=1e-5, rtol=0), name
        assert torch.allclose(got[name][~settled], param[~settled], atol=2 * lr, rtol=0), name
        elements, fragile = elements + step.numel(), fragile + int((~settled).sum())
    assert fragile <= elements // 1000, (fragile, elements)


def experience(seed=0, groups=4, n=4, vocab=16):
    """Ragged prompts (3..6 tokens) and responses (1..7 tokens), rewards that vary within each group."""
    gen = torch.Generator().manual_seed(seed)
    rollouts, scores = [], []
    for g in range(groups):
        prompt = Prompt(id=f"p{g}", text="", token_ids=torch.randint(4, vocab, (3 + g,), generator=gen).tolist())
        for i in range(n):
            length = 1 + (3 * g + 2 * i + seed) % 7
            response = torch.randint(4, vocab, (length,), generator=gen).tolist()
            rollouts.append(Rollout(prompt, i, response, "", [-1.5] * length, "stop", [0] * length))
            scores.append(Score(float((g + i + seed) % 2) + 0.1 * i))
    exp = make_experience(rollouts, scores, pad_id=0)
    exp.advantages, _ = grpo(make_inputs(exp.rewards, exp.loss_mask, exp.group_ids))
    return exp


def forked_experience(seed=0, n=4, vocab=16):
    """Groups of `n` trajectories, trajectory 0 of group g forked FORKS_PER_GROUP[g] times: its last sample starts
    from a rebuilt (longer) prompt, its forks (fork_of=0, the tokens sampled before each rebuilt call, from the
    group's prompt) come after the group's members, with its reward. No advantages yet (`with_advantages`).
    Returns (experience, rollouts)."""
    gen = torch.Generator().manual_seed(seed)

    def sample(prompt, index, length, fork_of=None):
        response = torch.randint(4, vocab, (length,), generator=gen).tolist()
        return Rollout(prompt, index, response, "", [-1.5] * length, "stop", [0] * length, fork_of=fork_of)

    rollouts, scores = [], []
    for g, forks in enumerate(FORKS_PER_GROUP):
        prompt = Prompt(id=f"p{g}", text="", token_ids=torch.randint(4, vocab, (3 + g,), generator=gen).tolist())
        rebuilt = Prompt(id=prompt.id, text="", token_ids=prompt.token_ids + [5, 6]) if forks else prompt
        rollouts += [sample(rebuilt if i == 0 else prompt, i, 1 + (3 * g + 2 * i + seed) % 7) for i in range(n)]
        rollouts += [sample(prompt, n + k, 2 + k, fork_of=0) for k in range(forks)]
        rewards = [float((g + i + seed) % 2) + 0.1 * i for i in range(n)]
        scores += [Score(r) for r in rewards] + [Score(rewards[0])] * forks
    return make_experience(rollouts, scores, pad_id=0), rollouts


def with_advantages(exp, rollouts):
    """GRPO advantages over each group's trajectories, with the KL penalty that `prepare` put in the rewards."""
    from relayrl.algorithms.stage import estimate_advantages

    return estimate_advantages(grpo, False, exp, rollouts)


def share(seed: int, rank: int):
    from relayrl.learner.process_group import split_by_groups

    return split_by_groups(experience(seed), WORLD)[rank]


def rank_main(rank, port, model_dir, single_checkpoint, out_dir, results):
    from relayrl.learner.process_group import leave_learner_group
    from relayrl.learner.sharded import sharded_learner

    torch.set_num_threads(1)

    def learner(objective):
        overrides = FORKED[objective] if objective in FORKED else OBJECTIVES[objective]
        return sharded_learner(
            learner_settings(config(model_dir, overrides)), rank, WORLD, "127.0.0.1", port, timeout_s=60
        )

    def publish(name, value):
        if rank == 0:
            torch.save(value, f"{out_dir}/{name}.pt")  # (a queue would share memory with an exited process)
            results.put(name)

    for objective in OBJECTIVES:
        trained = learner(objective)
        publish(objective, step(trained, share(0, rank), "loss/policy"))
    for forked in FORKED:
        publish(forked, forked_step(learner(forked), rank))
    publish("sync", sync(trained, rank, model_dir, Path(out_dir)))
    publish("resume", resume(learner, rank, single_checkpoint, Path(out_dir)))
    publish("round_trip", round_trip(learner, rank))
    leave_learner_group()
    publish("end", None)


def step(learner, part, loss_name):
    """(full weights, global loss, grad norm) after one update on this rank's share."""
    from relayrl.learner.process_group import all_reduce_sum

    stats = learner.update(0, learner.prepare(part)).metrics
    loss = all_reduce_sum(stats[loss_name])  # each rank's loss is its part of the global sum
    return {n: t.clone() for n, t in learner.named_weights()}, loss, stats["actor/grad_norm"]


def forked_step(learner, rank):
    """A step with forks as placement/learner_ranks.py runs it (the batch split by whole groups and padded, each
    rank's results joined), the ranks' parts exchanged with all_gather_object: the prepared batch, the joined
    result, the full weights and the KL coefficient after the step."""
    import torch.distributed as dist

    from relayrl.learner.process_group import merge_experience, merge_results, sample_rows_of, split_by_groups

    def everyone(mine):
        found = [None] * WORLD
        dist.all_gather_object(found, mine)
        return found

    exp, rollouts = forked_experience()
    exp = merge_experience(exp, everyone(learner.prepare(split_by_groups(exp, WORLD)[rank])))
    parts = split_by_groups(with_advantages(exp, rollouts), WORLD)
    result = learner.update(0, parts[rank], sample_rows_of(parts, LOGGED_ROWS)[rank])
    merged = merge_results(everyone(result), [float(p.loss_mask.sum()) for p in parts])
    weights = {n: t.clone() for n, t in learner.named_weights()}
    return exp, merged, weights, learner.policy.objective.kl_controller.coef


def sync(learner, rank, model_dir, out_dir):
    """Push the trained shards to an HF engine on rank 0, each transport in one call: disk (a safetensors file
    written bucket by bucket), shm (segments filled bucket by bucket)."""
    from relayrl.rollout.hf_engine import HFEngine
    from relayrl.sync.transports import make_receiver

    layout = learner.weight_layout(BUCKET_MB, "fp32")
    probe = [1, 5, 9, 4, 7, 12, 6, 8, 10]
    found = {"bucket_bytes": max(layout.bucket_sizes) * 4, "model_bytes": layout.nbytes}
    for version, transport in enumerate(("disk", "shm"), start=1):
        engine = HFEngine(str(model_dir)) if rank == 0 else None
        before = engine.prompt_logprobs(probe) if rank == 0 else None
        learner.open_sender(transport, layout, True, 60.0, str(out_dir / "sync"), None)
        receiver = make_receiver(transport, layout) if rank == 0 else None
        manifest = learner.send_weights(version)
        if rank == 0:
            engine.load_weights(receiver.receive(manifest), version)
        if transport == "disk" and rank == 0:
            found["peak_bytes"] = learner.sender.held.peak
        learned = learner.sequence_logprobs(probe)  # every rank runs the forward
        if rank == 0:
            found[transport] = (learned, engine.prompt_logprobs(probe), before)
        learner.close_sender()
    return found


def resume(learner, rank, single_checkpoint, out_dir):
    """1 -> 2: today's checkpoint into two ranks; 2 -> 2: a sharded checkpoint written and read back. Each then
    takes the second step (the first resumed one)."""
    resumed = learner("kl_entropy")
    resumed.load_state(single_checkpoint, torch.load(f"{single_checkpoint}/trainer_state.pt", weights_only=False))
    weights, loss, _ = step(resumed, share(1, rank), "loss/total")
    found = {"1->2": (loss, weights)}
    first = learner("kl_entropy")
    step(first, share(0, rank), "loss/total")
    path = first.checkpoint(out_dir / "sharded_run", 0, {"version": 1}, keep=1)
    again = learner("kl_entropy")
    again.load_state(path, torch.load(f"{path}/trainer_state.pt", weights_only=False))
    weights, loss, _ = step(again, share(1, rank), "loss/total")
    found["2->2"] = (loss, weights)
    again.save(out_dir / "final_run")  # the run's final model, gathered: <run>/model
    found["sharded_checkpoint"] = path
    return found


def round_trip(learner, rank):
    """learner.offload=between_phases on FSDP2 ranks: two steps with the states moved out and back between them,
    and the same two steps without. Returns the bytes all ranks moved, whether every parameter and AdamW moment
    left its storage, and for each run the second step's loss, the weights and a forward's log-probs after it."""
    from relayrl.learner.offload import learner_states
    from relayrl.learner.process_group import all_reduce_sum

    def storages(trained):  # per tensor: a tensor's copy is made while it lives, so it cannot take its address
        models, optimizers = learner_states(trained)
        tensors = [p for m in models if m is not None for p in m.parameters()]
        tensors += [v for o in optimizers if o is not None for s in o.state.values() for v in s.values() if v.dim()]
        return [t.to_local().untyped_storage().data_ptr() for t in tensors]

    found = {}
    for label in ("kept", "moved"):
        trained = learner("kl_entropy")
        step(trained, share(0, rank), "loss/total")
        if label == "moved":
            before = storages(trained)
            found["moved_bytes"] = all_reduce_sum(float(trained.offload_states()))
            found["left_storage"] = all(a != b for a, b in zip(storages(trained), before, strict=True))
            trained.reload_states()
        weights, loss, _ = step(trained, share(1, rank), "loss/total")
        found[label] = (loss, weights, trained.sequence_logprobs([1, 5, 9, 4, 7, 12, 6, 8, 10]))
    return found
