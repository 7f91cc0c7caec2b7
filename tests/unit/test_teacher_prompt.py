"""`teacher.prompt` (context distillation): a bad template refused at config load and a placeholder no column answers
at data load, each naming teacher.prompt; the teacher's rows carry the student's response ids unchanged; and the
teacher's log-probs, aligned back, are exactly those of a direct forward over the teacher's prompt + the response."""

import pytest
import torch

from relayrl.algorithms.teacher_prompt import TeacherPrompt, align_to_student
from relayrl.config import load_config
from relayrl.errors import ConfigError, DataError
from relayrl.learner.batching import make_experience
from relayrl.learner.role import LearnerRole
from relayrl.learner.teacher import teacher_experience
from relayrl.models.loading import load_tokenizer
from relayrl.placement.sections import learner_settings
from relayrl.types import Prompt, Rollout, Score, filled


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, random_model_dir):
    """A random tiny model with the student's tokenizer (another seed than the student's)."""
    from relayrl.models.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("teacher")
    tokenizer = load_tokenizer(random_model_dir)
    build_tiny_model(vocab_size=len(tokenizer), hidden=64, layers=2, heads=2, intermediate=128, seed=7).save_pretrained(
        out
    )
    tokenizer.save_pretrained(out)
    return out


def _config(student, *overrides):
    return load_config(None, [f"model.path={student}", "rollout.n=2", "rollout.prompts_per_step=3", *overrides])


def _rollouts(tokenizer, observation=False):
    """Two samples per toy prompt (varied lengths; with `observation`, a masked span inside each response)."""
    gen = torch.Generator().manual_seed(0)
    rollouts = []
    for g, (a, b) in enumerate([(1, 2), (3, 4), (5, 6)]):
        text = f"{a}+{b}="
        prompt = Prompt(f"p{g}", text, tokenizer(text)["input_ids"], {"answer": str(a + b)})
        for i in range(2):
            n = 3 + (g + i) % 3
            response = torch.randint(4, 16, (n,), generator=gen).tolist()
            mask = [1, 0] + [1] * (n - 2) if observation else None
            rollouts.append(Rollout(prompt, i, response, "", [-1.0] * n, "stop", [0] * n, loss_mask=mask))
    return rollouts


def _scored(role, exp, teacher_rows=None):
    return filled(role.score_teacher(exp, teacher_rows).teacher_logprobs, "teacher_logprobs")


def _direct_logprobs(model, prompt_ids, response_ids):
    """log p(response_k | prompt, response_<k) by one plain forward at temperature 1 (the default)."""
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
    targets = ids[0, 1:]
    return logp.gather(1, targets[:, None])[:, 0][len(prompt_ids) - 1 :]


# ---------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("think first {prompt", "teacher.prompt='think first {prompt' is not a valid template"),
        ("{0} then {prompt}", r"placeholder \{0\} is not a name"),
        ("{row.answer} {prompt}", r"placeholder \{row.answer\} is not a name"),
    ],
)
def test_a_template_that_does_not_parse_is_refused_at_config_load(random_model_dir, template, message):
    with pytest.raises(ConfigError, match=message):
        _config(random_model_dir, f"teacher.path={random_model_dir}", f"teacher.prompt={template!r}")


def test_a_placeholder_no_column_answers_is_refused_naming_it_and_the_row(random_model_dir):
    tokenizer = load_tokenizer(random_model_dir)
    prompts = [r.prompt for r in _rollouts(tokenizer)[::2]]
    TeacherPrompt("{answer} {prompt}", tokenizer).check_prompts(prompts)  # every row has `answer`
    with pytest.raises(DataError) as err:
        TeacherPrompt("{hint} {prompt}", tokenizer).check_prompts(prompts)
    assert str(err.value) == (
        "teacher.prompt: placeholder {hint} is neither {prompt} nor a column of data.train row p0 (its columns: answer)"
    )


def test_a_prompt_with_images_is_refused_naming_the_sample(random_model_dir):
    tokenizer = load_tokenizer(random_model_dir)
    rollout = _rollouts(tokenizer)[0]
    rollout.prompt.images = ["an image"]
    with pytest.raises(DataError, match="teacher.prompt: sample p0#0 has images"):
        TeacherPrompt("{prompt}", tokenizer).rollouts([rollout])


def test_a_response_that_differs_between_the_rows_is_named(random_model_dir):
    tokenizer = load_tokenizer(random_model_dir)
    rollouts = _rollouts(tokenizer)
    student = make_experience(rollouts, [Score(0.0)] * len(rollouts), pad_id=0)
    teacher = teacher_experience(TeacherPrompt("{answer}{prompt}", tokenizer), rollouts, pad_id=0)
    teacher.input_ids[3, int(filled(teacher.prompt_lengths, "prompt_lengths")[3]) + 1] += 1
    with pytest.raises(RuntimeError, match="row 3: the teacher's response tokens are not the student's"):
        align_to_student(torch.zeros_like(teacher.loss_mask), teacher, student)


