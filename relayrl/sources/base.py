"""The rollout-source seam: what the schedules and the trainer call (`RolloutSource`), what it returns (`Batch`), and
the parts every source is built from.

Two sources implement it, each by composition of the parts here: the single-turn one (relayrl/sources/single_turn.py:
one prompt, one response) and the multi-turn one (relayrl/sources/multi_turn.py: environments or agents step each
trajectory). The schedules (relayrl/schedules/modes.py) call `generate` (sync), or `submit` then `finish`
(one_step_off, async), never the engines themselves, except the async schedule's partial rollouts, which continue
unfinished samples on one replica (`engines.generate_until`). The trainer calls `evaluate` (its before/after and
every `eval.every` steps) and `close`; `relayrl eval` calls `held_out`, the one measurement `evaluate` is made of.

The shared parts: `PromptDraws` (the run's prompt sampler behind a lock, each draw recorded in the async schedule's
ledger), `step_sampling` (a step's sampling settings and seed) and `drop_skipped_groups` (what `score` keeps of a
batch whose reward skipped samples).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from relayrl.types import Sampling

if TYPE_CHECKING:
    from relayrl.config import EnvConfig, EvalConfig, RolloutConfig
    from relayrl.data.source import PromptSampler
    from relayrl.rollout.protocols import EngineGroup
    from relayrl.sources.ledger import PromptLedger
    from relayrl.types import Prompt, Rollout, Score


@dataclass(frozen=True)
class SourceSettings:
    """What a rollout source reads, assembled by the builder (relayrl/build.py, `source_settings`): the step's and
    the held-out sampling (`rollout`, `eval`, the run's `train.seed`), and for a multi-turn source its environment
    (`env`), the estimator (a token-level one places each turn's reward), the model's tokenizer and chat template,
    and whether a `reward.fn` (or `reward.components`) is set beside the environment's reward."""

    rollout: RolloutConfig
    eval: EvalConfig
    env: EnvConfig
    seed: int
    advantage: str
    model_path: str
    chat_template: bool
    with_reward_fn: bool


@dataclass
class Batch:
    """A step's scored rollouts (prompt-major, aligned one to one) and what collecting them measured."""

    rollouts: list[Rollout]
    scores: list[Score]
    metrics: dict[str, float] = field(default_factory=dict)


class RolloutSource(Protocol):
    """What a schedule draws a step's scored rollouts from, and the trainer's held-out evaluation."""

    engines: EngineGroup  # the async schedule's producers: one per replica, partial rollouts via generate_until

    @property
    def version(self) -> int:
        """The policy version the engines hold (the last one pushed)."""
        ...

    def prompts(self, n: int, ledger: PromptLedger | None = None) -> list[Prompt]:
        """The next `n` prompts; with a ledger (async), the draw is recorded in it, in draw order."""
        ...

    def sampler_state(self, ledger: PromptLedger | None = None) -> dict:
        """The sampler's state, with the ledger's unsettled draws to be replayed first."""
        ...

    def sampling(self, step: int, round_index: int = 0) -> Sampling:
        """The step's sampling settings; the seed differs per step and per DAPO round."""
        ...

    def generate(self, prompts: list[Prompt], sampling: Sampling) -> list[Rollout]: ...

    def submit(self, prompts: list[Prompt], sampling: Sampling, version: int, replicas: list[int] | None = None) -> Any:
        """Start generating `prompts` (on `replicas`, default all) and return at once; `finish` collects them."""
        ...

    def finish(self, pending: Any) -> list[Rollout]: ...

    def score_samples(self, rollouts: list[Rollout]) -> tuple[list[Score | None], dict[str, float]]:
        """One score per rollout (None: skipped under reward.on_error=skip) and the metrics of scoring them."""
        ...

    def score(self, rollouts: list[Rollout]) -> Batch:
        """`score_samples`, then `drop_skipped_groups`."""
        ...

    def merge_metrics(self, total: dict[str, float], part: dict[str, float]) -> dict[str, float]:
        """The metrics of two scored parts of one batch (the async producers' chunks, DAPO's rounds) as one."""
        ...

    def evaluate(self, prompts: list[Prompt]) -> dict[str, float]:
        """Held-out metrics (eval/*) of the current policy on `prompts`."""
        ...

    def held_out(self, prompts: list[Prompt], sampling: Sampling) -> tuple[float, dict[str, float]]:
        """What `evaluate` (and `relayrl eval`) measures once: the mean reward over prompts x sampling.n samples, a
        skipped or dropped one counted as 0, and the metrics of collecting and scoring them."""
        ...

    def close(self) -> None:
        """Release what the source itself started (threads, workers); the engines and rewards are their owners'."""
        ...


class PromptDraws:
    """The run's prompt sampler behind a lock: the async schedule's producer threads draw concurrently."""

    def __init__(self, sampler: PromptSampler):
        self.sampler = sampler
        self._lock = threading.Lock()

    def next(self, n: int, ledger: PromptLedger | None = None) -> list[Prompt]:
        """The next `n` prompts; with a ledger (async), the draw is recorded in it, in draw order."""
        with self._lock:
            drawn = self.sampler.next_rows(n)
            if ledger is not None:
                ledger.drawn(drawn)
            return [prompt for _, prompt in drawn]

    def state(self, ledger: PromptLedger | None = None) -> dict:
        """The sampler's state, with the ledger's unsettled draws to be replayed first (taken between two draws)."""
        with self._lock:
            state = self.sampler.state()
            if ledger is not None and (rows := ledger.open_rows()):
                state["replay"] = rows + state.get("replay", [])
            return state


def step_sampling(r: RolloutConfig, seed: int, step: int, round_index: int = 0) -> Sampling:
    """The step's sampling settings (`rollout`, the run's `train.seed`); the seed differs per step and per DAPO
    round."""
    seed = (seed * 100_003 + step) * 64 + round_index
    return Sampling(
        n=r.n,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_tokens=r.max_tokens,
        min_tokens=r.min_tokens,
        stop=tuple(r.stop),
        seed=seed,
    )


def drop_skipped_groups(rollouts: list[Rollout], scores: list[Score | None], metrics: dict[str, float]) -> Batch:
    """The scored batch; a group with a skipped sample (reward.on_error=skip) is dropped whole, as group-relative
    advantages need every member (counted in `reward/skipped_groups`)."""
    skipped = {r.prompt.id for r, s in zip(rollouts, scores) if s is None}
    if skipped:
        kept = [(r, s) for r, s in zip(rollouts, scores) if r.prompt.id not in skipped]
        rollouts, scores = [r for r, _ in kept], [s for _, s in kept]
        metrics["reward/skipped_groups"] = float(len(skipped))
    return Batch(rollouts, cast("list[Score]", scores), metrics)  # no None is left: its group is dropped
