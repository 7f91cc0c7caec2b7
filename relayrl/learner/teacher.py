"""The teacher of on-policy distillation: a frozen model that scores every token the student sampled.

Owns the teacher's checks at start (`check_teacher_dir`: the directory loads, its tokenizer has the student's
vocabulary), the `teacher.engine: auto` choice (`choose_teacher_engine`), and the `local` engine (`Teacher`): a
batched no-grad forward in the learner's process, exactly like the reference pass (the policy's micro-batches,
autocast and sampling temperature, the teacher's own forward layout), filling `Experience.teacher_logprobs`.
What the signal does with them is relayrl/algorithms/distill.py.

Several teachers (`teacher.teachers`): `Teachers` holds one `Teacher` per route and scores each row with the one
`Experience.teacher_routes` names (relayrl/algorithms/teacher_routes.py picks them from a dataset column).

With `model.lora`, a teacher whose path is `model.path` is the student's base with its adapter off (self-distillation,
no second copy). With `teacher.prompt` the teacher scores rows with its own prompt (`teacher_experience` builds them with
relayrl/algorithms/teacher_prompt.py, which aligns the log-probs back; `LearnerRole.score_teacher`).

Left out so far (docs/distillation.md): a teacher in a Ray actor of its own or behind vLLM's `prompt_logprobs`, and
restarting a teacher that died (it dies with the learner's process and is healed with it).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from relayrl.errors import ModelError
from relayrl.learner.layout import ForwardLayout
from relayrl.models.loading import check_model_dir, load_causal_lm, load_tokenizer, set_attention

if TYPE_CHECKING:
    from relayrl.algorithms.teacher_prompt import TeacherPrompt
    from relayrl.config import RoutedTeacher, TeacherConfig
    from relayrl.learner.policy import PolicyLearner
    from relayrl.types import Experience, Rollout

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
LOCAL_WHY = "the only teacher engine so far: a batched forward pass in the learner's process, like the reference's"


def choose_teacher_engine(engine: str) -> tuple[str, str]:
    """`teacher.engine` as the run uses it, and why (`auto` resolves to local, the only engine so far)."""
    return "local", LOCAL_WHY if engine == "auto" else "as set"


def check_teacher_dir(teacher_path: str, student_path: str, key: str = "teacher.path") -> None:
    """Refuse, at start and naming the keys, a teacher directory that does not load (no config.json, a config
    transformers cannot read, no weights, no tokenizer) or whose tokenizer's vocabulary differs from the student's:
    a sampled token id would mean another string to the teacher, and its log-probs another thing."""
    from transformers import AutoConfig

    path = check_model_dir(teacher_path, key)
    try:
        AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise ModelError(f"{key}={teacher_path!r}: cannot read its config.json: {err}") from None
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise ModelError(f"{key}={teacher_path!r} holds no weights (none of {', '.join(WEIGHT_FILES)})")
    teacher_vocab = load_tokenizer(path, key).get_vocab()
    student_vocab = load_tokenizer(student_path).get_vocab()
    if teacher_vocab != student_vocab:
        raise ModelError(
            f"{key}={teacher_path!r} has a tokenizer whose vocabulary differs from the student's "
            f"(model.path={student_path!r}): {_vocab_difference(teacher_vocab, student_vocab)}. The teacher must "
            "score the student's token ids: use a teacher with the student's tokenizer"
        )


def _vocab_difference(teacher: dict[str, int], student: dict[str, int]) -> str:
    """One line: the sizes, and the first tokens whose ids differ or that only one side has."""
    differing = sorted(token for token in teacher.keys() | student.keys() if teacher.get(token) != student.get(token))
    shown = ", ".join(f"{t!r}: {teacher.get(t)} vs {student.get(t)}" for t in differing[:3])
    return f"{len(teacher)} vs {len(student)} tokens, {len(differing)} differ (teacher id vs student id: {shown})"


def teacher_keys(settings: TeacherConfig) -> list[str]:
    """The config key of each teacher's path, as messages name it: teacher.path, or teacher.teachers[i].path."""
    if not settings.teachers:
        return ["teacher.path"] * bool(settings.path)
    return [f"teacher.teachers[{i}].path" for i in range(len(settings.teachers))]


class Teacher:
    """The `local` engine: the teacher's weights in the learner's process, frozen, scored like the reference."""

    def __init__(self, settings: RoutedTeacher, policy: PolicyLearner, key: str = "teacher.path"):
        self.policy = policy
        device = policy.device
        # self-distillation under LoRA: a teacher at model.path is the student's base with its adapter off (no copy)
        self.base = (
            policy.settings.model.lora is not None
            and Path(settings.path).resolve() == Path(policy.settings.model.path).resolve()
        )
        if self.base:
            self.model = policy.network
        else:
            dtype = torch.bfloat16 if device == "cuda" and settings.dtype in ("auto", "bfloat16") else torch.float32
            self.model = load_causal_lm(settings.path, device, key=key, dtype=dtype)
            self.model.eval().requires_grad_(False)
            self.model.config.use_cache = False
            set_attention(self.model, policy.settings.model.attention, device)
        layout = policy.layout  # the policy's packing and logits chunks, the teacher's model config
        # at the sampling temperature, untruncated: a token the student sampled outside the teacher's top-k/top-p
        # keeps a finite log-prob (a large penalty), not -inf
        sampled = dataclasses.replace(layout.sampled, top_k=-1, top_p=1.0)
        self.layout = ForwardLayout(layout.packing, layout.logits_chunk, sampled, self.model.config, device)

    def logprobs(self, exp: Experience) -> torch.Tensor:
        """The teacher's log-probs of the response tokens [B, T-1]: the policy's no-grad pass (its micro-batches
        and autocast) over the teacher's model and layout."""
        if self.base:
            with self.policy.model.disable_adapter():
                return self.policy.logprobs(exp, self.model, self.layout)
        return self.policy.logprobs(exp, self.model, self.layout)


class Teachers:
    """Every teacher of the run (one, or one per route of `teacher.teachers`), each scoring its own rows."""

    def __init__(self, settings: TeacherConfig, policy: PolicyLearner):
        models = settings.models()
        keys = teacher_keys(settings)
        self.teachers = [Teacher(entry, policy, key) for entry, key in zip(models, keys)]

    def logprobs(self, exp: Experience) -> torch.Tensor:
        """The log-probs of the response tokens [B, T-1], each row's by the teacher `exp.teacher_routes` names
        (every row by the one teacher when there is one)."""
        if len(self.teachers) == 1:
            return self.teachers[0].logprobs(exp)
        if exp.teacher_routes is None:
            raise RuntimeError("several teachers need Experience.teacher_routes (the controller fills them)")
        out = torch.zeros_like(exp.loss_mask)
        for index, teacher in enumerate(self.teachers):
            rows = torch.nonzero(exp.teacher_routes == index).flatten()
            if len(rows):
                logp = teacher.logprobs(exp.select(rows))
                out[rows, : logp.shape[1]] = logp
        return out


def teacher_experience(teacher_prompt: TeacherPrompt, rollouts: list[Rollout], pad_id: int) -> Experience:
    """The rows the teacher scores: its prompt, then the student's response ids (the student's loss mask)."""
    from relayrl.learner.batching import make_experience
    from relayrl.types import Score

    return make_experience(teacher_prompt.rollouts(rollouts), [Score(0.0)] * len(rollouts), pad_id)
