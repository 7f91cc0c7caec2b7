"""The config sliced for the roles placement builds: each role takes the sections it reads (torchtitan's way: a
component, its own small config), never the whole tree. Read here, across sections, by whoever places the role: the
driver for `placement.mode=local` and for every Ray actor it starts (the settings travel to the actor)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from relayrl.learner.settings import LearnerSettings
from relayrl.models.adapter_sync import kept_versions
from relayrl.rollout.build import EngineSettings

if TYPE_CHECKING:
    from relayrl.config import Config


def engine_settings(config: Config) -> EngineSettings:
    """What the run's engine is built from (relayrl/rollout/build.py)."""
    return EngineSettings(
        config.rollout, config.model, config.train.seed, config.sync.lora, kept_versions(config.train)
    )


def learner_settings(config: Config) -> LearnerSettings:
    """What the learner is built from (relayrl/learner/), on one process or on each sharded rank."""
    return LearnerSettings(
        model=config.model,
        algorithm=config.algorithm,
        critic=config.critic,
        train=config.train,
        learner=config.learner,
        rollout=config.rollout,
        lora_sync=config.sync.lora,
        mini_batch=config.mini_batch,
        updates_per_step=config.updates_per_step,
    )
