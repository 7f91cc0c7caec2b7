"""Several teachers routed by a dataset column (`teacher.teachers`, `teacher.route_by`): the config's rules, each
sample scored by the teacher its row names, the refusal of a route no teacher answers (naming value, column and
sample), the per-teacher metrics, and the plan's count of every teacher."""

import pytest
import torch

from relayrl.algorithms.distill import reverse_kl
from relayrl.algorithms.teacher_routes import TeacherRoutes
from relayrl.config import load_config
from relayrl.errors import ConfigError, DataError
from relayrl.learner.batching import make_experience
from relayrl.learner.role import LearnerRole
from relayrl.placement.sections import learner_settings
from relayrl.types import Prompt, Rollout, Score


def _config(student, *overrides):
    return load_config(None, [f"model.path={student}", "rollout.n=2", "rollout.prompts_per_step=4", *overrides])


def _routed(student, a, b):
    teachers = f"teacher.teachers=[{{route: add, path: {a}}}, {{route: sub, path: {b}}}]"
    return _config(student, "teacher.route_by=task", teachers)


def _rollouts(tasks, vocab=16):
    """Two samples per prompt row, the row's `task` column from `tasks` (varied prompt and response lengths)."""
    gen = torch.Generator().manual_seed(0)
    rollouts = []
    for g, task in enumerate(tasks):
        columns = {} if task is None else {"task": task, "answer": "1"}
        prompt = Prompt(f"p{g}", "", torch.randint(4, vocab, (3 + g,), generator=gen).tolist(), columns)
        for i in range(2):
            response = torch.randint(4, vocab, (1 + (g + i) % 4,), generator=gen).tolist()
            rollouts.append(Rollout(prompt, i, response, "", [-1.0] * len(response), "stop", [0] * len(response)))
    return rollouts


# ---------------------------------------------------------------------------- config rules


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["teacher.route_by=task"], "teacher.route_by without teacher.teachers"),
        (["teacher.teachers=[{route: a, path: /x}]"], "teacher.teachers needs teacher.route_by"),
        (["teacher.route_by=t", "teacher.path=/x", "teacher.teachers=[{route: a, path: /x}]"], "both set"),
        (["teacher.route_by=t", "teacher.teachers=[{route: a, path: /x}, {route: a, path: /y}]"], r"\['a', 'a'\]"),
    ],
)
def test_the_routed_teachers_rules_name_the_keys(random_model_dir, overrides, message):
    with pytest.raises(ConfigError, match=message):
        _config(random_model_dir, *overrides)


# ---------------------------------------------------------------------------- routing


def test_each_sample_is_scored_by_the_teacher_its_row_names(random_model_dir, warm_model_dir):
    rollouts = _rollouts(["add", "sub", "sub", "add"])
    routes = TeacherRoutes.of(_routed(random_model_dir, random_model_dir, warm_model_dir).teacher)
    assert routes is not None
    rows = routes.rows(rollouts)
    assert rows.tolist() == [0, 0, 1, 1, 1, 1, 0, 0]

    def scored(config, with_routes):
        role = LearnerRole(learner_settings(config))
        exp = role.prepare(make_experience(rollouts, [Score(1.0)] * len(rollouts), pad_id=0))
        exp.teacher_routes = rows if with_routes else None
        return role.score_teacher(exp).teacher_logprobs

    routed = scored(_routed(random_model_dir, random_model_dir, warm_model_dir), True)
    by_add = scored(_config(random_model_dir, f"teacher.path={random_model_dir}"), False)
    by_sub = scored(_config(random_model_dir, f"teacher.path={warm_model_dir}"), False)
    add, sub = rows == 0, rows == 1
    assert not torch.allclose(by_add, by_sub, atol=1e-3)  # the two teachers disagree: the check below can fail
    assert torch.allclose(routed[add], by_add[add], atol=1e-5)
    assert torch.allclose(routed[sub], by_sub[sub], atol=1e-5)


def test_one_teacher_scores_every_row(random_model_dir):
    routes = TeacherRoutes.of(_config(random_model_dir, f"teacher.path={random_model_dir}").teacher)
    assert routes is not None and routes.names == ("",)
    assert routes.rows(_rollouts([None, "anything"])).tolist() == [0, 0, 0, 0]
    assert TeacherRoutes.of(_config(random_model_dir).teacher) is None


