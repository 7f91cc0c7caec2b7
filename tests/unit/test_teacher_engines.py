"""The teacher's engines other than `local`: `actor` (the teachers in a process of their own, `TeacherRole`) scores
exactly as the local engine does, is refused without Ray placement, gets a bundle of its own (and a GPU), and a
teacher actor that dies stops the run naming the teacher when restarts are off or spent (the restart itself:
tests/e2e/test_distill_learns.py); `vllm`'s refusals (its scoring against the local engine's
is tests/integration/test_vllm_engine.py); what `auto` chooses."""

from collections.abc import Callable
from typing import cast

import pytest
import torch

from relayrl.config import load_config
from relayrl.errors import ConfigError, RoleFailure
from relayrl.learner.role import LearnerRole
from relayrl.learner.settings import TeacherSettings
from relayrl.learner.teacher_role import TeacherRole
from relayrl.placement.cluster import check_fits, plan_slots, split_slots, teacher_cpus, teacher_slot
from relayrl.placement.handles import RemoteRole
from relayrl.placement.sections import learner_settings
from tests.unit.test_learner import _experience
from tests.unit.test_teacher import other_teacher_dir  # noqa: F401  (a module fixture: a teacher that disagrees)


def _config(student, *overrides):
    return load_config(None, [f"model.path={student}", "rollout.n=4", "rollout.prompts_per_step=4", *overrides])


def _local_and_own(config):
    """The local engine's log-probs and a teacher of its own's, on the same batch."""
    learner = LearnerRole(
        learner_settings(config.model_copy(update={"teacher": config.teacher.model_copy(update={"engine": "local"})}))
    )
    local = learner.score_teacher(learner.prepare(_experience())).teacher_logprobs
    own = TeacherRole(TeacherSettings.of(learner_settings(config))).score_teacher(_experience()).teacher_logprobs
    assert local is not None and own is not None
    return local, own


def test_a_teacher_of_its_own_scores_exactly_as_the_local_engine(random_model_dir, other_teacher_dir):  # noqa: F811
    config = _config(
        random_model_dir, f"teacher.path={other_teacher_dir}", "placement.mode=ray", "teacher.engine=actor"
    )
    assert LearnerRole(learner_settings(config)).teacher is None  # the learner loads no teacher: it has its own role
    local, own = _local_and_own(config)
    assert torch.equal(local, own)
    assert (own[_experience().loss_mask.bool()] != 0).all()


def test_a_lora_self_teacher_of_its_own_is_the_base_with_the_adapter_off(random_model_dir):
    lora = ("model.lora.rank=4", "model.lora.alpha=8", "train.lr=1e-4", "placement.mode=ray", "teacher.engine=actor")
    local, own = _local_and_own(_config(random_model_dir, f"teacher.path={random_model_dir}", *lora))
    assert torch.allclose(local, own, atol=1e-6)


def test_a_teacher_actor_without_ray_placement_is_refused_naming_the_keys(random_model_dir):
    with pytest.raises(ConfigError, match="teacher.engine=actor .* needs placement.mode=ray"):
        _config(random_model_dir, f"teacher.path={random_model_dir}", "teacher.engine=actor")


def test_a_teacher_actor_gets_a_bundle_of_its_own_and_a_gpu_of_its_own(random_model_dir):
    config = _config(
        random_model_dir,
        f"teacher.path={random_model_dir}",
        "placement.mode=ray",
        "teacher.engine=actor",
        "teacher.cpus=2",
        "placement.engines=2",
    )
    for gpus in (False, True):
        bundles, slots = plan_slots(config.placement, 8, gpus, teacher=teacher_cpus(config.teacher))
        slot = teacher_slot(slots)
        assert slot is not None and slot.bundle == len(bundles) - 1 and slot.threads == 2
        assert bundles[-1] == ({"CPU": 2.0, "GPU": 1.0} if gpus else {"CPU": 2.0})
        assert [s.role for s in split_slots(slots)[1]] == ["engine 0", "engine 1"]  # never taken for an engine
    with pytest.raises(Exception, match=r"engine 1: 1, teacher: 1\) but the cluster has 3 .* teacher.engine=local"):
        check_fits(config.placement, bundles, {"CPU": 16, "GPU": 3}, {"CPU": 16, "GPU": 3}, teacher=True)
    local = config.model_copy(update={"teacher": config.teacher.model_copy(update={"engine": "local"})})
    assert teacher_slot(plan_slots(local.placement, 8, teacher=teacher_cpus(local.teacher))[1]) is None


class TeacherActorDies:
    """The handle on a teacher actor that died, as relayrl/placement/handles.py reports it."""

    def score_teacher(self, exp, teacher_rows=None):
        raise RoleFailure("teacher (actor 0123abcd) died during score_teacher: killed", "teacher", died=True)


def test_a_teacher_actor_that_dies_stops_the_run_naming_it(tmp_path, random_model_dir, toy_task):
    from relayrl.placement.learner_restarts import LearnerRestarts
    from tests.unit.test_learner_restarts import run, trainer_for

    teacher = (f"teacher.path={random_model_dir}", "algorithm.advantage=distill")
    trainer, _ = trainer_for(tmp_path, random_model_dir, toy_task, "run", *teacher)
    trainer.teacher, respawns = TeacherActorDies(), []
    placement = load_config(None, []).placement.model_copy(update={"on_learner_failure": "restart"})
    trainer.learner_restarts = LearnerRestarts(placement, lambda: respawns.append(1))
    with pytest.raises(RoleFailure, match=r"^teacher \(actor 0123abcd\) died during score_teacher"):
        run(trainer)
    assert respawns == []  # the learner's restarts do not reach the teacher: the run stops, naming it


