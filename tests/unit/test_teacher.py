"""The teacher role: its config rules, the refusals at start (each naming the key and path), `teacher.engine: auto`'s
choice, and the local engine in the learner (its log-probs, the passes it makes the learner run)."""

import shutil

import pytest
import torch

from relayrl.build import resolve
from relayrl.config import dump_config, load_config
from relayrl.errors import ConfigError, ConfigWarning, ModelError, RoleFailure
from relayrl.learner.role import LearnerRole
from relayrl.learner.teacher import check_teacher_dir
from relayrl.models.tiny import build_tiny
from relayrl.placement.sections import learner_settings
from tests.unit.test_learner import _experience


@pytest.fixture(scope="module")
def other_teacher_dir(tmp_path_factory, random_model_dir):
    """A second random tiny model with the student's tokenizer (a different seed): a teacher that disagrees."""
    from relayrl.models.loading import load_tokenizer
    from relayrl.models.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("teacher")
    tokenizer = load_tokenizer(random_model_dir)
    model = build_tiny_model(vocab_size=len(tokenizer), hidden=64, layers=2, heads=2, intermediate=128, seed=7)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _config(student, *overrides):
    return load_config(None, [f"model.path={student}", "rollout.n=4", "rollout.prompts_per_step=4", *overrides])


# ---------------------------------------------------------------------------- config rules


def test_distill_without_a_teacher_is_refused_naming_the_key(random_model_dir):
    with pytest.raises(ConfigError, match="algorithm.advantage=distill needs a teacher: set teacher.path"):
        _config(random_model_dir, "algorithm.advantage=distill")


def test_distill_in_the_reward_needs_a_reward_estimator(random_model_dir):
    with pytest.raises(ConfigError, match="algorithm.distill.mode=reward .* algorithm.advantage=distill has none"):
        _config(
            random_model_dir,
            f"teacher.path={random_model_dir}",
            "algorithm.advantage=distill",
            "algorithm.distill.mode=reward",
        )


def test_a_teacher_in_the_learners_process_beside_sharded_ranks_is_refused(random_model_dir):
    with pytest.raises(
        ConfigError, match="teacher.engine=local with placement.learner_ranks=2: .* use teacher.engine=actor"
    ):
        _config(
            random_model_dir,
            f"teacher.path={random_model_dir}",
            "teacher.engine=local",
            "placement.mode=ray",
            "placement.learner_ranks=2",
        )


def test_auto_engine_beside_sharded_ranks_is_an_actor_of_its_own(random_model_dir):
    sharded = ("placement.mode=ray", "placement.learner_ranks=2", "rollout.engine=vllm")
    config = resolve(_config(random_model_dir, f"teacher.path={random_model_dir}", *sharded))
    assert config.teacher.engine == "actor"  # even on a CPU, where one rank would keep it local
    assert "engine: auto  # auto chose actor: a Ray actor of its own: placement.learner_ranks > 1" in dump_config(
        config
    )


def test_distill_settings_without_a_teacher_are_warned_about_by_name(random_model_dir):
    with pytest.warns(ConfigWarning, match="algorithm.distill.coef has no effect without teacher.path"):
        _config(random_model_dir, "algorithm.distill.coef=0.5")
    with pytest.warns(ConfigWarning, match="teacher.dtype has no effect without teacher.path"):
        _config(random_model_dir, "teacher.dtype=float32")


def test_auto_engine_resolves_to_local_and_the_dump_says_why(random_model_dir):
    config = resolve(_config(random_model_dir, f"teacher.path={random_model_dir}", "rollout.engine=hf"))
    assert config.teacher.engine == "local"
    assert "engine: auto  # auto chose local: a batched forward in the learner's process" in dump_config(config)


# ---------------------------------------------------------------------------- refusals at start


def test_a_directory_without_config_is_refused(tmp_path, random_model_dir):
    with pytest.raises(ModelError, match=f"teacher.path='{tmp_path}' is not a model directory"):
        check_teacher_dir(str(tmp_path), str(random_model_dir))


def test_an_unreadable_config_is_refused(tmp_path, random_model_dir):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match="teacher.path=.*cannot read its config.json"):
        check_teacher_dir(str(tmp_path), str(random_model_dir))


def test_a_directory_without_weights_is_refused(tmp_path, random_model_dir):
    shutil.copy(random_model_dir / "config.json", tmp_path / "config.json")
    with pytest.raises(ModelError, match="teacher.path=.* holds no weights"):
        check_teacher_dir(str(tmp_path), str(random_model_dir))


def test_a_directory_without_a_tokenizer_is_refused(tmp_path, random_model_dir):
    for name in ("config.json", "model.safetensors"):
        shutil.copy(random_model_dir / name, tmp_path / name)
    with pytest.raises(ModelError, match="teacher.path=.*cannot load its tokenizer"):
        check_teacher_dir(str(tmp_path), str(random_model_dir))


