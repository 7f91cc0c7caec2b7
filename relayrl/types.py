"""The data that flows through the loop, typed in one place: Prompt -> Rollout -> Score -> Experience, and the
engine requests between them: `Sampling` (how to sample) and `PartialSample` (a response generated in pieces); and
`ImageBatch`, the image tensors of a batch's rows (relayrl/data/vision.py makes them)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from relayrl.errors import DataError


@dataclass
class Prompt:
    """One dataset row, rendered and tokenized. `columns` are the row's other fields (for rewards)."""

    id: str
    text: str
    token_ids: list[int]
    columns: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] | None = None  # the row's `messages`, if it gave them (TRL-style rewards get them)
    # a prompt with images (relayrl/data/vision.py): the decoded images, the processor's image tensors for the
    # learner, and the ids with one placeholder per image that vLLM expands itself (token_ids are expanded)
    images: list[Any] | None = None
    image_inputs: dict[str, torch.Tensor] | None = None
    engine_token_ids: list[int] | None = None


@dataclass
class Rollout:
    """One sampled response. `behaviour_logprobs` come from the sampling pass (after temperature/top-p)."""

    prompt: Prompt
    group_index: int
    response_ids: list[int]
    response_text: str
    behaviour_logprobs: list[float]
    finish_reason: str
    versions: list[int]  # policy version that produced each response token
    loss_mask: list[int] | None = None  # per response token, 1 = trained (multi-turn: observation tokens are 0)
    # multi-turn: (index in response_ids of a turn's last generated token, the turn's reward), per turn; the
    # token-level estimators put each there (relayrl/algorithms/advantages.py `turn_reward_tensor`)
    turn_rewards: list[tuple[int, float]] | None = None
    # env.tito=fork: a forked sample, the tokens its trajectory sampled before a call that rewrote its history;
    # the group_index of that trajectory's last sample, whose reward and advantage it takes (not a group member)
    fork_of: int | None = None

    @property
    def sample_id(self) -> str:
        return f"{self.prompt.id}#{self.group_index}"


@dataclass
class Score:
    """A reward and its named parts (correctness, format, ...); `error` says why a failed sample was scored 0
    (reward.on_error=zero): `sample <id> raised ValueError: ...`."""

    reward: float
    components: dict[str, float] = field(default_factory=dict)
    error: str | None = None


@dataclass
class Experience:
    """Right-padded tensors for a rollout batch. Per-token tensors are aligned to *targets*:
    column j holds the quantity for token `input_ids[:, j + 1]` (shape [B, T-1])."""

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T-1], 1.0 on response tokens
    behaviour_logprobs: torch.Tensor  # [B, T-1]
    rewards: torch.Tensor  # [B]
    group_ids: torch.Tensor  # [B], rollouts of one prompt share an id
    versions: torch.Tensor  # [B, T-1], policy version per response token (0 elsewhere)
    advantages: torch.Tensor | None = None  # [B, T-1]
    old_logprobs: torch.Tensor | None = None  # [B, T-1]
    ref_logprobs: torch.Tensor | None = None  # [B, T-1]
    values: torch.Tensor | None = None  # [B, T-1] critic values before the update (gae only)
    returns: torch.Tensor | None = None  # [B, T-1] the critic's regression targets (gae only)
    prompt_lengths: torch.Tensor | None = None  # [B] prompt tokens of each row (group packing needs them)
    reward_penalty: torch.Tensor | None = None  # [B, T-1] per-token reward terms: the KL penalty (kl.placement=reward)
    images: ImageBatch | None = None  # each row's image tensors (rows with images)
    forks: torch.Tensor | None = None  # [B] bool: forked samples (Rollout.fork_of), not members of their group
    teacher_logprobs: torch.Tensor | None = None  # [B, T-1] the teacher's (on-policy distillation, learner/teacher.py)
    teacher_routes: torch.Tensor | None = None  # [B] long: which teacher scores each row (teacher.teachers)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index: torch.Tensor) -> Experience:
        """The rows in `index`, trimmed to the longest remaining sequence."""
        length = int(self.attention_mask[index].sum(dim=1).max())
        picked = {}
        for name, value in vars(self).items():
            if value is None:
                picked[name] = None
            elif isinstance(value, ImageBatch):
                picked[name] = value.select(index)
            elif value.dim() == 1:
                picked[name] = value[index]
            elif name in ("input_ids", "attention_mask"):
                picked[name] = value[index, :length]
            else:
                picked[name] = value[index, : length - 1]
        return Experience(**picked)