# ---------------------------------------------------------------------------- alignment


def test_the_teachers_rows_are_its_prompt_then_the_students_response_ids(random_model_dir):
    tokenizer = load_tokenizer(random_model_dir)
    rollouts = _rollouts(tokenizer, observation=True)
    teacher = teacher_experience(TeacherPrompt("1+1=2 {prompt}", tokenizer), rollouts, pad_id=0)
    for row, rollout in enumerate(rollouts):
        ids = teacher.input_ids[row][teacher.attention_mask[row].bool()].tolist()
        expected_prompt = tokenizer(f"1+1=2 {rollout.prompt.text}")["input_ids"]
        assert ids == expected_prompt + rollout.response_ids
        start = len(expected_prompt) - 1  # the teacher's loss mask is the student's, shifted by the longer prompt
        assert teacher.loss_mask[row, start : start + len(rollout.response_ids)].tolist() == rollout.loss_mask


def test_the_identity_template_scores_exactly_as_without_one(random_model_dir, teacher_dir):
    tokenizer = load_tokenizer(random_model_dir)
    rollouts = _rollouts(tokenizer)
    role = LearnerRole(learner_settings(_config(random_model_dir, f"teacher.path={teacher_dir}")))
    student = make_experience(rollouts, [Score(0.0)] * len(rollouts), pad_id=0)
    plain = _scored(role, student)
    teacher = teacher_experience(TeacherPrompt("{prompt}", tokenizer), rollouts, pad_id=0)
    aligned = _scored(role, make_experience(rollouts, [Score(0.0)] * len(rollouts), 0), teacher)
    mask = student.loss_mask.bool()
    assert torch.equal(aligned[mask], plain[mask])
    assert (aligned[~mask] == 0).all()


def test_the_aligned_logprobs_are_the_teachers_after_its_own_prompt(random_model_dir, teacher_dir):
    tokenizer = load_tokenizer(random_model_dir)
    rollouts = _rollouts(tokenizer, observation=True)
    role = LearnerRole(learner_settings(_config(random_model_dir, f"teacher.path={teacher_dir}")))
    template = TeacherPrompt("2+2=4 {prompt}{answer}", tokenizer)  # a context the student does not see
    student = make_experience(rollouts, [Score(0.0)] * len(rollouts), pad_id=0)
    aligned = _scored(role, student, teacher_experience(template, rollouts, pad_id=0))
    assert role.teacher is not None
    model = role.teacher.teachers[0].model
    plain = _scored(role, make_experience(rollouts, [Score(0.0)] * len(rollouts), pad_id=0))
    for row, rollout in enumerate(rollouts):
        teacher_prompt = template.token_ids(rollout.prompt, "")
        expected = _direct_logprobs(model, teacher_prompt, rollout.response_ids)
        start, n = len(rollout.prompt.token_ids) - 1, len(rollout.response_ids)
        assert torch.allclose(aligned[row, start : start + n], expected, atol=1e-5), row
    policy = student.loss_mask.bool()
    assert not torch.allclose(aligned[policy], plain[policy], atol=1e-3)  # the teacher's context changed its scores


# ---------------------------------------------------------------------------- in a run


def test_a_run_scores_with_the_teachers_prompt(tmp_path, random_model_dir, toy_task):
    """The student as its own teacher: without a template the step's reverse KL is exactly 0; with one it is not."""
    from tests.unit.test_learner_restarts import run, trainer_for

    def first_kl(name, *template):
        teacher = (f"teacher.path={random_model_dir}", "algorithm.advantage=distill", "train.steps=1", *template)
        return run(trainer_for(tmp_path, random_model_dir, toy_task, name, *teacher)[0])[0]["distill/reverse_kl"]

    assert first_kl("plain") == 0.0
    assert first_kl("context", "teacher.prompt='1+1=2 {prompt}'") != 0.0


def test_a_placeholder_no_column_answers_stops_the_run_before_its_directory(tmp_path, random_model_dir, toy_task):
    from tests.unit.test_learner_restarts import trainer_for

    teacher = (f"teacher.path={random_model_dir}", "teacher.prompt='{hint} {prompt}'")
    with pytest.raises(DataError, match=r"teacher.prompt: placeholder \{hint\} is neither \{prompt\} nor a column"):
        trainer_for(tmp_path, random_model_dir, toy_task, "run", *teacher)
    assert not (tmp_path / "run").exists()
