"""`LearnerSettings`: what the learner reads, sliced from the config by whoever places it
(relayrl/placement/sections.py, `learner_settings`), never the whole tree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relayrl.config import (
        AlgorithmConfig,
        CriticConfig,
        LearnerConfig,
        ModelConfig,
        RolloutConfig,
        TeacherConfig,
        TrainConfig,
    )


@dataclass(frozen=True)
class LearnerSettings:
    """The learner's sections: the model it trains, the objective (`algorithm`) and the critic's, the optimizer and
    batches (`train`), its memory options (`learner`); of `rollout`, the sampling the engines drew from (the
    log-probs are taken under it), the response length, the step's prompts and the engine (with `lora_sync`,
    `sync.lora`: what the learner's weights are pushed as); and the batch sizes derived across sections
    (`Config.mini_batch`, `Config.updates_per_step`); the `teacher`, when `teacher.path` is set; whether an engine
    shares the learner's GPU (placement.mode=local or placement.layout=colocated)."""

    model: ModelConfig
    algorithm: AlgorithmConfig
    critic: CriticConfig
    train: TrainConfig
    learner: LearnerConfig
    rollout: RolloutConfig
    lora_sync: str
    mini_batch: int  # rows per optimizer step
    updates_per_step: int  # optimizer steps per training step
    teacher: TeacherConfig | None = None  # on-policy distillation's teacher (relayrl/learner/teacher.py), if any
    colocated: bool = False  # an engine shares the learner's GPU: cached blocks go back after attach and updates


@dataclass(frozen=True)
class TeacherSettings:
    """What a teacher in a process of its own reads (`teacher.engine: actor`, relayrl/learner/teacher_role.py): the
    `teacher` section; of `model`, the student's path (its image tokens), attention kernel and dtype (the forward's
    autocast); of `train`, the micro-batches, packing and logits chunks; of `rollout`, the sampling temperature."""

    teacher: TeacherConfig
    model: ModelConfig
    train: TrainConfig
    rollout: RolloutConfig

    @classmethod
    def of(cls, learner: LearnerSettings) -> TeacherSettings:
        """The teacher's sections of the learner's settings (which hold the teacher the learner would load)."""
        assert learner.teacher is not None, "a teacher's settings need teacher.path"
        return cls(learner.teacher, learner.model, learner.train, learner.rollout)