def test_a_vllm_teacher_is_refused_beside_another_temperature_or_several_teachers(random_model_dir):
    vllm = (f"teacher.path={random_model_dir}", "teacher.engine=vllm")
    with pytest.raises(ConfigError, match="teacher.engine=vllm with rollout.temperature=0.7: .* temperature 1"):
        _config(random_model_dir, *vllm, "rollout.temperature=0.7")
    routed = f"teacher.teachers=[{{route: a, path: {random_model_dir}}}]"
    with pytest.raises(
        ConfigError, match="teacher.engine=vllm serves one teacher .* use teacher.engine=local or actor"
    ):
        _config(random_model_dir, "teacher.engine=vllm", "teacher.route_by=task", routed)
    assert _config(random_model_dir, *vllm).teacher.engine == "vllm"  # placement.mode=local: in the driver


def test_auto_chooses_an_actor_on_ray_with_a_gpu_and_the_local_engine_elsewhere():
    from relayrl.learner.teacher import choose_teacher_engine

    assert choose_teacher_engine("auto", "ray", gpu=True)[0] == "actor"
    assert choose_teacher_engine("auto", "ray", gpu=False)[0] == "local"
    assert choose_teacher_engine("auto", "local", gpu=True)[0] == "local"
    assert choose_teacher_engine("vllm", "local") == ("vllm", "as set")


def test_teacher_cpus_beside_the_local_engine_is_warned_about(random_model_dir):
    from relayrl.errors import ConfigWarning

    with pytest.warns(ConfigWarning, match="teacher.cpus has no effect with teacher.engine=local"):
        _config(random_model_dir, f"teacher.path={random_model_dir}", "teacher.engine=local", "teacher.cpus=2")


def test_a_teacher_of_its_own_scores_after_its_own_prompt_as_the_local_engine(random_model_dir, other_teacher_dir):  # noqa: F811
    from relayrl.algorithms.teacher_prompt import TeacherPrompt
    from relayrl.learner.batching import make_experience
    from relayrl.learner.teacher import teacher_experience
    from relayrl.models.loading import load_tokenizer
    from relayrl.types import Score
    from tests.unit.test_teacher_prompt import _rollouts

    tokenizer = load_tokenizer(random_model_dir)
    rollouts, template = _rollouts(tokenizer, observation=True), TeacherPrompt("2+2=4 {prompt}{answer}", tokenizer)
    config = _config(
        random_model_dir, f"teacher.path={other_teacher_dir}", "placement.mode=ray", "teacher.engine=actor"
    )
    local_config = config.model_copy(update={"teacher": config.teacher.model_copy(update={"engine": "local"})})
    scored = []
    for role in (
        LearnerRole(learner_settings(local_config)),
        TeacherRole(TeacherSettings.of(learner_settings(config))),
    ):
        student = make_experience(rollouts, [Score(0.0)] * len(rollouts), pad_id=0)
        scored.append(role.score_teacher(student, teacher_experience(template, rollouts, pad_id=0)).teacher_logprobs)
    local, own = scored
    assert local is not None and own is not None and torch.equal(local, own) and local.abs().sum() > 0


def _spawner(handle: type, spawned: list) -> Callable[[], RemoteRole]:
    """A `TeacherActor` spawn that hands out stand-ins for the actor's handle, counting each start in `spawned`."""

    def spawn() -> RemoteRole:
        spawned.append(1)
        return cast(RemoteRole, handle())

    return spawn


@pytest.mark.parametrize(
    ("setting", "why"),
    [
        ("placement.on_engine_failure=stop", r" \(placement.on_engine_failure=stop\)$"),
        ("placement.max_engine_restarts=0", r"; placement.max_engine_restarts=0 already used$"),
    ],
)
def test_a_dead_teacher_actor_with_restarts_off_or_spent_stops_naming_it_and_the_setting(setting, why):
    """relayrl/placement/teacher_actor.py before any Ray call: no actor is started again. (The restart itself, of a
    killed actor's process, is tests/e2e/test_distill_learns.py's one_step_off run on Ray.)"""
    from relayrl.placement.teacher_actor import TeacherActor

    spawned = []
    teacher = TeacherActor(
        _spawner(TeacherActorDies, spawned), load_config(None, ["placement.mode=ray", setting]).placement
    )
    with pytest.raises(RoleFailure, match=r"^teacher \(actor 0123abcd\) died during score_teacher: killed" + why):
        teacher.score_teacher(_experience())
    assert spawned == [1] and teacher.metrics() == {"placement/teacher_restarts": 0.0}


def test_an_error_raised_inside_the_teacher_actor_is_not_a_death_and_is_not_retried():
    from relayrl.errors import PlacementError
    from relayrl.placement.teacher_actor import TeacherActor

    class TeacherRaises:
        def score_teacher(self, exp, teacher_rows=None):
            raise PlacementError("teacher (actor 0123abcd) raised during score_teacher: ValueError: a bad row")

    spawned = []
    teacher = TeacherActor(_spawner(TeacherRaises, spawned), load_config(None, ["placement.mode=ray"]).placement)
    with pytest.raises(PlacementError, match="a bad row"):
        teacher.score_teacher(_experience())
    assert spawned == [1]  # a restart would meet the same error