def test_another_vocabulary_is_refused_naming_both_paths(tmp_path, random_model_dir):
    build_tiny(["xyz qrs"], tmp_path, hidden=32, layers=1, heads=1, intermediate=64)
    with pytest.raises(ModelError) as err:
        check_teacher_dir(str(tmp_path), str(random_model_dir))
    message = str(err.value)
    assert f"teacher.path='{tmp_path}'" in message and f"model.path='{random_model_dir}'" in message
    assert "vocabulary differs" in message


def test_a_run_with_a_bad_teacher_stops_before_its_run_directory(tmp_path, random_model_dir, toy_task):
    from benchmarks.learning_cases import run_in_process, write_config

    config = write_config(tmp_path / "cfg.yaml", random_model_dir, toy_task, tmp_path / "run", "hf")
    result = run_in_process("train", str(config), f"teacher.path={tmp_path / 'missing'}")
    assert result.returncode != 0
    assert "teacher.path=" in result.stderr and "is not a model directory" in result.stderr
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------- the local engine


def test_a_teacher_equal_to_the_student_scores_like_the_policy(random_model_dir):
    role = LearnerRole(learner_settings(_config(random_model_dir, f"teacher.path={random_model_dir}")))
    assert role.policy.needs_old_logprobs  # the signal is teacher - old, taken before the update
    exp = role.score_teacher(role.prepare(_experience()))
    assert torch.allclose(exp.teacher_logprobs, exp.old_logprobs, atol=1e-5)
    assert (exp.teacher_logprobs[exp.loss_mask == 0] == 0).all()


def test_distillation_trains_the_student_towards_its_teacher(random_model_dir, other_teacher_dir):
    from relayrl.algorithms.stage import advantage_stage

    config = _config(
        random_model_dir, f"teacher.path={other_teacher_dir}", "algorithm.advantage=distill", "train.lr=1e-3"
    )
    role, stage = LearnerRole(learner_settings(config)), advantage_stage(config.algorithm, teacher=True)
    gaps = []
    for _ in range(6):  # the same tokens each step: the student's log-probs of them move towards the teacher's
        exp = role.score_teacher(role.prepare(_experience()))
        gaps.append(float((exp.old_logprobs - exp.teacher_logprobs).abs()[exp.loss_mask.bool()].mean()))
        role.update(0, stage(exp, []))
    assert gaps[-1] < gaps[0] * 0.97, gaps
    assert gaps == sorted(gaps, reverse=True), gaps


def test_score_teacher_without_a_teacher_is_a_bug_named(random_model_dir):
    role = LearnerRole(learner_settings(_config(random_model_dir)))
    with pytest.raises(RuntimeError, match="without teacher.path"):
        role.score_teacher(_experience())


@pytest.mark.parametrize(
    "placement",
    [
        ("algorithm.advantage=distill",),
        ("algorithm.distill.coef=1",),
        ("algorithm.distill.mode=reward",),
        ("algorithm.advantage=gae", "algorithm.distill.coef=1"),
        ("algorithm.advantage=gae", "algorithm.distill.mode=reward"),
    ],
    ids=["distill alone", "beside GRPO's advantage", "in GRPO's reward", "beside GAE's advantage", "in GAE's reward"],
)
def test_a_multi_turn_trajectorys_observation_tokens_get_no_teacher_signal(
    random_model_dir, other_teacher_dir, placement
):
    """Alone or beside a reward, the teacher's signal reaches the policy's tokens only: the advantages with the
    teacher minus those without it are 0 on the observation an environment wrote (and on the prompt)."""
    from relayrl.algorithms.distill import distill_metrics
    from relayrl.algorithms.stage import advantage_stage
    from relayrl.learner.batching import make_experience
    from relayrl.types import Prompt, Rollout, Score

    prompt = Prompt("p", "", [5, 6, 7])
    turns = [1, 1, 0, 0, 0, 1, 1]  # two turns of the policy around an observation the environment wrote
    rollouts = [
        Rollout(prompt, i, [8, 9, 10, 11, 12, 13, 14], "", [-1.0] * 7, "stop", [0] * 7, loss_mask=turns)
        for i in range(4)
    ]
    config = _config(random_model_dir, f"teacher.path={other_teacher_dir}", *placement)
    role = LearnerRole(learner_settings(config))
    rewards = [Score(1.0), Score(0.0), Score(1.0), Score(0.0)]  # a reward advantage of its own beside the teacher's
    exp = role.score_teacher(role.prepare(make_experience(rollouts, rewards, pad_id=0)))
    assert (exp.values is not None) == (config.algorithm.advantage == "gae")  # PPO's critic beside the teacher
    without = torch.zeros_like(exp.loss_mask)
    if config.algorithm.advantage != "distill":
        plain = advantage_stage(config.algorithm, teacher=False)(_copy(exp), rollouts)
        without = plain.advantages
    exp = advantage_stage(config.algorithm, teacher=True)(exp, rollouts)
    teachers_part = exp.advantages - without
    observation = (exp.loss_mask == 0) & (exp.attention_mask[:, 1:] == 1)
    assert observation.sum() == 4 * (3 + 2)  # the prompt's predicted tokens and the observation's
    assert (teachers_part[observation] == 0).all()
    assert (teachers_part[exp.loss_mask.bool()] != 0).any()
    policy = exp.loss_mask.bool()
    expected = float((exp.old_logprobs - exp.teacher_logprobs)[policy].mean())
    assert distill_metrics(exp.old_logprobs, exp.teacher_logprobs, exp.loss_mask)["distill/reverse_kl"] == expected


