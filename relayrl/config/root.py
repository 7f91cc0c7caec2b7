"""The root of the typed config tree, `Config`: one field per section, the batch sizes derived from them, and the
rules that hold across sections (checked when the tree is validated).

Validating imports no runtime code: `auto` choices are made after validation, each by the package that owns it
(`relayrl.build.resolve`), and recorded here (`choose`) for the dump. The sections are its sibling modules, one per
owner (model.py, rollout.py, sync.py, ...); loading, overrides and the messages are relayrl/config/load.py.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, PrivateAttr, model_serializer, model_validator

from relayrl.config.algorithm import AlgorithmConfig, CriticConfig
from relayrl.config.data import DataConfig, EvalConfig
from relayrl.config.env import EnvConfig
from relayrl.config.learner import LearnerConfig
from relayrl.config.log import CheckpointConfig, LogConfig
from relayrl.config.model import ModelConfig
from relayrl.config.placement import PlacementConfig
from relayrl.config.reward import RewardConfig
from relayrl.config.rollout import RolloutConfig
from relayrl.config.section import Section
from relayrl.config.sync import SyncConfig
from relayrl.config.teacher import TeacherConfig, check_teacher
from relayrl.config.train import TrainConfig


class Config(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    sync: SyncConfig = Field(default_factory=SyncConfig)
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)  # on-policy distillation (config/teacher.py)
    _engine_choice: Any = PrivateAttr(None)  # what `rollout.engine: auto` chose, and why (relayrl/rollout/choice.py)
    _resolved: bool = PrivateAttr(False)  # the `auto` choices made (relayrl/build.py, `resolve`)
    _auto: dict[str, tuple[Any, str]] = PrivateAttr(default_factory=dict)  # "rollout.dtype" -> (chosen, why)

    def choose(self, key: str, value: Any, reason: str) -> None:
        """Set an `auto` key (`section.key`) to what the run uses, keeping why: the dump writes `auto` back with the
        choice and its reason beside it, so a reload (another machine, a resume) chooses again."""
        section, name = key.split(".")
        setattr(getattr(self, section), name, value)
        getattr(self, section).model_fields_set.discard(name)  # chosen, not set: the no-effect warnings agree
        self._auto[key] = (value, reason)

    @model_serializer(mode="wrap")
    def _dump_engine_as_asked(self, handler) -> dict:
        """`auto` where auto chose: a reloaded dump (a resume, `relayrl.train`'s reload) chooses again, noted."""
        tree = handler(self)
        if not isinstance(tree, dict):
            return tree
        if self._engine_choice is not None and isinstance(tree.get("rollout"), dict):
            tree["rollout"]["engine"] = self._engine_choice.as_asked(tree["rollout"].get("engine"))
        for key, (value, _) in self._auto.items():
            section, name = key.split(".")
            if isinstance(tree.get(section), dict) and tree[section].get(name) == value:
                tree[section][name] = "auto"
        return tree

    @property
    def rollout_batch(self) -> int:
        return self.rollout.prompts_per_step * self.rollout.n

    @property
    def mini_batch(self) -> int:
        return self.train.mini_batch or self.rollout_batch

    @property
    def updates_per_step(self) -> int:
        """Optimizer steps per training step: mini-batches per rollout batch x epochs."""
        return (self.rollout_batch // self.mini_batch) * self.train.epochs

    @model_validator(mode="after")
    def _check_batches(self) -> Config:
        if self.rollout_batch % self.mini_batch:
            raise ValueError(
                f"train.mini_batch={self.mini_batch} must divide the rollout batch "
                f"(rollout.prompts_per_step * rollout.n = {self.rollout_batch})"
            )
        group_relative = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")
        if self.rollout.min_tokens > self.rollout.max_tokens:
            raise ValueError(
                f"rollout.min_tokens={self.rollout.min_tokens} exceeds rollout.max_tokens={self.rollout.max_tokens}"
            )
        if self.algorithm.dapo.overlong_buffer > self.rollout.max_tokens:
            raise ValueError(
                f"algorithm.dapo.overlong_buffer={self.algorithm.dapo.overlong_buffer} must not exceed "
                f"rollout.max_tokens={self.rollout.max_tokens}"
            )
        transport = self.sync.transport
        if self.placement.mode == "local" and transport not in ("auto", "inprocess"):
            raise ValueError(
                f"sync.transport={transport} needs placement.mode=ray (under local, every role shares "
                "one process and weights move in-process)"
            )
        if self.placement.mode == "ray" and transport == "inprocess":
            raise ValueError(
                "sync.transport=inprocess needs placement.mode=local; under ray use shm, broadcast, "
                "disk or object_store"
            )
        if self.train.schedule != "sync" and self.placement.mode != "ray":
            raise ValueError(
                f"train.schedule={self.train.schedule} overlaps generation with training, which needs "
                "separate processes: set placement.mode=ray"
            )
        if self.train.partial_rollouts and (
            self.train.schedule != "async" or self.train.on_stale != "drop" or self.train.partial_rollouts < 1
        ):
            raise ValueError(
                "train.partial_rollouts needs train.schedule=async with train.on_stale=drop and a factor "
                ">= 1 (a carried response holds tokens of older versions, which wait's admission "
                "control cannot account for)"
            )
        if self.train.schedule != "sync" and self.algorithm.dapo.dynamic_sampling:
            raise ValueError(
                f"algorithm.dapo.dynamic_sampling works with train.schedule=sync only, not {self.train.schedule}"
            )
        if self.placement.mode == "ray" and self.rollout.engine == "hf":
            raise ValueError("placement.mode=ray runs vLLM engines; set rollout.engine=vllm")
        if self.algorithm.kl.controller == "adaptive" and self.algorithm.kl.coef == 0:
            raise ValueError("algorithm.kl.controller=adaptive needs an initial algorithm.kl.coef > 0")
        if self.algorithm.advantage in group_relative and self.rollout.n < 2:
            raise ValueError(
                f"rollout.n must be at least 2 for {self.algorithm.advantage} (advantages are relative within a group)"
            )
        check_teacher(
            self.teacher, self.algorithm, self.placement.learner_ranks, self.placement.mode, self.rollout.temperature
        )
        return self
