"""Advantage estimators, one pure tensor function each, registered by name.

Every estimator has the same signature: `fn(inputs: AdvantageInputs, **knobs) -> (advantages [B, T],
returns [B, T] | None)`. Advantages are 0 outside `inputs.mask`; `returns` are a critic's regression
targets, so only `gae` has them. Inputs are token-level so that a per-token reward (a KL penalty) and
per-token estimators (REINFORCE++, GAE) use the same API as the sequence-level ones (GRPO, RLOO).

A group's statistics (mean, std, size) are over its members: every row unless `inputs.members` says otherwise.
A forked multi-turn sample (env.tito=fork: the tokens a trajectory sampled before a call that rewrote its history)
is not a member: its trajectory is counted once, by its last sample, and the fork, carrying the same reward, gets
the same group-relative advantage.

Deliberately left out: loss aggregation (Dr. GRPO's constant normaliser lives in losses.py), the KL
penalty itself (the caller adds it to `token_rewards`) and the critic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Estimator = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
ADVANTAGES: dict[str, Estimator] = {}
# the estimators that read where in a response a reward sits: a multi-turn trajectory's turns' rewards go on
# their turns' last tokens for these (`turn_reward_tensor`), the group estimators take the sequence's total
TOKEN_LEVEL = frozenset({"gae", "reinforce_pp", "reinforce_pp_baseline"})


def register(name: str):
    def wrap(fn: Estimator) -> Estimator:
        ADVANTAGES[name] = fn
        return fn

    return wrap


@dataclass
class AdvantageInputs:
    token_rewards: torch.Tensor  # [B, T] sequence reward on the last response token (+ per-token terms), else 0
    mask: torch.Tensor  # [B, T] 1.0 on response tokens
    group_ids: torch.Tensor  # [B] responses to one prompt share an id (any order, any values)
    values: torch.Tensor | None = None  # [B, T] critic values (gae only)
    members: torch.Tensor | None = None  # [B] bool: rows counted in their group's statistics (None: every row)


def make_inputs(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    values: torch.Tensor | None = None,
    turn_rewards: torch.Tensor | None = None,
    members: torch.Tensor | None = None,
) -> AdvantageInputs:
    """rewards [B], mask [B, T], group_ids [B] -> inputs with each reward on its row's last response token.

    turn_rewards [B, T] (multi-turn, token-level estimators): parts of each row's reward placed earlier (each
    turn's on the turn's last token); what they leave of the row's reward (a reward.fn's score, a length
    penalty) stays on the last token, so every row's token rewards still sum to its reward.

    members [B] bool: the rows a group's statistics are taken over (a forked sample is not one); None: all."""
    last = last_response_token(mask)  # [B]
    rest = rewards if turn_rewards is None else rewards - turn_rewards.sum(dim=1)
    token_rewards = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    token_rewards[torch.arange(len(rewards), device=rewards.device), last] = rest
    if turn_rewards is not None:
        token_rewards = token_rewards + turn_rewards.to(rewards.dtype)
    return AdvantageInputs(token_rewards, mask.to(rewards.dtype), group_ids, values, members)


def turn_reward_tensor(rollouts: list, prompt_lengths: torch.Tensor, width: int) -> torch.Tensor | None:
    """The turns' rewards of multi-turn rollouts (`Rollout.turn_rewards`) at their target columns, [B, width]
    (the Experience layout: response token i of row b is column prompt_lengths[b] - 1 + i); None when no
    rollout has any."""
    if all(not r.turn_rewards for r in rollouts):
        return None
    placed = torch.zeros((len(rollouts), width))
    for row, rollout in enumerate(rollouts):
        for index, reward in rollout.turn_rewards or ():
            placed[row, int(prompt_lengths[row]) - 1 + index] += reward
    return placed


def last_response_token(mask: torch.Tensor) -> torch.Tensor:
    """mask [B, T] -> [B] column of each row's last response token; a row without one is an error."""
    positions = torch.arange(mask.shape[1], device=mask.device)
    last = torch.where(mask > 0, positions, -1).amax(dim=1)
    if (last < 0).any():
        rows = torch.nonzero(last < 0).flatten().tolist()
        raise ValueError(f"rows {rows} have no response tokens, so their reward has no token to sit on")
    return last


def sequence_rewards(inputs: AdvantageInputs) -> torch.Tensor:
    """token_rewards summed over the response: [B, T] -> [B]."""
    return (inputs.token_rewards * inputs.mask).sum(dim=1)