def _copy(exp):
    import copy

    return copy.deepcopy(exp)


# ---------------------------------------------------------------------------- a teacher that dies mid-run


class TeacherDiesOnce:
    """A learner handle whose teacher pass fails the first time the way the Ray handle reports a learner actor that
    died (the local teacher lives and dies in the learner's process); every other call goes to the learner inside."""

    def __init__(self, inner: LearnerRole):
        self.inner, self.failed = inner, False

    def score_teacher(self, exp, teacher_rows=None):
        if not self.failed:
            self.failed = True
            raise RoleFailure("learner (actor 0123abcd) died during score_teacher: killed", "learner", died=True)
        return self.inner.score_teacher(exp, teacher_rows)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("heal", [True, False])
def test_a_teacher_that_dies_mid_run_is_healed_with_the_learner_or_stops_the_run_naming_it(
    tmp_path, random_model_dir, other_teacher_dir, toy_task, heal
):
    from relayrl.placement.learner_restarts import LearnerRestarts
    from tests.unit.test_learner_restarts import STEPS, run, trainer_for

    teacher = (f"teacher.path={other_teacher_dir}", "algorithm.advantage=distill")
    trainer, _ = trainer_for(tmp_path, random_model_dir, toy_task, "run", *teacher, "checkpoint.every=2")
    handle = TeacherDiesOnce(trainer.learner)  # pyright: ignore[reportArgumentType]
    trainer.learner, respawns = handle, []  # pyright: ignore[reportAttributeAccessIssue]

    def respawn():  # a new learner, and with it a new teacher, as relayrl/placement/build.py starts one
        handle.inner = LearnerRole(handle.inner.settings)
        respawns.append(1)

    placement = trainer.learner_restarts.placement or load_config(None, []).placement
    trainer.learner_restarts = LearnerRestarts(
        placement.model_copy(update={"on_learner_failure": "restart" if heal else "stop"}), respawn
    )
    if heal:
        rows = run(trainer)
        assert [row["step"] for row in rows] == list(range(STEPS)) and respawns == [1]
        assert all("distill/reverse_kl" in row for row in rows)
        _assert_samples_carry_teacher_gaps(trainer.run_dir, rows)
        return
    with pytest.raises(RoleFailure, match=r"died during score_teacher: killed \(placement.on_learner_failure=stop\)"):
        run(trainer)
    assert respawns == []


def _assert_samples_carry_teacher_gaps(run_dir, metrics: list[dict]) -> None:
    """samples.jsonl's policy tokens carry the student-minus-teacher gap (the report's trajectory view colours by
    it): null exactly where the engine gap is (untrained), and over a step whose every sample is logged, their mean
    is the step's distill/reverse_kl."""
    import json

    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    for step in {row["step"] for row in samples}:
        policy = [seg for row in samples if row["step"] == step for seg in row["segments"] if seg["by"] == "policy"]
        assert all([g is None for g in seg["teacher_gap"]] == [g is None for g in seg["gap"]] for seg in policy)
        gaps = [g for seg in policy for g in seg["teacher_gap"] if g is not None]
        assert len([row for row in samples if row["step"] == step]) == 8  # the whole batch: 4 prompts x 2
        assert sum(gaps) / len(gaps) == pytest.approx(metrics[step]["distill/reverse_kl"], rel=1e-2, abs=1e-3)
        assert any(abs(g) > 1e-2 for g in gaps)  # a teacher that disagrees: not a gap of the student with itself


def test_under_lora_a_teacher_at_model_path_is_the_base_with_the_adapter_off(random_model_dir):
    lora = ("model.lora.rank=4", "model.lora.alpha=8", "train.lr=1e-2", "algorithm.kl.coef=0.1")
    role = LearnerRole(learner_settings(_config(random_model_dir, f"teacher.path={random_model_dir}", *lora)))
    assert role.teacher is not None and role.teacher.teachers[0].model is role.policy.network  # no second copy
    role.update(0, role.prepare(_experience()))  # GRPO advantages: the adapter moves: the student leaves its base
    exp = role.score_teacher(role.prepare(_experience()))
    trained = exp.loss_mask.bool()
    teacher, base, student = (t[trained] for t in (exp.teacher_logprobs, exp.ref_logprobs, exp.old_logprobs))
    assert torch.allclose(teacher, base, atol=1e-6)
    assert not torch.allclose(teacher, student, atol=1e-3)
