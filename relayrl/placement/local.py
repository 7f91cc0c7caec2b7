"""`placement.mode=local`: every role in this process, colocated by construction (generate, then train).

The engine is built by the same function as a Ray engine actor's (`engine_from_settings`), so no `rollout.*`
setting reaches one placement and not the other, and is held as a one-replica group.
"""

from __future__ import annotations

import time

from relayrl.config import Config
from relayrl.learner.role import LearnerRole
from relayrl.placement import Roles
from relayrl.placement.sections import engine_settings, learner_settings
from relayrl.rollout.build import engine_from_settings
from relayrl.rollout.local_group import LocalEngineGroup
from relayrl.sync.inprocess import InProcessSync


def build_local_roles(config: Config, max_len: int) -> Roles:
    start = time.perf_counter()
    engine = engine_from_settings(engine_settings(config), max_len)
    engines = LocalEngineGroup(engine, start_s=time.perf_counter() - start)
    settings, teacher = learner_settings(config), None
    if settings.teacher is not None and settings.teacher.engine == "vllm":  # its own vLLM engine, beside the rollout's
        from relayrl.learner.settings import TeacherSettings
        from relayrl.learner.teacher_role import TeacherRole

        teacher = TeacherRole(TeacherSettings.of(settings), max_model_len=max_len)
    return Roles(engines, LearnerRole(settings), InProcessSync(), close=lambda: None, teacher=teacher)
