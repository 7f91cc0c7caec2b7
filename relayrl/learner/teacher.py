"""The teacher of on-policy distillation: a frozen model that scores every token the student sampled.

Owns the teacher's checks at start (`check_teacher_dir`: the directory loads, its tokenizer has the student's
vocabulary), the `teacher.engine: auto` choice (`choose_teacher_engine`), and the teacher's pass (`TeacherPass`): a
batched no-grad forward exactly like the reference pass (the policy's micro-batches, autocast and sampling
temperature, the teacher's own forward layout), filling `Experience.teacher_logprobs`. The `local` engine runs it in
the learner's process (`Teachers.local`, over the policy's own pass); the `actor` engine in a process of its own
(`Teachers.alone`, relayrl/learner/teacher_role.py), with the same pass built from the same settings. What the signal
does with the log-probs is relayrl/algorithms/distill.py.

Several teachers (`teacher.teachers`): `Teachers` holds one `Teacher` per route and scores each row with the one
`Experience.teacher_routes` names (relayrl/algorithms/teacher_routes.py picks them from a dataset column).

With `model.lora`, a local teacher whose path is `model.path` is the student's base with its adapter off
(self-distillation, no second copy). With `teacher.prompt` the teacher scores rows with its own prompt
(`teacher_experience` builds them with relayrl/algorithms/teacher_prompt.py; `Teachers.score` aligns the log-probs
back).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from relayrl.errors import ModelError
from relayrl.learner.batching import MicroBatcher
from relayrl.learner.layout import ForwardLayout, Sampled
from relayrl.models.loading import check_model_dir, load_causal_lm, load_tokenizer, set_attention

if TYPE_CHECKING:
    from relayrl.algorithms.teacher_prompt import TeacherPrompt
    from relayrl.config import RoutedTeacher, TeacherConfig
    from relayrl.learner.policy import PolicyLearner
    from relayrl.learner.settings import TeacherSettings
    from relayrl.types import Experience, Rollout

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
LOCAL_WHY = (
    "a batched forward in the learner's process: no GPU of its own to gain here, and on CPU the fastest "
    "(benchmarks/teacher_engines.py: an actor 1.3x, vLLM's prompt log-probs 1.2-1.5x)"
)
ACTOR_WHY = "a Ray actor with a GPU of its own: the teacher's weights and forward leave the learner's GPU"
RANKS_WHY = "a Ray actor of its own: placement.learner_ranks > 1 shards the learner, and the teacher is not sharded"


def choose_teacher_engine(
    engine: str, mode: str = "local", gpu: bool | None = None, learner_ranks: int = 1
) -> tuple[str, str]:
    """`teacher.engine` as the run uses it, and why. `auto`: `actor` under placement.mode=ray with a GPU (`gpu`;
    default: whether this machine has one) or with sharded learner ranks, else `local`; never `vllm`, which
    measured slower than the forward where it was measured (CPU, docs/distillation.md)."""
    if engine != "auto":
        return engine, "as set"
    if mode == "ray" and learner_ranks > 1:
        return "actor", RANKS_WHY
    if gpu is None:
        gpu = torch.cuda.is_available()
    return ("actor", ACTOR_WHY) if mode == "ray" and gpu else ("local", LOCAL_WHY)


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


@dataclasses.dataclass
class TeacherPass:
    """How a teacher's no-grad forward runs, as the student's log-prob pass does (`PolicyLearner.logprobs`): the
    same micro-batches, autocast, packing, logits chunks and sampling temperature (untruncated: a token the student
    sampled outside the teacher's top-k/top-p keeps a finite log-prob, a large penalty, not -inf), on `device`."""

    micro: MicroBatcher
    autocast: Any
    packing: str
    logits_chunk: int
    sampled: Sampled
    device: str

    @classmethod
    def of_policy(cls, policy: PolicyLearner) -> TeacherPass:
        """The `local` engine: the policy's own micro-batches and autocast, in the learner's process."""
        layout = policy.layout
        return cls(policy.micro, policy.autocast, layout.packing, layout.logits_chunk, layout.sampled, policy.device)

    @classmethod
    def alone(cls, settings: TeacherSettings, attention: str | None) -> TeacherPass:
        """A teacher in a process of its own (`teacher.engine: actor`): the pass the policy's settings make,
        `attention`: the teacher model's attention kernel (whether whole groups may be packed)."""
        from relayrl.data.vision import vision_token_ids
        from relayrl.learner.batching import packs_groups

        train, rollout, device = settings.train, settings.rollout, teacher_device()
        bf16 = device == "cuda" and settings.model.dtype in ("auto", "bfloat16")  # as the policy's forward
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        sampled = Sampled(rollout.temperature, rollout.top_k, rollout.top_p, vision_token_ids(settings.model.path))
        packable = packs_groups(_Packing(train.packing, attention))
        micro = MicroBatcher(train.micro_batch, train.micro_batch_tokens, packable)
        return cls(micro, autocast, train.packing, train.logits_chunk, sampled, device)

    def layout(self, model_config) -> ForwardLayout:
        """The forward layout of a teacher model: the pass's packing and chunks over the teacher's config."""
        sampled = dataclasses.replace(self.sampled, top_k=-1, top_p=1.0)
        return ForwardLayout(self.packing, self.logits_chunk, sampled, model_config, self.device)

    @torch.no_grad()
    def logprobs(self, exp: Experience, model, layout: ForwardLayout) -> torch.Tensor:
        """Log-probs of the response tokens [B, T-1] under `model`, micro-batched (0 off the response)."""
        out = torch.zeros_like(exp.loss_mask)
        for index in self.micro.split(torch.arange(len(exp)), exp, count=False):
            with self.autocast:
                logp, _ = layout.token_stats(model, exp.select(index))
            out[index, : logp.shape[1]] = logp.float().cpu()
        return out


@dataclasses.dataclass(frozen=True)
class _Packing:
    """What `packs_groups` reads of a layout, before the teacher's layout exists."""

    packing: str
    attention: str | None


def teacher_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_teacher_model(settings: RoutedTeacher, attention: str, device: str, key: str):
    """A teacher's frozen weights (`teacher.dtype`: auto = bf16 on GPU, fp32 on CPU), `model.attention`'s kernel."""
    dtype = torch.bfloat16 if device == "cuda" and settings.dtype in ("auto", "bfloat16") else torch.float32
    model = load_causal_lm(settings.path, device, key=key, dtype=dtype)
    model.eval().requires_grad_(False)
    model.config.use_cache = False
    set_attention(model, attention, device)
    return model


class Teacher:
    """One teacher model, frozen, and the pass that scores with it (`adapter_off`: the student's base under LoRA)."""

    def __init__(self, model, forward: TeacherPass, adapter_off: Callable[[], Any] = contextlib.nullcontext):
        self.model, self.forward, self.adapter_off = model, forward, adapter_off
        self.layout = forward.layout(model.config)

    @classmethod
    def local(cls, settings: RoutedTeacher, policy: PolicyLearner, key: str = "teacher.path") -> Teacher:
        """The `local` engine: in the learner's process, scored with the policy's pass. Self-distillation under
        LoRA: a teacher at model.path is the student's base with its adapter off (no second copy)."""
        forward = TeacherPass.of_policy(policy)
        model = policy.settings.model
        if model.lora is not None and Path(settings.path).resolve() == Path(model.path).resolve():
            return cls(policy.network, forward, policy.model.disable_adapter)
        return cls(load_teacher_model(settings, model.attention, policy.device, key), forward)

    @property
    def base(self) -> bool:
        """Whether this teacher is the student's base with its adapter off."""
        return self.adapter_off is not contextlib.nullcontext

    def logprobs(self, exp: Experience) -> torch.Tensor:
        """The teacher's log-probs of the response tokens [B, T-1]."""
        with self.adapter_off():
            return self.forward.logprobs(exp, self.model, self.layout)


class Teachers:
    """Every teacher of the run (one, or one per route of `teacher.teachers`), each scoring its own rows."""

    def __init__(self, teachers: list[Teacher]):
        self.teachers = teachers

    @classmethod
    def local(cls, settings: TeacherConfig, policy: PolicyLearner) -> Teachers:
        """The `local` engine: every teacher in the learner's process."""
        models, keys = settings.models(), teacher_keys(settings)
        return cls([Teacher.local(entry, policy, key) for entry, key in zip(models, keys)])

    @classmethod
    def alone(cls, settings: TeacherSettings) -> Teachers:
        """Every teacher in a process of its own (the `actor` engine): a LoRA self-teacher is a copy of the base
        there (the student's base weights never change under LoRA, so its log-probs are the adapter-off ones)."""
        device, attention = teacher_device(), settings.model.attention
        models = [
            load_teacher_model(entry, attention, device, key)
            for entry, key in zip(settings.teacher.models(), teacher_keys(settings.teacher))
        ]
        forward = TeacherPass.alone(settings, models[0].config._attn_implementation)
        return cls([Teacher(model, forward) for model in models])

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

    def score(self, exp: Experience, teacher_rows: Experience | None = None) -> Experience:
        """`exp` with `teacher_logprobs` filled. `teacher_rows`: with `teacher.prompt`, the same responses after the
        teacher's prompt (relayrl/algorithms/teacher_prompt.py); the teachers score those, aligned back to `exp`."""
        from relayrl.algorithms.teacher_prompt import align_to_student

        if teacher_rows is None:
            exp.teacher_logprobs = self.logprobs(exp)
            return exp
        teacher_rows.teacher_routes = exp.teacher_routes
        exp.teacher_logprobs = align_to_student(self.logprobs(teacher_rows), teacher_rows, exp)
        return exp


def teacher_experience(teacher_prompt: TeacherPrompt, rollouts: list[Rollout], pad_id: int) -> Experience:
    """The rows the teacher scores: its prompt, then the student's response ids (the student's loss mask)."""
    from relayrl.learner.batching import make_experience
    from relayrl.types import Score

    return make_experience(teacher_prompt.rollouts(rollouts), [Score(0.0)] * len(rollouts), pad_id)