def filled(tensor: torch.Tensor | None, field_name: str) -> torch.Tensor:
    """An `Experience` tensor a stage fills (values, returns, advantages, old/reference log-probs ...), where a later
    stage needs it: a missing one is a bug in the order of the stages, named here."""
    if tensor is None:
        raise RuntimeError(f"Experience.{field_name} is needed here but no earlier stage filled it")
    return tensor


@dataclass(frozen=True)
class Sampling:
    """How to sample. temperature == 0 means greedy decoding."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 64
    min_tokens: int = 0  # EOS and stop strings are ignored before this many tokens
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int | None = None
    request_offset: int = 0  # index of the first prompt within the step's batch (a replica's share of it)
    # one request seed per prompt, when the caller keys them itself (multi-turn turns: by trajectory and turn);
    # None: spaced from `seed` by the prompt's index in the batch (relayrl/rollout/seeds.py `prompt_seeds`)
    seeds: tuple[int | None, ...] | None = None

    @classmethod
    def greedy(cls, max_tokens: int, stop: Iterable[str] = (), min_tokens: int = 0) -> Sampling:
        return cls(n=1, temperature=0.0, max_tokens=max_tokens, min_tokens=min_tokens, stop=tuple(stop))


@dataclass
class PartialSample:
    """One response being generated in pieces (partial rollouts): the tokens so far, the log-prob and the
    policy version of each, and how it ended (None while unfinished)."""

    prompt: Prompt
    group: int  # which group (prompt draw) it belongs to
    group_index: int
    seed: int | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def to_rollout(self) -> Rollout:
        return Rollout(
            prompt=self.prompt,
            group_index=self.group_index,
            response_ids=list(self.token_ids),
            response_text=self.text,
            behaviour_logprobs=list(self.logprobs),
            finish_reason=self.finish_reason or "length",
            versions=list(self.versions),
        )


class ImageBatch:
    """The image tensors of a batch's rows, one dict per row (None for a row without images). `batch()` joins
    them for one forward: along dim 0, the dims after it padded with zeros where rows differ (Idefics3's
    pixel values are [1, images, 3, H, W] per row, so rows of 1 and 2 images pad the second to 2; Qwen2-VL's
    flat patches [patches, D] and grids [images, 3] just concatenate). The rows' order is the batch's."""

    def __init__(self, rows: list[dict[str, torch.Tensor] | None]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def select(self, index: torch.Tensor) -> ImageBatch:
        return ImageBatch([self.rows[int(i)] for i in index])

    def repeat(self, n: int) -> ImageBatch:
        """Each row `n` times in a row (a prompt's `n` samples)."""
        return ImageBatch([row for row in self.rows for _ in range(n)])

    def batch(self, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        present = [row for row in self.rows if row]
        if not present:
            return {}
        if len(present) != len(self.rows):
            raise DataError("a batch mixes rows with and without images; the model's forward takes one kind at a time")
        return {name: _join([row[name] for row in present]).to(device) for name in present[0]}


def _join(tensors: list[torch.Tensor]) -> torch.Tensor:
    if all(t.shape[1:] == tensors[0].shape[1:] for t in tensors):
        return torch.cat(tensors)
    shape = [max(t.shape[d] for t in tensors) for d in range(1, tensors[0].dim())]
    padded = []
    for t in tensors:
        pad = []
        for d in reversed(range(1, t.dim())):
            pad += [0, shape[d - 1] - t.shape[d]]
        padded.append(torch.nn.functional.pad(t, pad))
    return torch.cat(padded)
