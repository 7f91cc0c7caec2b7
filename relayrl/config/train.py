"""The `train` section: the optimizer and its schedule, the batches and micro-batches of an update, the seed, and
the schedule that interleaves generation with training (sync, one_step_off, async) with its staleness rules."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_serializer, model_validator

from relayrl.config.section import Section


class TrainConfig(Section):
    steps: int = Field(default=20, ge=1, description="Training steps (one rollout batch each).")
    lr: float = Field(default=1e-5, gt=0, description="AdamW peak learning rate.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas.")
    lr_schedule: Literal["constant", "cosine"] = Field(
        default="constant", description="After warmup: constant or cosine decay."
    )
    warmup_steps: int = Field(default=0, ge=0, description="Linear warmup, in optimizer steps.")
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1, description="Cosine floor as a fraction of lr.")
    grad_clip: float = Field(default=1.0, gt=0, description="Max global gradient norm.")
    mini_batch: int | None = Field(
        default=None, ge=1, description="Responses per optimizer step; default = the whole rollout batch (one step)."
    )
    micro_batch: int = Field(default=16, ge=1, description="Responses per forward/backward (gradient accumulation).")
    micro_batch_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Instead of train.micro_batch: fill each micro-batch up to this many forward positions "
        "(whole groups when packing); one sample over it gets its own (learner/over_budget_units).",
    )
    epochs: int = Field(default=1, ge=1, description="Passes over each rollout batch.")
    seed: int = Field(
        default=0,
        ge=0,
        description="Seeds data order, sampling and initialisation: the same config and seed give the same metrics "
        "and samples (sync, one_step_off; async varies with timing: drops, which replica makes which group).",
    )
    threads: int = Field(default=0, ge=0, description="torch intra-op threads for the learner (0 = all cores).")
    packing: Literal["auto", "groups", "none"] = Field(
        default="auto",
        description="Learner forward layout: `groups` packs each group into one row (the prompt once, then "
        "every response, block attention mask), `none` right-pads one row per sample, `auto` "
        "packs when that computes at least 10% fewer positions. On a GPU packing needs model.attention="
        "flex_attention (a block mask; SDPA would take a dense [L, L] mask per row): auto pads without it, groups "
        "is refused.",
    )
    logits_chunk: int = Field(
        default=1024,
        ge=0,
        description="Apply the LM head only where a response token is predicted, this many positions at "
        "a time (recomputed in the backward): full-vocabulary logits are never held for more. "
        "0 = take the model's own logits over every position.",
    )
    schedule: Literal["sync", "one_step_off", "async"] = Field(
        default="sync",
        description="sync: generate, then train. one_step_off: generate step k+1 while training on step k. "
        "async: engines generate continuously into a bounded buffer. one_step_off and async "
        "need placement.mode=ray.",
    )
    max_staleness: int = Field(
        default=1, ge=0, description="async: the most policy versions a sample may lag the policy it trains."
    )
    on_stale: Literal["wait", "drop"] = Field(
        default="wait",
        description="async: keep within max_staleness by making producers wait, or by dropping old samples.",
    )
    partial_rollouts: float = Field(
        default=0.0,
        ge=0,
        description="async: over-provision factor for partial rollouts (APRIL): generate this many times "
        "the groups needed, stop when enough finish, continue the rest later (0 = off).",
    )

    @model_validator(mode="after")
    def _one_micro_batch_size(self) -> TrainConfig:
        if self.micro_batch_tokens is not None and "micro_batch" in self.model_fields_set:
            raise ValueError("set train.micro_batch or train.micro_batch_tokens, not both")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler) -> dict[str, Any]:
        """A dump re-loads: the default micro_batch is left out beside micro_batch_tokens."""
        return {k: v for k, v in handler(self).items() if k != "micro_batch" or self.micro_batch_tokens is None}
