"""FSDP2 learner ranks on image rows: W=2 ranks (CPU/gloo) give the update of one learner, within 1e-5 (loss,
grad norm, AdamW's first-step weights), with the vision tower frozen (`model.freeze_vision=true`: it stays as
loaded on both sides) and trained (`false`: FSDP2 shards and steps the vision blocks too).

A tiny Idefics3 (relayrl/models/tiny_vlm.py) with random weights reads four random 32x32 pictures; each prompt
gets 4 ragged responses of random text tokens (no image placeholders) with rewards that vary within the group.
16 rows at train.micro_batch=4: the single learner does 4 micro-batches, each rank 2 on its 2 groups.
The ranks rebuild the same Experience from the files on disk (the model dir, the prompts' jsonl and images).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import torch
from PIL import Image
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from relayrl.placement.sections import learner_settings
from relayrl.sync.remote import free_port
from tests.unit.test_sharded_learner import run_ranks
from tests.unit.test_sharded_scenarios import WORLD, assert_same_first_step, config

QUESTION = "How many red squares?"
GROUPS, N = 4, 4
CASES = {"frozen": True, "trained": False}  # case -> model.freeze_vision


def write_task(root: Path) -> None:
    """The tiny VLM in root/model; GROUPS image prompts in root/prompts.jsonl, their pictures in root/images."""
    from relayrl.models.tiny_vlm import build_tiny_vlm

    build_tiny_vlm([QUESTION, "0123456789"], root / "model", seed=0)
    (root / "images").mkdir()
    rows = []
    for g in range(GROUPS):
        pixels = np.random.default_rng(g).integers(0, 256, (32, 32, 3), dtype=np.uint8)
        Image.fromarray(pixels, "RGB").save(root / "images" / f"p{g}.png")
        content = [{"type": "image"}, {"type": "text", "text": QUESTION}]
        messages = [{"role": "user", "content": content}]
        rows.append({"id": f"p{g}", "messages": messages, "images": [f"images/p{g}.png"], "answer": str(g)})
    (root / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def image_experience(root: Path):
    """GROUPS x N rollouts on the image prompts: responses of 1..7 random text tokens, rewards varying in a group."""
    from relayrl.algorithms.advantages import grpo, make_inputs
    from relayrl.data.source import load_prompts
    from relayrl.data.vision import vision_token_ids
    from relayrl.learner.batching import make_experience
    from relayrl.models.loading import load_tokenizer
    from relayrl.types import Rollout, Score

    tokenizer = load_tokenizer(str(root / "model"))
    prompts, _ = load_prompts(root / "prompts.jsonl", tokenizer, 64)
    avoid = set(vision_token_ids(str(root / "model"))) | set(tokenizer.all_special_ids)
    text_ids = torch.tensor([i for i in range(len(tokenizer)) if i not in avoid])
    gen = torch.Generator().manual_seed(0)
    rollouts, scores = [], []
    for g, prompt in enumerate(prompts):
        assert prompt.image_inputs, "each prompt carries its pixel tensors"
        for i in range(N):
            length = 1 + (3 * g + 2 * i) % 7
            response = text_ids[torch.randint(len(text_ids), (length,), generator=gen)].tolist()
            rollouts.append(Rollout(prompt, i, response, "", [-1.5] * length, "stop", [0] * length))
            scores.append(Score(float((g + i) % 2) + 0.1 * i))
    exp = make_experience(rollouts, scores, pad_id=0)
    exp.advantages, _ = grpo(make_inputs(exp.rewards, exp.loss_mask, exp.group_ids))
    return exp


def case_config(root: Path, freeze: bool):
    return config(root / "model", [f"model.freeze_vision={str(freeze).lower()}"])


def rank_main(rank, port, root, out_dir, results):
    """One spawned rank: per case, one update on its share (whole groups); rank 0 saves (weights, loss, grad norm)
    as {case}.pt and names it on the queue."""
    from relayrl.learner.process_group import leave_learner_group, split_by_groups
    from relayrl.learner.sharded import sharded_learner

    torch.set_num_threads(1)
    root = Path(root)
    part = split_by_groups(image_experience(root), WORLD)[rank]
    assert part.images is not None and len(part.images) == len(part), "the share keeps its rows' images"
    for case, freeze in CASES.items():
        learner = sharded_learner(
            learner_settings(case_config(root, freeze)), rank, WORLD, "127.0.0.1", port, timeout_s=60
        )
        found = rank_step(learner, part)
        if rank == 0:
            torch.save(found, f"{out_dir}/{case}.pt")  # (a queue would share memory with an exited process)
            results.put(case)
    leave_learner_group()
    if rank == 0:
        results.put("end")


def rank_step(learner, part):
    """(every full weight, the global loss, the grad norm) after one update on this rank's share. The weights are
    gathered from the shards themselves: a push (`named_weights`) may leave a frozen tower out."""
    from relayrl.learner.process_group import all_reduce_sum

    stats = learner.update(0, learner.prepare(part)).metrics
    loss = all_reduce_sum(stats["loss/policy"])  # each rank's loss is its part of the global sum
    weights = {n: cast(DTensor, p).full_tensor().detach().clone() for n, p in learner.policy.model.named_parameters()}
    pushed = [name for name, _ in learner.named_weights()]  # every rank gathers each tensor, in step
    units = [name for name, module in learner.policy.model.named_modules() if isinstance(module, FSDPModule)]
    return weights, loss, stats["actor/grad_norm"], pushed, units


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vision_sharded")
    write_task(root)
    return root


@pytest.fixture(scope="module")
def ranks(task, tmp_path_factory):
    """Both cases on two ranks, spawned once: case -> (weights, loss, grad norm) of rank 0."""
    out_dir = tmp_path_factory.mktemp("vision_ranks")
    run_ranks(rank_main, (free_port(), str(task), str(out_dir)), lambda done: "end" in done)
    return {case: torch.load(out_dir / f"{case}.pt", weights_only=False) for case in CASES}


def params(learner) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in learner.policy.model.named_parameters()}


def max_gap(a: dict, b: dict, names) -> float:
    return max((float((a[n] - b[n]).abs().max()) for n in names), default=0.0)


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_match_one_learner_on_image_rows(task, ranks, case):
    from relayrl.learner.role import LearnerRole

    sharded, loss, grad_norm, pushed, units = ranks[case]

    single = LearnerRole(learner_settings(case_config(task, CASES[case])))
    before = params(single)
    exp = image_experience(task)
    assert exp.images is not None
    stats = single.update(0, single.prepare(exp)).metrics
    after = params(single)
    assert loss == pytest.approx(stats["loss/policy"], rel=1e-5, abs=1e-7)
    assert grad_norm == pytest.approx(stats["actor/grad_norm"], rel=1e-5)
    assert_same_first_step(sharded, after, before)
    tower = [n for n in before if ".vision_model." in n]
    text = [n for n in before if ".vision_model." not in n]
    assert tower and max_gap(after, before, text) > 5e-4  # the step did move the weights (lr 1e-3)
    # FSDP2 shards each block of the text decoder and of the vision encoder as its own unit, then the root
    blocks = [n for n in units if n.endswith(tuple(f"layers.{i}" for i in range(8)))]
    assert any(".text_model." in n for n in blocks) and any(".vision_model." in n for n in blocks) and "" in units
    if CASES[case]:  # frozen: the tower stays as loaded, on one learner and on the ranks, and is not pushed
        assert max_gap(after, before, tower) == 0.0 and max_gap(sharded, before, tower) == 0.0
        assert pushed == [n for n, _ in single.named_weights()] == text
    else:  # trained: the ranks stepped the sharded vision blocks as one learner did
        assert max_gap(after, before, tower) > 5e-4 and max_gap(sharded, before, tower) > 5e-4