def test_a_route_no_teacher_answers_is_refused_naming_value_column_and_sample(random_model_dir):
    routes = TeacherRoutes.of(_routed(random_model_dir, random_model_dir, random_model_dir).teacher)
    assert routes is not None
    with pytest.raises(DataError, match=r"sample p1#0: column 'task' holds 'mul', which no teacher answers .*add, sub"):
        routes.rows(_rollouts(["add", "mul"]))
    with pytest.raises(DataError, match=r"sample p1#0: no 'task' column \(teacher.route_by=task\); .*: none"):
        routes.rows(_rollouts(["add", None]))


def test_the_metrics_are_per_teacher(random_model_dir):
    routes = TeacherRoutes(("add", "sub"), "task")
    exp = make_experience(_rollouts(["add", "sub", "add"]), [Score(1.0)] * 6, pad_id=0)
    exp.old_logprobs = torch.randn(exp.loss_mask.shape) * exp.loss_mask
    exp.teacher_logprobs = torch.randn(exp.loss_mask.shape) * exp.loss_mask
    exp.teacher_routes = routes.rows(_rollouts(["add", "sub", "add"]))
    metrics = routes.metrics(exp)
    assert set(metrics) == {"distill/reverse_kl/add", "distill/reverse_kl/sub"}
    sub = exp.teacher_routes == 1
    expected = reverse_kl(exp.old_logprobs[sub], exp.teacher_logprobs[sub], exp.loss_mask[sub])
    assert metrics["distill/reverse_kl/sub"] == expected
    assert metrics["distill/reverse_kl/add"] != expected
    assert TeacherRoutes(("",)).metrics(exp) == {}  # one teacher: distill/reverse_kl alone


# ---------------------------------------------------------------------------- the plan


def test_the_plan_counts_every_teachers_memory_and_the_largest_forward(random_model_dir, warm_model_dir):
    from relayrl.planner.teacher import teacher_forward_params, teacher_params

    def resident(config):  # the teachers' parameters in the learner
        return teacher_params(config.teacher, config.model)

    one, two = (
        _config(random_model_dir, f"teacher.path={random_model_dir}"),
        _routed(random_model_dir, random_model_dir, warm_model_dir),
    )
    assert resident(two) == resident(one) + resident(_config(random_model_dir, f"teacher.path={warm_model_dir}"))
    assert teacher_forward_params(two.teacher) == max(resident(one), resident(two) - resident(one))
    none = _config(random_model_dir)
    assert resident(none) == teacher_forward_params(none.teacher) == 0


def test_a_routed_teacher_that_does_not_load_is_named_by_its_key(random_model_dir, tmp_path):
    from relayrl.errors import ModelError
    from relayrl.learner.teacher import check_teacher_dir, teacher_keys

    config = _routed(random_model_dir, random_model_dir, tmp_path)
    assert teacher_keys(config.teacher) == ["teacher.teachers[0].path", "teacher.teachers[1].path"]
    with pytest.raises(ModelError, match=r"teacher.teachers\[1\].path="):
        check_teacher_dir(str(tmp_path), str(random_model_dir), teacher_keys(config.teacher)[1])


def test_a_route_no_teacher_answers_is_refused_at_data_load_before_any_role_starts(random_model_dir, tmp_path):
    import json

    from relayrl.build import build_trainer

    rows = [{"prompt": "1+2=", "task": "add"}, {"prompt": "5+3=", "task": "sub"}, {"prompt": "2+3=", "task": "mul"}]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = _routed(random_model_dir, random_model_dir, random_model_dir)
    config.data.train, config.log.dir = str(train), str(tmp_path / "run")
    with pytest.raises(DataError, match=r"data.train row 2: column 'task' holds 'mul', which no teacher answers"):
        build_trainer(config)
    assert not (tmp_path / "run").exists()


def test_a_route_no_teacher_answers_stops_the_step_before_the_learner_runs(random_model_dir):
    """A file read lazily is checked at the step: the drawn batch's unknown route stops it before any pass."""
    from relayrl.sources.base import Batch
    from tests.unit.test_time_sharing import Recorder, stand_in_trainer

    log: list[str] = []
    rollouts = _rollouts(["add", "mul"])
    schedule = Recorder(log, "schedule")
    schedule.batch = lambda step, timer: log.append("generate") or Batch(rollouts, [Score(1.0)] * len(rollouts))
    engines, learner = Recorder(log, "engines"), Recorder(log, "learner")
    trainer = stand_in_trainer(log, engines, learner, teacher_routes=TeacherRoutes(("add", "sub"), "task"))
    trainer.schedule = schedule  # pyright: ignore[reportAttributeAccessIssue]
    with pytest.raises(DataError, match=r"sample p1#0: column 'task' holds 'mul'"):
        trainer.step(0)
    assert log == ["generate"]  # no log-probs, no teacher, no update
