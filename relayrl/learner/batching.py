"""Rollouts + scores -> right-padded `Experience` tensors aligned to target tokens; and micro-batches.

A mini-batch is split into micro-batches for gradient accumulation (`MicroBatcher`): `train.micro_batch`
samples each, or, with `train.micro_batch_tokens`, filled up to a budget of forward positions. Every loss is
divided by its mini-batch's normaliser, so neither split changes the loss or the gradients.
"""

from __future__ import annotations

import warnings

import torch

from relayrl.learner.packing import packed_widths, shared_prompts
from relayrl.types import Experience, ImageBatch, Rollout, Score


def make_experience(rollouts: list[Rollout], scores: list[Score], pad_id: int) -> Experience:
    """Pack prompt + response of each rollout into one row; per-token tensors are [B, T-1] over targets.
    Built from flat lists with one tensor per field (a Python loop of small tensor writes per row cost
    ~7 ms for the demo's 256 rows)."""
    prompt_lengths = torch.tensor([len(r.prompt.token_ids) for r in rollouts], dtype=torch.long)
    response_lengths = torch.tensor([len(r.response_ids) for r in rollouts], dtype=torch.long)
    lengths = prompt_lengths + response_lengths
    width = int(lengths.max())
    input_ids = torch.tensor(
        [r.prompt.token_ids + r.response_ids + [pad_id] * (width - n) for r, n in zip(rollouts, lengths.tolist())],
        dtype=torch.long,
    )
    attention_mask = (torch.arange(width)[None] < lengths[:, None]).long()
    # the response token at position p is predicted from position p-1: target columns from prompt_len-1 on
    columns, first = torch.arange(width - 1)[None], prompt_lengths[:, None] - 1
    response = (columns >= first) & (columns < first + response_lengths[:, None])
    # boolean-mask assignment fills row by row, left to right: the order of the concatenated lists
    behaviour = torch.zeros((len(rollouts), width - 1))
    behaviour[response] = torch.tensor([lp for r in rollouts for lp in r.behaviour_logprobs], dtype=torch.float32)
    versions = torch.zeros((len(rollouts), width - 1), dtype=torch.long)
    versions[response] = torch.tensor([v for r in rollouts for v in r.versions], dtype=torch.long)
    # engines return rollouts prompt-major; a group starts at group_index 0 (so duplicate prompts or ids
    # in a batch never merge into one group)
    group_ids = torch.cumsum(torch.tensor([r.group_index == 0 for r in rollouts]), 0) - 1
    rewards = torch.tensor([s.reward for s in scores], dtype=torch.float32)
    loss_mask = response.float()
    if any(r.loss_mask is not None for r in rollouts):  # multi-turn: observation tokens are not trained
        masks = [m for r in rollouts for m in (r.loss_mask if r.loss_mask is not None else [1] * len(r.response_ids))]
        loss_mask[response] = torch.tensor(masks, dtype=torch.float32)
    with_images = any(r.prompt.image_inputs for r in rollouts)
    return Experience(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        behaviour_logprobs=behaviour,
        rewards=rewards,
        group_ids=group_ids,
        versions=versions,
        prompt_lengths=prompt_lengths,
        forks=torch.tensor([r.fork_of is not None for r in rollouts], dtype=torch.bool),
        images=ImageBatch([r.prompt.image_inputs for r in rollouts]) if with_images else None,
    )


