"""A multi-turn trajectory's record: its segments (generated tokens and observation tokens), turns, rewards and
what became of it, and how its turns' rewards are placed and combined. The driver that fills it is
relayrl/sources/trajectories.py."""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from relayrl.data.source import shown_characters, unknown_characters
from relayrl.errors import DataWarning, EnvError

if TYPE_CHECKING:
    from relayrl.sources.turn_requests import TurnOutput
    from relayrl.types import Prompt, Rollout


@dataclass
class Segment:
    token_ids: list[int]
    trained: bool  # loss mask: generated tokens 1, observation tokens 0
    logprobs: list[float]
    versions: list[int]
    images: list[Any] = field(default_factory=list)  # an observation's images (relayrl/sources/trajectory_images.py)
    engine_ids: list[int] | None = None  # with images: its ids with one placeholder per image (vLLM's)


@dataclass
class Trajectory:
    prompt: Prompt  # the dataset row's prompt (id, columns)
    group_index: int
    key: int
    first: Prompt | None = None  # the first prompt as rendered from reset's observation
    history: list[dict[str, Any]] = field(default_factory=list)  # the chat so far, as text (for the template)
    segments: list[Segment] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    success: bool = False
    truncated: bool = False
    failed: str = ""  # "", "error", "timeout" or "no_call" (an agent that never called the model)
    last_turn_cut: bool = False  # its last model turn stopped at its token budget (reported as finish "length")
    forks: list[Rollout] = field(default_factory=list)  # env.tito=fork: its earlier samples, kept (`fork_of` later)
    earlier_turns: int = 0  # turns before its sample's first (env.tito fork/retokenize): not in its segments
    tools: list[dict[str, Any]] | None = None  # the tools an agent's calls offer (rendered by the chat template)
    tool_errors: int = 0
    base: int = 0  # tokens of its first sample's first prompt: env.max_total_tokens counts from there
    _tensors: tuple[int, dict[str, Any]] | None = None  # (image count, their tensors): `tensors`

    @property
    def response_length(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)

    @property
    def spent(self) -> int:
        """Tokens after the trajectory's first prompt (an agent's rebuilt call restarts the sample, not the budget)."""
        assert self.first is not None  # rendered from reset's answer, before the first turn
        return len(self.first.token_ids) + self.response_length - self.base

    def prompt_ids(self) -> list[int]:
        assert self.first is not None  # rendered from reset's answer, before the first turn
        return self.first.token_ids + [t for s in self.segments for t in s.token_ids]

    def images(self) -> list[Any]:
        """Every image the trajectory has shown so far, in order: its first prompt's, then its observations'."""
        assert self.first is not None  # rendered from reset's answer, before the first turn
        return list(self.first.images or []) + [image for s in self.segments for image in s.images]

    def tensors(self, tokenizer) -> dict[str, Any]:
        """The processor's tensors of `images()`, made once per image count (images are only ever added)."""
        from relayrl.sources.trajectory_images import image_tensors

        images = self.images()
        if self._tensors is None or self._tensors[0] != len(images):
            self._tensors = (len(images), image_tensors(tokenizer, images))
        return self._tensors[1]

    def where(self) -> str:
        """Names the trajectory and the turn whose environment step is at hand (or its reset)."""
        return f"sample {self.prompt.id}#{self.group_index} " + (f"turn {self.turns}" if self.turns else "reset")


@dataclass
class SampledTurn:
    """What a pool's `step` may use besides the action text (an agent's reply is built from the tokens)."""

    prompt_ids: list[int]
    output: TurnOutput


@dataclass
class MultiTurnBatch:
    rollouts: list[Rollout]
    rewards: list[float]  # per rollout, combined per env.reward
    metrics: dict[str, float]


def insert_forks(rollouts: list[Rollout], rewards: list[float], forks: list[tuple[Rollout, Rollout, float]]) -> None:
    """(last sample, fork, reward) each: the fork goes after its group's members (group_index n, n+1, ...) with its
    trajectory's reward, naming that trajectory's last sample (`fork_of`): not a member of the group's baseline."""
    for last, fork, reward in forks:
        end = next(i for i, r in enumerate(rollouts) if r is last) + 1
        while end < len(rollouts) and rollouts[end].group_index != 0:  # the group's end
            end += 1
        fork.group_index = rollouts[end - 1].group_index + 1
        fork.fork_of = last.group_index
        rollouts.insert(end, fork)
        rewards.insert(end, reward)


