"""Where the schedules get scored rollouts from: prompts, the sampling settings of a step, the engines, the
reward service, and the policy version the engines hold. The schedules decide who waits for whom; this
object is what they call, so they never see the trainer.

This is the single-turn source (one prompt, one response). A multi-turn source (environments stepping each
trajectory, relayrl/sources/multi_turn.py) offers the same methods and returns the same `Batch`: the schedules call
`generate` (sync), or `submit` then `finish` (one_step_off, async), never the engines themselves. Both also
`evaluate` held-out prompts (the trainer's before/after and every `eval.every` steps) and `close`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from relayrl.rewards.service import add_counts
from relayrl.rollout.protocols import EngineGroup
from relayrl.sources.ledger import PromptLedger
from relayrl.types import Prompt, Rollout, Sampling, Score

if TYPE_CHECKING:
    from relayrl.config import Config
    from relayrl.data.source import PromptSampler
    from relayrl.rewards.service import RewardService
    from relayrl.sync.base import WeightSync


@dataclass
class Batch:
    """A step's scored rollouts (prompt-major, aligned one to one) and what collecting them measured."""

    rollouts: list[Rollout]
    scores: list[Score]
    metrics: dict[str, float] = field(default_factory=dict)


class RolloutSource:
    def __init__(
        self, config: Config, engines: EngineGroup, rewards: RewardService, sampler: PromptSampler, sync: WeightSync
    ):
        self.config, self.engines, self.rewards, self.sampler, self.sync = config, engines, rewards, sampler, sync
        self._sampler_lock = threading.Lock()  # the async schedule's producer threads draw concurrently

    @property
    def version(self) -> int:
        """The policy version the engines hold (the last one pushed)."""
        return self.sync.version

    def prompts(self, n: int, ledger: PromptLedger | None = None) -> list[Prompt]:
        """The next `n` prompts; with a ledger (async), the draw is recorded in it, in draw order."""
        with self._sampler_lock:
            drawn = self.sampler.next_rows(n)
            if ledger is not None:
                ledger.drawn(drawn)
            return [prompt for _, prompt in drawn]

    def sampler_state(self, ledger: PromptLedger | None = None) -> dict:
        """The sampler's state, with the ledger's unsettled draws to be replayed first (taken between two draws)."""
        with self._sampler_lock:
            state = self.sampler.state()
            if ledger is not None and (rows := ledger.open_rows()):
                state["replay"] = rows + state.get("replay", [])
            return state

    def sampling(self, step: int, round_index: int = 0) -> Sampling:
        """The step's sampling settings; the seed differs per step and per DAPO round."""
        r = self.config.rollout
        seed = (self.config.train.seed * 100_003 + step) * 64 + round_index
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

    def generate(self, prompts: list[Prompt], sampling: Sampling) -> list[Rollout]:
        return self.engines.generate(prompts, sampling, self.version)

    def submit(self, prompts: list[Prompt], sampling: Sampling, version: int, replicas: list[int] | None = None) -> Any:
        """Start generating `prompts` (on `replicas`, default all) and return at once where the engines run
        elsewhere (Ray actors): the overlapped schedules train meanwhile. `finish` collects the rollouts."""
        return self.engines.submit(prompts, sampling, version, replicas)

    def finish(self, pending: Any) -> list[Rollout]:
        return self.engines.finish(pending)

    def score_samples(self, rollouts: list[Rollout]) -> tuple[list[Score | None], dict[str, float]]:
        """One score per rollout (None: skipped under reward.on_error=skip) and the reward service's metrics."""
        return self.rewards.score(rollouts)

    def score(self, rollouts: list[Rollout]) -> Batch:
        """Score through the reward service; a group with a skipped sample (on_error=skip) is dropped whole,
        as group-relative advantages need every member."""
        scores, metrics = self.score_samples(rollouts)
        skipped = {r.prompt.id for r, s in zip(rollouts, scores) if s is None}
        if skipped:
            kept = [(r, s) for r, s in zip(rollouts, scores) if r.prompt.id not in skipped]
            rollouts, scores = [r for r, _ in kept], [s for _, s in kept]
            metrics["reward/skipped_groups"] = float(len(skipped))
        return Batch(rollouts, cast("list[Score]", scores), metrics)  # no None is left: its group is dropped

    def merge_metrics(self, total: dict[str, float], part: dict[str, float]) -> dict[str, float]:
        """The metrics of two scored parts of one batch (the async producers' chunks, DAPO's rounds) as one."""
        return add_counts(total, part)

    def evaluate(self, prompts: list[Prompt]) -> dict[str, float]:
        """Held-out mean reward, greedy and sampled at `eval.temperature`; the policy's length rules (max/min
        tokens, stop strings) hold at evaluation as in training."""
        r = self.config.rollout
        greedy = Sampling.greedy(r.max_tokens, r.stop, r.min_tokens)
        sampled = Sampling(
            n=1,
            temperature=self.config.eval.temperature,
            max_tokens=r.max_tokens,
            min_tokens=r.min_tokens,
            stop=tuple(r.stop),
            seed=self.config.train.seed,
        )
        return {"eval/greedy": self._mean_reward(prompts, greedy), "eval/sampled": self._mean_reward(prompts, sampled)}

    def _mean_reward(self, prompts: list[Prompt], sampling: Sampling) -> float:
        """Mean reward over prompts x sampling.n responses (a sample the reward skipped counts as 0)."""
        scores, _ = self.rewards.score(self.engines.generate(prompts, sampling, self.version))
        return sum(s.reward for s in scores if s is not None) / len(scores)

    def close(self) -> None:
        """Nothing of its own to release (the engines and the reward service are closed by their owners)."""
