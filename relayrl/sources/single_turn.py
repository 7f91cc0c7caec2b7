"""The single-turn rollout source (one prompt, one response): what the schedules call when no environment is set.

It implements the `RolloutSource` seam (relayrl/sources/base.py, where the schedules' use of it is described) from
the shared parts there: prompts drawn under a lock, the step's sampling settings, skipped groups dropped. The
multi-turn source (relayrl/sources/multi_turn.py) is built from the same parts and returns the same `Batch`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from relayrl.rewards.service import add_counts
from relayrl.sources.base import Batch, PromptDraws, SourceSettings, drop_skipped_groups, step_sampling
from relayrl.types import Sampling

if TYPE_CHECKING:
    from relayrl.data.source import PromptSampler
    from relayrl.rewards.service import RewardService
    from relayrl.rollout.protocols import EngineGroup
    from relayrl.sources.ledger import PromptLedger
    from relayrl.sync.base import WeightSync
    from relayrl.types import Prompt, Rollout, Score


class SingleTurnSource:
    def __init__(
        self,
        settings: SourceSettings,
        engines: EngineGroup,
        rewards: RewardService,
        sampler: PromptSampler,
        sync: WeightSync,
    ):
        self.settings, self.engines, self.rewards, self.sync = settings, engines, rewards, sync
        self.draws = PromptDraws(sampler)

    @property
    def version(self) -> int:
        """The policy version the engines hold (the last one pushed)."""
        return self.sync.version

    def prompts(self, n: int, ledger: PromptLedger | None = None) -> list[Prompt]:
        return self.draws.next(n, ledger)

    def sampler_state(self, ledger: PromptLedger | None = None) -> dict:
        return self.draws.state(ledger)

    def sampling(self, step: int, round_index: int = 0) -> Sampling:
        return step_sampling(self.settings.rollout, self.settings.seed, step, round_index)

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
        """Score through the reward service; a group with a skipped sample (on_error=skip) is dropped whole."""
        return drop_skipped_groups(rollouts, *self.score_samples(rollouts))

    def merge_metrics(self, total: dict[str, float], part: dict[str, float]) -> dict[str, float]:
        """The metrics of two scored parts of one batch (the async producers' chunks, DAPO's rounds) as one."""
        return add_counts(total, part)

    def evaluate(self, prompts: list[Prompt]) -> dict[str, float]:
        """Held-out mean reward, greedy and sampled at `eval.temperature`; the policy's length rules (max/min
        tokens, stop strings) hold at evaluation as in training."""
        r = self.settings.rollout
        greedy = Sampling.greedy(r.max_tokens, r.stop, r.min_tokens)
        sampled = Sampling(
            n=1,
            temperature=self.settings.eval.temperature,
            max_tokens=r.max_tokens,
            min_tokens=r.min_tokens,
            stop=tuple(r.stop),
            seed=self.settings.seed,
        )
        return {"eval/greedy": self.held_out(prompts, greedy)[0], "eval/sampled": self.held_out(prompts, sampled)[0]}

    def held_out(self, prompts: list[Prompt], sampling: Sampling) -> tuple[float, dict[str, float]]:
        """Mean reward over prompts x sampling.n responses (a sample the reward skipped counts as 0), and the
        reward service's metrics of scoring them (reward/errors, reward/timeouts, reward/skipped)."""
        scores, metrics = self.rewards.score(self.engines.generate(prompts, sampling, self.version))
        return sum(s.reward for s in scores if s is not None) / max(1, len(scores)), metrics

    def close(self) -> None:
        """Nothing of its own to release (the engines and the reward service are closed by their owners)."""