@register("grpo")
def grpo(inputs: AdvantageInputs, std_normalize: bool = True, eps: float = 1e-6) -> tuple[torch.Tensor, None]:
    """GRPO (DeepSeekMath): A_i = (R_i - mean_g R) / (std_g R + eps), on every response token of row i.

    std_g is the unbiased sample std of the group g; std_normalize=False gives R_i - mean_g R. A flat
    group (all rewards equal) gets exactly 0, even with eps=0.
    """
    centred, inverse, counts = _group_centred(sequence_rewards(inputs), inputs.group_ids, inputs.members)
    if std_normalize:
        squares = centred**2 * _member_weights(inputs.members, centred)  # [B]
        variance = _group_sum(squares, inverse, len(counts)) / (counts - 1).clamp(min=1)  # [G]
        std = variance.sqrt()[inverse]  # [B]
        centred = torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))
    return centred[:, None] * inputs.mask, None


@register("dr_grpo")
def dr_grpo(inputs: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """Dr. GRPO ("Understanding R1-Zero-like Training", Liu et al. 2025): A_i = R_i - mean_g R, no std.

    The paper's other change, dividing the loss by a constant instead of each response's length, is a
    loss-aggregation choice made in losses.py, not here.
    """
    centred, _, _ = _group_centred(sequence_rewards(inputs), inputs.group_ids, inputs.members)  # [B]
    return centred[:, None] * inputs.mask, None


@register("rloo")
def rloo(inputs: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """RLOO (Ahmadian et al. 2024): A_i = R_i - mean_{j != i in g} R_j = n/(n-1) * (R_i - mean_g R).

    A group of one response has no other responses to compare with and gets 0.
    """
    centred, inverse, counts = _group_centred(sequence_rewards(inputs), inputs.group_ids, inputs.members)
    scale = counts / (counts - 1).clamp(min=1)  # [G]; n=1 has centred == 0 already
    return (centred * scale[inverse])[:, None] * inputs.mask, None


@register("reinforce_pp")
def reinforce_pp(inputs: AdvantageInputs, gamma: float = 1.0, eps: float = 1e-8) -> tuple[torch.Tensor, None]:
    """REINFORCE++ (Hu 2025, OpenRLHF `reinforce`): G_t = sum_{s>=t} gamma^(s-t) r_s, then whitened.

    s - t counts trained tokens: a multi-turn trajectory's observation tokens (mask 0) pass the return through.

    Whitening is over all response tokens of the batch: (G_t - mean) / sqrt(max(var, eps)) with the
    population variance, as OpenRLHF does.
    """
    returns_to_go = _discounted_cumsum(inputs.token_rewards, inputs.mask, gamma)  # [B, T]
    return _whiten(returns_to_go, inputs.mask, eps), None


@register("reinforce_pp_baseline")
def reinforce_pp_baseline(inputs: AdvantageInputs, eps: float = 1e-8) -> tuple[torch.Tensor, None]:
    """REINFORCE++-baseline (OpenRLHF `reinforce_baseline`): G_t = sum_{s>=t} r_s - mean_g R, whitened.

    As in OpenRLHF: the group mean of the sequence reward is subtracted from the last-token reward,
    the return-to-go is taken with gamma fixed at 1 (OpenRLHF overrides any other gamma), and the result
    is whitened over all response tokens of the batch like `reinforce_pp`. So a flat group is not 0
    after whitening. One difference: OpenRLHF averages the raw reward before adding the KL penalty;
    here R is `sequence_rewards`, which includes any per-token terms already in `token_rewards`.
    """
    rewards = sequence_rewards(inputs)  # [B]
    centred, _, _ = _group_centred(rewards, inputs.group_ids, inputs.members)
    baseline = rewards - centred  # [B] group mean (exactly R in a flat group)
    returns_to_go = _discounted_cumsum(inputs.token_rewards, inputs.mask, 1.0)  # [B, T]
    # with gamma = 1 the last-token baseline is in every token's return-to-go exactly once
    return _whiten(returns_to_go - baseline[:, None], inputs.mask, eps), None


@register("gae")
def gae(
    inputs: AdvantageInputs, gamma: float = 1.0, lam: float = 1.0, whiten: bool = False, eps: float = 1e-8
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al. 2016): d_t = r_t + gamma V_{t+1} - V_t, A_t = d_t + gamma lam A_{t+1}.

    Returns = A + V (before any whitening). V after the last response token is 0. Masked columns are skipped:
    padding and prompt columns never reach a response token, and across a multi-turn trajectory's observation
    tokens V_{t+1} is the value of the next trained token and A flows through unchanged. RLHF usually runs
    gamma=1, lam=0.95. whiten=True whitens A over all response tokens of the batch like `reinforce_pp`.
    """
    if inputs.values is None:
        raise ValueError("the gae advantage needs critic values, but AdvantageInputs.values is None")
    mask = inputs.mask
    values = inputs.values * mask  # [B, T]
    next_values = _next_trained(values, mask)  # [B, T]
    deltas = (inputs.token_rewards + gamma * next_values - values) * mask  # [B, T]
    advantages = _discounted_cumsum(deltas, mask, gamma * lam)
    returns = (advantages + values) * mask
    if whiten:
        advantages = _whiten(advantages, mask, eps)
    return advantages, returns


def degenerate_group_fraction(rewards: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Fraction of groups whose rewards are all equal (they carry no GRPO signal): [B], [B] -> float."""
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return float((_group_spread(rewards, inverse, len(counts)) == 0).float().mean())


def _group_centred(rewards: torch.Tensor, group_ids: torch.Tensor, members: torch.Tensor | None = None):
    """rewards [B], group_ids [B] -> (R - group mean [B], group index of each row [B], group sizes [G]), the
    mean and sizes over the group's `members` (every row when None); every row is centred on its group's mean.

    A flat group is set to exactly 0: its float mean can be one rounding step off its rewards.
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)
    weights = _member_weights(members, rewards)  # [B] 1.0 for a member, else 0.0
    groups = int(inverse.max()) + 1 if len(inverse) else 0
    counts = _group_sum(weights, inverse, groups).clamp(min=1)  # [G]
    means = _group_sum(rewards * weights, inverse, groups) / counts  # [G]
    member = weights > 0
    flat = _group_spread(rewards[member], inverse[member], groups) == 0  # [G]
    centred = torch.where(flat[inverse], torch.zeros_like(rewards), rewards - means[inverse])
    return centred, inverse, counts


def _member_weights(members: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """[B] 1.0 for a row counted in its group's statistics, 0.0 for one that is not (a forked sample)."""
    if members is None:
        return torch.ones_like(like)
    return members.to(device=like.device, dtype=like.dtype)


def _group_sum(x: torch.Tensor, inverse: torch.Tensor, groups: int) -> torch.Tensor:
    """x [B] summed per group -> [G]."""
    return torch.zeros(groups, dtype=x.dtype, device=x.device).index_add_(0, inverse, x)


def _group_spread(x: torch.Tensor, inverse: torch.Tensor, groups: int) -> torch.Tensor:
    """max - min of x [B] per group -> [G]."""
    empty = torch.zeros(groups, dtype=x.dtype, device=x.device)
    high = empty.scatter_reduce(0, inverse, x, "amax", include_self=False)
    low = empty.scatter_reduce(0, inverse, x, "amin", include_self=False)
    return high - low


def _discounted_cumsum(x: torch.Tensor, mask: torch.Tensor, discount: float) -> torch.Tensor:
    """out_t = x_t + discount * out_{t'} over the masked entries of [B, T], t' the next masked column after t:
    unmasked columns (a multi-turn observation, padding) pass the sum through untouched and get 0."""
    out, running = torch.zeros_like(x), torch.zeros_like(x[:, 0])
    for t in reversed(range(x.shape[1])):
        running = torch.where(mask[:, t] > 0, x[:, t] + discount * running, running)
        out[:, t] = running * mask[:, t]
    return out


def _next_trained(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """values [B, T] -> [B, T]: at t, the value of the next masked column after t (0 after the last one)."""
    out, following = torch.zeros_like(values), torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        out[:, t] = following
        following = torch.where(mask[:, t] > 0, values[:, t], following)
    return out


def _whiten(x: torch.Tensor, mask: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - mean) / sqrt(max(var, eps)) over the masked entries of x [B, T] (population var); 0 elsewhere."""
    count = mask.sum().clamp(min=1)
    mean = (x * mask).sum() / count
    variance = ((x - mean) ** 2 * mask).sum() / count
    return (x - mean) * variance.clamp(min=eps).rsqrt() * mask
