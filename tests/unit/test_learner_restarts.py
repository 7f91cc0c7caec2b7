"""`placement.on_learner_failure=restart`: the training loop heals a learner that died or hung. Here the real loop
runs in this process (tiny random model, HF engine, sync schedule: a run of one seed is reproducible) with a
learner that fails once at a chosen step and a respawn that builds a fresh one from model.path; the Ray kill of a
real rank is tests/e2e/test_learner_restart.py. A healed run logs exactly the rows of an undisturbed one (the
steps after the restored checkpoint are redone, their first rows cut), at the same losses and rewards."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest

from relayrl.build import build_trainer
from relayrl.config import load_config
from relayrl.errors import RoleFailure
from relayrl.learner.role import LearnerRole
from relayrl.placement.learner_restarts import LearnerRestarts
from relayrl.placement.sections import learner_settings
from relayrl.schedules.modes import AsyncSchedule

STEPS = 5
VARIES = ("time/", "time_frac/", "throughput/", "sync/GBps", "memory/", "placement/")  # timings; the count differs


class FailingOnce:
    """A learner handle whose `update` fails at step `at` (the first time only) the way the Ray handle reports a
    rank that died, hung, or raised; every other call goes to the learner inside."""

    def __init__(self, inner: LearnerRole, at: int, failure: RoleFailure):
        self.inner, self.at, self.failure, self.failed = inner, at, failure, 0
        self.newest: list[tuple[int, int]] = []  # (step, the newest policy version among its tokens)

    def update(self, step, exp, sample_rows=0):
        self.newest.append((step, int(exp.versions[exp.loss_mask.bool()].max())))
        if step == self.at and not self.failed:
            self.failed += 1
            raise self.failure
        return self.inner.update(step, exp, sample_rows)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def died() -> RoleFailure:
    return RoleFailure("learner rank 1 (actor 0123abcd) died during update: killed", "learner rank 1", died=True)


def trainer_for(tmp_path, model_dir, toy_task, name, *settings, at=None, failure=None):
    config = load_config(
        None,
        [
            f"model.path={model_dir}",
            f"data.train={toy_task['train']}",
            "data.max_prompt_tokens=16",
            "reward.fn=tests.unit.reward_fns_for_service:length",  # a signal from a random model: weights change
            "rollout.engine=hf",
            "rollout.n=2",
            "rollout.prompts_per_step=4",
            "rollout.max_tokens=3",
            f"train.steps={STEPS}",
            "train.lr=1e-3",
            f"log.dir={tmp_path / name}",
            "log.progress=false",
            "log.save_model=false",
            *settings,
        ],
    )
    trainer = build_trainer(config)
    respawns: list[int] = []
    if failure is not None:
        handle = FailingOnce(trainer.learner, at, failure)  # pyright: ignore[reportArgumentType]
        trainer.learner = handle  # pyright: ignore[reportAttributeAccessIssue]

        def respawn():  # what relayrl/placement/build.py does with actors: a new learner from model.path
            handle.inner = LearnerRole(learner_settings(config))
            respawns.append(1)

        placement = config.placement.model_copy(update={"on_learner_failure": "restart", "max_learner_restarts": 1})
        trainer.learner_restarts = LearnerRestarts(placement, respawn)
    return trainer, respawns


def run(trainer) -> list[dict]:
    try:
        trainer.run()
    finally:
        trainer.close()
    lines = (trainer.run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(VARIES)}


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory, random_model_dir, toy_task):
    trainer, _ = trainer_for(tmp_path_factory.mktemp("straight"), random_model_dir, toy_task, "run")
    return [comparable(row) for row in run(trainer)]


@pytest.mark.parametrize(
    "checkpoint_every,at,restored",
    [(2, 3, "step_000001"), (0, 2, "at step 0")],  # from the newest checkpoint; from model.path when there is none
)
def test_a_learner_that_died_is_restored_and_the_run_equals_an_undisturbed_one(
    tmp_path, random_model_dir, toy_task, undisturbed, capsys, checkpoint_every, at, restored
):
    trainer, respawns = trainer_for(
        tmp_path, random_model_dir, toy_task, "run", f"checkpoint.every={checkpoint_every}", at=at, failure=died()
    )
    rows = run(trainer)
    assert respawns == [1]
    assert [row["step"] for row in rows] == list(range(STEPS))  # the redone steps logged once
    assert [comparable(row) for row in rows] == undisturbed
    assert all(row["actor/grad_norm"] > 0 for row in rows)  # each step moved the weights: a wrong restore shows
    assert [row["placement/learner_restarts"] for row in rows][-1] == 1.0
    err = capsys.readouterr().err
    assert "died during update: killed; restarting the learner from" in err and restored in err
    assert "(restart 1 of 1)" in err


def test_an_async_run_trains_nothing_generated_before_the_restart(tmp_path, random_model_dir, toy_task):
    """The producers ran ahead of the failed step with newer weights than the checkpoint's: none of those rollouts
    is trained after the restore (step s trains from version s, so no token is newer than s)."""
    trainer, respawns = trainer_for(
        tmp_path, random_model_dir, toy_task, "run", "checkpoint.every=2", at=3, failure=died()
    )
    # async is refused under placement.mode=local (its producers and the learner would share this process's cores);
    # here they may: the schedule is the real one, on the in-process HF engine (as in tests/unit/test_async_resume.py)
    train = trainer.loop.train.model_copy(update={"schedule": "async", "max_staleness": 1, "on_stale": "wait"})
    settings = dataclasses.replace(trainer.make_schedule.args[1], train=train)  # the built schedule's, made async
    trainer.make_schedule = functools.partial(AsyncSchedule, trainer.source, settings)
    rows = run(trainer)
    assert respawns == [1] and [row["step"] for row in rows] == list(range(STEPS))
    handle = trainer.learner
    assert [step for step, _ in handle.newest] == [0, 1, 2, 3, 2, 3, 4]  # restored at step_000001
    assert all(newest <= step for step, newest in handle.newest), handle.newest
    assert max(row["stale/version_max"] for row in rows) <= 1
    # tokens of the policy trained (none newer: lags are clamped at 0) match the learner's log-probs
    assert max(row.get("mismatch/logprob_abs_max", 0.0) for row in rows) < 1e-3


def test_a_hung_learner_is_restarted_too(tmp_path, random_model_dir, toy_task):
    hung = RoleFailure("learner (actor 0123abcd) did not finish update within 5 s", "learner", died=False, hung=True)
    trainer, respawns = trainer_for(tmp_path, random_model_dir, toy_task, "run", at=1, failure=hung)
    assert [row["step"] for row in run(trainer)] == list(range(STEPS)) and respawns == [1]


def test_an_error_the_learner_raised_is_not_retried(tmp_path, random_model_dir, toy_task):
    raised = RoleFailure(
        "learner rank 0 (actor 0123abcd) raised during update: ValueError: bad", "learner rank 0", False
    )
    trainer, respawns = trainer_for(tmp_path, random_model_dir, toy_task, "run", at=1, failure=raised)
    with pytest.raises(RoleFailure, match="ValueError: bad"):
        run(trainer)
    assert respawns == []


@pytest.mark.parametrize(
    "update,message",
    [
        ({"on_learner_failure": "stop"}, r"died during update: killed \(placement.on_learner_failure=stop\)$"),
        ({"max_learner_restarts": 0}, r"killed; placement.max_learner_restarts=0 already used$"),
    ],
)
def test_a_learner_failure_stops_the_run_when_restarts_are_off_or_used_up(
    tmp_path, random_model_dir, toy_task, update, message
):
    trainer, respawns = trainer_for(tmp_path, random_model_dir, toy_task, "run", at=1, failure=died())
    trainer.learner_restarts.placement = trainer.learner_restarts.placement.model_copy(update=update)
    with pytest.raises(RoleFailure, match=message) as caught:
        run(trainer)
    assert respawns == [] and caught.value.died


def test_an_engine_failure_is_not_the_learners_to_heal(tmp_path, random_model_dir, toy_task):
    engine = RoleFailure("engine 0 (actor 0123abcd) died during generate", "engine 0", died=True)
    trainer, respawns = trainer_for(tmp_path, random_model_dir, toy_task, "run", at=1, failure=engine)
    with pytest.raises(RoleFailure, match="engine 0"):
        run(trainer)
    assert respawns == []
