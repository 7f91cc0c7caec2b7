"""Start the roles of a run on Ray: the learner actor (or its sharded ranks), the engine replicas, the teacher's
own actor (teacher.engine=actor or vllm), and the weight sync between them."""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, cast

import ray

from relayrl.config import Config, effective_transport
from relayrl.learner.role import Learner, LearnerRole
from relayrl.placement import Roles
from relayrl.placement.cluster import Slot, actor_options, reserve, split_slots, teacher_slot
from relayrl.placement.engine_worker import EngineWorker
from relayrl.placement.engines import RayEngineGroup
from relayrl.placement.handles import RemoteRole
from relayrl.placement.learner_restarts import LearnerRestarts
from relayrl.placement.sections import engine_settings, learner_settings
from relayrl.placement.teacher_actor import TeacherActor
from relayrl.sync.remote import RaySync

if TYPE_CHECKING:
    from relayrl.config import PlacementConfig
    from relayrl.learner.settings import LearnerSettings
    from relayrl.placement.learner_ranks import LearnerRanks


def build_ray_roles(config: Config, max_model_len: int) -> Roles:
    """Every actor started and the first weights already on the engines."""
    placement = config.placement
    group, slots = reserve(config)
    learner_slots, engine_slots = split_slots(slots)
    timeout = placement.call_timeout_s
    engine = engine_settings(config)  # what each engine actor builds its engine from
    learner, learner_actors = start_learner(config, group, learner_slots)

    def spawn(index: int) -> RemoteRole:
        slot = engine_slots[index]
        actor = (
            ray.remote(EngineWorker)
            .options(**actor_options(group, slot))  # with GPUs: its T, which the actor alone then sees
            .remote(engine, max_model_len, slot.threads, slot.cores)
        )
        return RemoteRole(actor, slot.role, timeout)

    engines = RayEngineGroup(spawn, placement)
    slot = teacher_slot(slots)  # teacher.engine=actor or vllm: the teachers' own actor
    teacher = None if slot is None else start_teacher(learner_settings(config), placement, group, slot, max_model_len)
    learner.ping()
    engines.ready()
    if teacher is not None:
        teacher.ping()
    sync = RaySync(config.sync, effective_transport(config))
    sync.setup(learner, engines)
    close = functools.partial(shutdown, learner, learner_actors, engines, group, teacher)

    def respawn() -> None:
        """A new learner group in the same bundles, behind the same handle (the loop, the sync and the time sharing
        hold it), with the weight sync attached to it; its weights are model.path's until the loop restores some."""
        for actor in learner_actors:  # every rank: a sharded group cannot go on without one of its members
            ray.kill(actor, no_restart=True)
        fresh, actors = start_learner(config, group, learner_slots)
        vars(learner).update(vars(fresh))  # the handle now reaches the new actors
        learner_actors[:] = actors  # what `close` kills
        learner.ping()
        sync.setup(learner, engines)

    restarts = LearnerRestarts(placement, respawn)
    # both handles forward every Learner method to the actor(s) by name (__getattr__), which a protocol cannot see
    return Roles(engines, cast(Learner, learner), sync, close=close, learner_restarts=restarts, teacher=teacher)


def start_teacher(
    learner: LearnerSettings, placement: PlacementConfig, group, slot: Slot, max_model_len: int
) -> TeacherActor:
    """teacher.engine=actor or vllm: the teachers in an actor of their own, in their own bundle (and GPU); each call
    with placement.call_timeout_s, a death reported naming the teacher and the actor restarted as an engine is
    (relayrl/placement/teacher_actor.py)."""
    from relayrl.learner.settings import TeacherSettings
    from relayrl.learner.teacher_role import TeacherRole

    settings = TeacherSettings.of(learner)

    def spawn() -> RemoteRole:
        actor = ray.remote(TeacherRole).options(**actor_options(group, slot))
        return RemoteRole(actor.remote(settings, slot.threads, max_model_len), "teacher", placement.call_timeout_s)

    return TeacherActor(spawn, placement)


def start_learner(config: Config, group, slots: list[Slot]) -> tuple[RemoteRole | LearnerRanks, list]:
    """The learner's handle and its actors: one `LearnerRole` actor, or `placement.learner_ranks` sharded rank
    actors behind one handle (relayrl/placement/learner_ranks.py): in one shared bundle on CPUs, one bundle (and
    GPU) each on GPUs."""
    if config.placement.learner_ranks > 1:
        from relayrl.placement.learner_ranks import start_learner_ranks

        ranks = start_learner_ranks(config, group, slots)
        return ranks, list(ranks.actors)
    (slot,) = slots
    actor = ray.remote(LearnerRole).options(**actor_options(group, slot)).remote(learner_settings(config), slot.threads)
    return RemoteRole(actor, "learner", config.placement.call_timeout_s), [actor]


def shutdown(learner, learner_actors: list, engines, group, teacher: TeacherActor | None = None) -> None:
    """Release shared memory and the placement group; the actors go with it."""
    from ray.util.placement_group import remove_placement_group

    with contextlib.suppress(Exception):  # the learner may be the role that died
        learner.close()
    for replica in engines.replicas:
        ray.kill(replica._actor, no_restart=True)
    for actor in learner_actors + ([teacher.actor] if teacher is not None else []):
        ray.kill(actor, no_restart=True)
    remove_placement_group(group)
