"""Rollouts + scores -> right-padded `Experience` tensors aligned to target tokens."""

from __future__ import annotations

import torch

from relayrl.types import Experience, Rollout, Score


def make_experience(rollouts: list[Rollout], scores: list[Score], pad_id: int) -> Experience:
    """Pack prompt + response of each rollout into one row; per-token tensors are [B, T-1] over targets."""
    lengths = [len(r.prompt.token_ids) + len(r.response_ids) for r in rollouts]
    batch, width = len(rollouts), max(lengths)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    loss_mask = torch.zeros((batch, width - 1))
    behaviour = torch.zeros((batch, width - 1))
    versions = torch.zeros((batch, width - 1), dtype=torch.long)
    # engines return rollouts prompt-major; a group starts at group_index 0 (so duplicate prompts or ids
    # in a batch never merge into one group)
    group_ids = torch.cumsum(torch.tensor([r.group_index == 0 for r in rollouts]), 0) - 1
    for row, rollout in enumerate(rollouts):
        prompt_len, response_len = len(rollout.prompt.token_ids), len(rollout.response_ids)
        input_ids[row, : lengths[row]] = torch.tensor(rollout.prompt.token_ids + rollout.response_ids)
        attention_mask[row, : lengths[row]] = 1
        # the response token at position p is predicted from position p-1: target column p-1
        targets = slice(prompt_len - 1, prompt_len - 1 + response_len)
        loss_mask[row, targets] = 1.0
        behaviour[row, targets] = torch.tensor(rollout.behaviour_logprobs)
        versions[row, targets] = torch.tensor(rollout.versions)
    rewards = torch.tensor([s.reward for s in scores], dtype=torch.float32)
    prompt_lengths = torch.tensor([len(r.prompt.token_ids) for r in rollouts], dtype=torch.long)
    return Experience(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask,
                      behaviour_logprobs=behaviour, rewards=rewards, group_ids=group_ids, versions=versions,
                      prompt_lengths=prompt_lengths)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] without materialising the full log-softmax: [B, T, V], [B, T] -> [B, T]."""
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)
