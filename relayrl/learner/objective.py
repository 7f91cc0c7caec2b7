"""The training objective, chosen once from `config.algorithm`: policy loss + KL + entropy, and the
rollout correction applied to a batch before its update.

`Objective.loss` is called per micro-batch with the mini-batch's normaliser, so micro-batching never
changes the loss; it returns metric *sums* that the learner turns into per-token means once per step.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from relayrl.algorithms.correction import sequence_ratio_mask, sequence_tis, token_ratio_mask, token_tis
from relayrl.algorithms.kl import AdaptiveKLController, FixedKLController, kl_in_reward
from relayrl.algorithms.losses import POLICY_LOSSES, entropy_bonus, kl_penalty, mini_batch_normaliser
from relayrl.types import filled

if TYPE_CHECKING:
    from relayrl.config import AlgorithmConfig
    from relayrl.types import Experience


class Objective:
    def __init__(self, algo: AlgorithmConfig, max_tokens: int, use_reference: bool):
        self.algo = algo
        self.max_tokens = max_tokens
        self.policy_loss = functools.partial(
            POLICY_LOSSES[algo.policy_loss],
            clip_eps=algo.clip_eps,
            agg=algo.loss_agg,
            eps_low=algo.clip_eps_low,
            eps_high=algo.clip_eps_high,
            dual_clip_c=algo.dual_clip_c,
        )
        self.kl_in_loss = use_reference and algo.kl.placement == "loss"
        kl = algo.kl
        self.kl_controller = (
            AdaptiveKLController(kl.coef, kl.target, kl.horizon)
            if kl.controller == "adaptive"
            else FixedKLController(kl.coef)
        )
        self.correction = _correction(algo)

    def normaliser(self, mask: torch.Tensor) -> float:
        return mini_batch_normaliser(mask, self.algo.loss_agg, self.max_tokens)

    @property
    def entropy_in_loss(self) -> bool:
        return self.algo.entropy_coef > 0

    def loss(
        self, logp: torch.Tensor, entropy: torch.Tensor, old: torch.Tensor, part: Experience, normaliser: float
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Loss of one micro-batch. logp, entropy, old: [b, t] (entropy with gradients when it is in the loss)."""
        mask = part.loss_mask.to(logp.device)
        advantages = filled(part.advantages, "advantages").to(logp.device)
        loss, metrics = self.policy_loss(logp, old, advantages, mask, normaliser=normaliser)
        sums = {"loss_policy": loss.detach(), **metrics}  # micro-batch losses add up to the mini-batch's
        if self.kl_in_loss:
            kl_loss, sums["kl"] = kl_penalty(
                logp,
                filled(part.ref_logprobs, "ref_logprobs").to(logp.device),
                mask,
                self.algo.kl.estimator,
                self.algo.loss_agg,
                normaliser,
            )
            loss = loss + self.kl_controller.coef * kl_loss
        if self.entropy_in_loss:
            bonus, _ = entropy_bonus(entropy, mask, self.algo.entropy_coef, self.algo.loss_agg, normaliser)
            loss = loss + bonus
        sums["loss_total"] = loss.detach()
        return loss, sums

    def reward_penalty(self, exp: Experience) -> torch.Tensor | None:
        """-coef * KL per token [B, T] to add to the token rewards (kl.placement=reward), else None."""
        if exp.ref_logprobs is None or self.algo.kl.placement != "reward":
            return None
        return kl_in_reward(
            filled(exp.old_logprobs, "old_logprobs"),
            exp.ref_logprobs,
            exp.loss_mask,
            self.algo.kl.estimator,
            self.kl_controller.coef,
        )

    def correct_in_pass(self, part: Experience, logp: torch.Tensor) -> dict[str, torch.Tensor]:
        """TIS inside the update's own forward, for a single on-policy mini-batch: the micro-batch's current
        log-probs are the pre-update ones, so the old-log-prob pass is not needed. Reweights part.advantages;
        returns token-weighted metric sums (ratio_sum, hit_tokens) and ratio_max for the learner to add up."""
        mask = part.loss_mask.to(logp.device)
        weights, metrics = self.correction(logp.detach(), part.behaviour_logprobs.to(logp.device), mask)
        part.advantages = filled(part.advantages, "advantages").to(logp.device) * weights
        tokens = mask.sum()
        return {
            "ratio_sum": metrics["ratio_mean"] * tokens,
            "ratio_max": metrics["ratio_max"],
            "hit_tokens": metrics["truncated_frac"] * tokens,
        }

    def correct(self, exp: Experience) -> dict[str, float]:
        """Reweight (TIS) or mask tokens by the old/behaviour ratio, in place; returns correction metrics."""
        if self.correction is None:
            return {}
        out, metrics = self.correction(exp.old_logprobs, exp.behaviour_logprobs, exp.loss_mask)
        if self.algo.correction.mode.startswith("tis"):
            exp.advantages = exp.advantages * out  # a non-negative weight on the surrogate = a weight on A
        else:
            exp.loss_mask = out
        return {f"correction/{k}": float(v) for k, v in metrics.items()}


def _correction(algo: AlgorithmConfig):
    c = algo.correction
    return {
        "none": None,
        "tis_token": functools.partial(token_tis, threshold=c.threshold),
        "tis_seq": functools.partial(sequence_tis, threshold=c.threshold),
        "mask_token": functools.partial(token_ratio_mask, lower=c.lower, upper=c.upper),
        "mask_seq": functools.partial(sequence_ratio_mask, lower=c.lower, upper=c.upper),
    }[c.mode]
