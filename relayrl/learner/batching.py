"""Rollouts + scores -> right-padded `Experience` tensors aligned to target tokens."""

from __future__ import annotations

import torch

from relayrl.types import Experience, Rollout, Score


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
    return Experience(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=response.float(),
        behaviour_logprobs=behaviour,
        rewards=rewards,
        group_ids=group_ids,
        versions=versions,
        prompt_lengths=prompt_lengths,
    )


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] without materialising the full log-softmax: [B, T, V], [B, T] -> [B, T]."""
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)
