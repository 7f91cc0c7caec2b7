"""The `model.lora` config section and its learning-rate advice. Its own module: relayrl/config/sections.py is at
its line budget; that module re-exports both. Pure pydantic (no torch, no peft)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from relayrl.config.warn import warn


class LoraConfig(BaseModel):
    """`model.lora`: train a peft LoRA adapter instead of every weight (absent = full fine-tuning)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)  # as every config section

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
