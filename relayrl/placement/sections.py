"""The config sliced for the roles placement builds: each role takes the sections it reads (torchtitan's way: a
component, its own small config), never the whole tree. Read here, across sections, by whoever places the role: the
driver for `placement.mode=local` and for every Ray actor it starts (the settings travel to the actor)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from relayrl.learner.settings import LearnerSettings
from relayrl.models.adapter_sync import kept_versions
from relayrl.rollout.build import EngineSettings
from relayrl.rollout.sleep import Colocation

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
        teacher=config.teacher if config.teacher.present else None,
        colocated=colocation(config).colocated,
    )


def colocation(config: Config, as_asked: bool = False) -> Colocation:
    """What deciding colocated time-sharing reads (relayrl/rollout/sleep.py); `as_asked`: `auto` where auto chose
    (the planner's question of a resolved config: what `auto` would choose on its target hardware)."""
    placement, chosen = config.placement, config._auto if as_asked else {}
    return Colocation(
        sleep="auto" if "rollout.sleep" in chosen else config.rollout.sleep,
        offload="auto" if "learner.offload" in chosen else config.learner.offload,
        colocated=placement.mode == "local" or placement.layout == "colocated",
        learner_ranks=placement.learner_ranks,
        schedule=config.train.schedule,
        adapter_push=config.model.lora is not None and config.sync.lora == "adapter",
    )
