"""The `model` section: the policy's weights, its learner dtype and attention kernel, and `model.lora` (a LoRA
adapter instead of full fine-tuning) with its learning-rate advice. Pure pydantic (no torch, no peft)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from relayrl.config.section import INPUT_PATH_RULE, Section
from relayrl.config.warn import warn


class LoraConfig(Section):
    """`model.lora`: train a peft LoRA adapter instead of every weight (absent = full fine-tuning)."""

    rank: int = Field(default=16, ge=1, description="LoRA rank r (RL needs small ranks: 1-32).")
    alpha: float = Field(default=32.0, gt=0, description="LoRA alpha; the adapter's update is scaled by alpha / rank.")
    dropout: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="LoRA dropout. The learner runs in eval mode (the on-policy ratio is exactly 1), so a "
        "non-zero value has no effect and is warned about.",
    )
    target_modules: str | list[str] = Field(
        default="all-linear",
        description="Modules given an adapter: all-linear (every linear layer but the LM head) or a list of "
        "module names (q_proj, v_proj, ...).",
    )

    @model_validator(mode="after")
    def _check_dropout(self) -> LoraConfig:
        if self.dropout:
            warn(f"model.lora.dropout={self.dropout} has no effect: the learner runs its passes in eval mode")
        return self


# A LoRA run's learning rate at or under this is a full fine-tuning value (RL full fine-tuning runs at 1e-6..1e-5).
LORA_MIN_LR = 2e-5


def warn_lora(config) -> None:
    """LoRA needs about 10x the full fine-tuning learning rate (TRL's "LoRA without regret"); left at a full
    fine-tuning value the adapter barely moves and the run "does not learn". (On sharded learner ranks FSDP2
    shards the base and the adapter alike: relayrl/learner/sharded_lora.py.)"""
    if config.model.lora is None and "lora" in config.sync.model_fields_set:
        warn("sync.lora has no effect without model.lora")
    if config.model.lora is not None and config.train.lr <= LORA_MIN_LR:
        warn(
            f"model.lora is set with train.lr={config.train.lr:g}, a full fine-tuning rate: LoRA needs about 10x "
            f"the full fine-tuning rate (e.g. 1e-5 -> 1e-4); raise train.lr above {LORA_MIN_LR:g}"
        )


class ModelConfig(Section):
    path: str = Field(
        default="", description="HF model directory (config.json + weights + tokenizer). " + INPUT_PATH_RULE
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description="Learner dtype: auto = float32 on CPU, bf16 autocast with fp32 master weights on GPU.",
    )
    lora: LoraConfig | None = Field(
        default=None, description="Train a LoRA adapter (peft) on a frozen base; absent = full fine-tuning."
    )
    attention: Literal["auto", "sdpa", "eager", "flex_attention"] = Field(
        default="auto",
        description="The learner's attention kernel: auto = the model's own (sdpa for most). flex_attention: "
        "group-packed rows (train.packing) attend through a block-sparse FlexAttention mask, which skips the blocks "
        "where one response would see another, instead of a dense [L, L] mask per row; GPU only (torch has no "
        "FlexAttention backward on CPU). Opt-in until benchmarks/gpu_check.sh has timed it against sdpa on a GPU.",
    )
    freeze_vision: bool = Field(
        default=True,
        description="A vision-language model's vision tower is not trained (the language model and the connector "
        "are), and pushes leave it out. No effect on a text-only model.",
    )
