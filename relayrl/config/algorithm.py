"""The algorithm's config sections: `algorithm.*` with its `kl`, `correction`, `dapo` and `distill` blocks, and `critic`.

Strict pydantic models like every section (each role's in a module of its own: rollout.py, train.py, sync.py, ...);
`relayrl/config/` re-exports them and holds the rules across sections.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from relayrl.config.section import Section
from relayrl.config.teacher import DistillConfig


class KLConfig(Section):
    coef: float = Field(
        default=0.0, ge=0, description="Weight of the KL penalty to the reference; 0 = no reference loaded."
    )
    estimator: Literal["k1", "k2", "k3", "abs"] = Field(
        default="k3",
        description="Per-token KL estimator: k1 = logp - ref, k2 = (logp - ref)^2 / 2, k3 = exp(r) - r - 1 "
        "with r = ref - logp, abs = |logp - ref|.",
    )
    placement: Literal["loss", "reward"] = Field(
        default="loss",
        description="Add the KL penalty to the loss (GRPO style) or subtract it from per-token rewards (PPO style).",
    )
    controller: Literal["fixed", "adaptive"] = Field(
        default="fixed", description="Fixed coefficient, or adapted towards kl.target (Ziegler et al. 2019)."
    )
    target: float = Field(default=0.1, gt=0, description="Adaptive controller: the KL per token it steers towards.")
    horizon: int = Field(
        default=10_000, ge=1, description="Adaptive controller: samples over which the error is corrected."
    )


class CorrectionConfig(Section):
    mode: Literal["none", "tis_token", "tis_seq", "mask_token", "mask_seq"] = Field(
        default="none",
        description="Rollout correction with the engine's behaviour log-probs: truncated importance "
        "sampling per token or sequence, or masking tokens/sequences whose ratio is off.",
    )
    threshold: float = Field(default=2.0, gt=0, description="TIS: cap on the importance weight old/behaviour.")
    lower: float = Field(default=0.5, gt=0, description="Masking: smallest ratio kept.")
    upper: float = Field(default=2.0, gt=0, description="Masking: largest ratio kept.")


class CriticConfig(Section):
    path: str = Field(
        default="",
        description="Value-model initialisation (an HF causal-LM directory); default model.path. "
        "Relative: as model.path.",
    )
    lr: float = Field(default=1e-5, gt=0, description="Critic AdamW learning rate.")
    value_clip: float = Field(
        default=0.2, gt=0, description="Clip range of the new values around the old (PPO value loss)."
    )
    warmup_steps: int = Field(default=0, ge=0, description="Steps that train only the critic before the actor moves.")


class DAPOConfig(Section):
    dynamic_sampling: bool = Field(
        default=False, description="Drop groups whose rewards are all equal and generate more until the batch is full."
    )
    max_rounds: int = Field(default=4, ge=1, description="Dynamic sampling: most generation rounds per step (the cap).")
    overlong_filter: bool = Field(default=False, description="Give truncated responses (finish=length) no gradient.")
    overlong_buffer: int = Field(
        default=0,
        ge=0,
        description="Soft overlong punishment over the last N tokens before rollout.max_tokens (0 = off).",
    )


class AlgorithmConfig(Section):
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae", "distill"] = Field(
        default="grpo",
        description="Advantage estimator (docs/algorithms.md gives each formula; distill: the teacher's per-token "
        "signal alone, docs/distillation.md).",
    )
    std_normalize: bool = Field(default=True, description="grpo: divide group-centred rewards by the group std.")
    gamma: float = Field(default=1.0, ge=0, le=1, description="Discount of per-token returns (reinforce_pp and gae).")
    lam: float = Field(default=0.95, ge=0, le=1, description="gae: the GAE lambda (bias/variance trade-off).")
    policy_loss: Literal["ppo_clip", "gspo"] = Field(
        default="ppo_clip",
        description="ppo_clip: token-level clipped surrogate; gspo: sequence-level ratio (use a small clip_eps).",
    )
    clip_eps: float = Field(
        default=0.2, gt=0, description="Clip range of the importance ratio (both sides unless set below)."
    )
    clip_eps_low: float | None = Field(
        default=None, gt=0, description="Lower clip range (1 - eps_low); default clip_eps."
    )
    clip_eps_high: float | None = Field(
        default=None,
        gt=0,
        description="Upper clip range (1 + eps_high); DAPO's clip-higher uses 0.28. Default clip_eps.",
    )
    dual_clip_c: float | None = Field(
        default=None, gt=1, description="Dual-clip bound c for negative advantages (None = off)."
    )
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = Field(
        default="token_mean",
        description="How per-token losses become one number (seq_mean_token_sum_norm divides by "
        "rollout.max_tokens, as Dr. GRPO).",
    )
    entropy_coef: float = Field(default=0.0, ge=0, description="Entropy bonus weight (0 = off).")
    kl: KLConfig = Field(default_factory=KLConfig)
    correction: CorrectionConfig = Field(default_factory=CorrectionConfig)
    dapo: DAPOConfig = Field(default_factory=DAPOConfig)
    distill: DistillConfig = Field(default_factory=DistillConfig)  # the teacher's signal (relayrl/config/teacher.py)