def trajectory_rows(rollouts: list[Rollout]) -> list[int]:
    """Each rollout's trajectory's row in a driver's batch (prompt-major, a group from group_index 0): its own, or
    for a forked sample (Rollout.fork_of) the row of its trajectory's last sample, whose score it takes."""
    rows, start = [], 0
    for row, rollout in enumerate(rollouts):
        start = row if rollout.group_index == 0 else start
        rows.append(row if rollout.fork_of is None else start + rollout.fork_of)
    return rows


def turn_ends(segments: list[Segment], rewards: list[float]) -> list[tuple[int, float]]:
    """(index of each model turn's last token, that turn's reward) over a trajectory's response tokens. A turn
    without tokens, or without a reward (cut by max_total_tokens before its step), has no pair."""
    pairs, end, turn = [], -1, 0
    for segment in segments:
        end += len(segment.token_ids)
        if segment.trained:
            if segment.token_ids and turn < len(rewards):
                pairs.append((end, rewards[turn]))
            turn += 1
    return pairs


def combine_rewards(rewards: list[float], how: str, gamma: float) -> float:
    if not rewards:
        return 0.0
    if how == "final":
        return rewards[-1]
    if how == "discounted":
        return sum(gamma**t * r for t, r in enumerate(rewards))
    return sum(rewards)


class UnknownCharacters:
    """Warns once (per source: a run) that an environment's text holds characters the tokenizer lacks, naming
    them; the drivers count such observations per batch (env/unknown_chars), as data/prompts_unknown_chars
    counts prompts (relayrl/data/source.py)."""

    def __init__(self):
        self.warned = False
        self._lock = threading.Lock()  # drivers on several threads (the async producers) share one

    def warn(self, tokenizer, text: str, where: str) -> None:
        with self._lock:
            if self.warned:
                return
            self.warned = True
        warnings.warn(
            f"{where}: the observation holds {shown_characters(unknown_characters(tokenizer, text))}, not in the "
            f"tokenizer's vocabulary: the model sees its unk token {tokenizer.unk_token!r} instead (later "
            "observations like it are counted in env/unknown_chars)",
            DataWarning,
            stacklevel=2,
        )


def judge_step(order: list[Trajectory], model_errors: dict[int, tuple[str, str]], spec: str) -> None:
    """A step whose every trajectory made no model call, or ended in one error over the model's output (two
    or more), has an agent or setup that cannot work: the run stops, naming the likely cause (`model_errors`: trajectory key ->
    the model-output exception it ended in, as (kind, message))."""
    if order and all(t.failed == "no_call" for t in order):
        raise EnvError(
            f"{spec}: none of the step's {len(order)} trajectories made a model call: nothing to train. "
            "A client-side cache answers the agent's calls (DSPy's cache=True, a litellm or LangChain cache: turn "
            "it off under relayrl), or the agent returns before calling the model"
        )
    ended = [model_errors.get(t.key) for t in order]
    if len(order) > 1 and all(ended) and len({e[0] for e in ended if e}) == 1:
        kind, message = ended[0] or ("", "")
        raise EnvError(
            f"{spec}: every one of the step's {len(order)} trajectories ended in {kind}, an error the "
            f"agent's library raises over the model's output; when every trajectory hits it, the agent or its "
            f"setup is broken, not the model. The first: {order[0].where()}: {message}"
        )


def driver_metrics(order: list[Trajectory], rollouts: list[Rollout], stats: dict[str, Any]) -> dict[str, float]:
    """The env/* and tito/* metrics of a batch of trajectories (`stats`: the driver's running counts)."""
    count = max(1, len(order))
    tokens = sum(len(r.response_ids) for r in rollouts)
    # every rollout here has a loss mask (`_rollout` sets one)
    observed = sum(len(r.loss_mask) - sum(r.loss_mask) for r in rollouts if r.loss_mask is not None)
    return {
        "env/trajectories": float(len(order)),
        "env/turns_mean": sum(t.turns for t in order) / count,
        "env/turns_max": float(max((t.turns for t in order), default=0)),
        "env/success": sum(t.success for t in order) / count,
        "env/first_turn_success": sum(t.success and t.turns == 1 for t in order) / count,
        "env/tool_calls": sum(t.tool_calls for t in order) / count,
        "env/tool_errors": sum(t.tool_errors for t in order) / count,
        "env/errors": float(sum(t.failed == "error" for t in order)),
        "env/timeouts": float(sum(t.failed == "timeout" for t in order)),
        "env/no_call": float(sum(t.failed == "no_call" for t in order)),
        "env/unknown_chars": float(stats["unknown_chars"]),
        "env/truncated_frac": sum(t.truncated for t in order) / count,
        "time/env": stats["env_wait_s"],
        "tito/prefix_mismatch": float(stats["mismatch"]),
        "tito/forks": float(stats["forks"]),
        "response/obs_token_frac": observed / max(1, tokens),
    }