class MicroBatcher:
    """Splits a mini-batch (sample indices into an Experience) into micro-batches.

    Count (`tokens` None): `rows` samples each, in the given order. Token budget: units are samples, or packed
    rows when the learner packs groups (a group's members present in the mini-batch that share a prompt); a unit
    costs its forward positions (a sample its length, a packed row its prompt once plus every response). Longest
    first, a micro-batch takes units while (units x its longest unit) stays within `tokens`: the positions its padded
    rows compute (`train.packing=auto` may then pick the padded layout only where that is 10% cheaper, so
    at most ~1.1x the budget). A unit over the budget alone gets a micro-batch of its own, counted in
    `learner/over_budget_units` and warned about once. With several learner ranks, every rank runs as many
    micro-batches (`even_out`).
    """

    def __init__(self, rows: int, tokens: int | None = None, whole_groups: bool = False):
        self.rows, self.tokens, self.whole_groups = rows, tokens, whole_groups
        self.micro_batches = self.over_budget = 0  # since the last take_counts
        self.warned = False

    def split(self, index: torch.Tensor, exp: Experience, count: bool = True) -> list[torch.Tensor]:
        parts = list(index.split(self.rows)) if self.tokens is None else even_out(self._fill(index, exp, count))
        self.micro_batches += len(parts) if count else 0
        return parts

    def take_counts(self) -> dict[str, float]:
        counts = {"learner/micro_batches": float(self.micro_batches)}
        if self.tokens is not None:
            counts["learner/over_budget_units"] = float(self.over_budget)
        self.micro_batches = self.over_budget = 0
        return counts

    def _fill(self, index: torch.Tensor, exp: Experience, count: bool) -> list[torch.Tensor]:
        units = self._units(index, exp)
        units.sort(key=lambda unit: -unit[0])  # stable: equal lengths keep their order
        parts, current, longest = [], [], 0
        budget = self.tokens
        assert budget is not None, "_fill runs with a token budget"
        for length, members in units:
            if current and (len(current) + 1) * longest > budget:
                parts.append(torch.tensor([m for unit in current for m in unit], dtype=torch.long))
                current = []
            if not current:
                longest = length
                if length > budget and count:
                    self._over_budget(length)
            current.append(members)
        parts.append(torch.tensor([m for unit in current for m in unit], dtype=torch.long))
        return parts

    def _units(self, index: torch.Tensor, exp: Experience) -> list[tuple[int, list[int]]]:
        """(forward positions, sample indices) per unit, in order of first appearance in `index`."""
        lengths = exp.attention_mask.sum(dim=1).tolist()
        samples = index.tolist()
        if not self.whole_groups or exp.prompt_lengths is None:
            return [(lengths[i], [i]) for i in samples]
        rows = shared_prompts(exp, samples)  # a unit is one packed row: a group's samples that share a prompt
        return list(zip(packed_widths(exp, rows), rows))

    def _over_budget(self, length: int) -> None:
        self.over_budget += 1
        if not self.warned:
            self.warned = True
            what = "a packed group" if self.whole_groups else "a sample"
            warnings.warn(
                f"{what} of {length} tokens is over train.micro_batch_tokens={self.tokens}: it gets a "
                "micro-batch of its own (counted in learner/over_budget_units; this warning is shown once)",
                RuntimeWarning,
                stacklevel=2,
            )


def even_out(parts: list[torch.Tensor], target: int | None = None) -> list[torch.Tensor]:
    """As many micro-batches on every learner rank: FSDP gathers the weights in each forward, so a rank that ran
    fewer would leave the others waiting. `target` (by default the most of any rank, all-reduced) is reached by
    halving the part with the most samples; a rank has as many rows as any other, so it always can."""
    import torch.distributed as dist

    if target is None:
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return parts
        from relayrl.learner.process_group import all_reduce, group_device

        most = all_reduce(torch.tensor([len(parts)], device=group_device()), op=dist.ReduceOp.MAX)
        target = int(most[0])
    parts = list(parts)
    while len(parts) < target:
        widest = max(range(len(parts)), key=lambda i: len(parts[i]))
        if len(parts[widest]) < 2:
            raise ValueError(f"cannot make {target} micro-batches of {sum(map(len, parts))} samples")
        half = (len(parts[widest]) + 1) // 2
        parts[widest : widest + 1] = [parts[widest][:half], parts[widest][half:]]
    return parts


def packs_groups(layout) -> bool:
    """Whether the learner's forward layout (relayrl/learner/layout.py) may pack whole groups."""
    from relayrl.learner.layout import PACKABLE_ATTENTION  # layout imports this module (through token_stats)

    return layout.packing != "none" and layout.attention in PACKABLE_ATTENTION
