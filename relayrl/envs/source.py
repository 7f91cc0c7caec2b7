"""The multi-turn rollout source: what the schedules call when `env.fn` is set (relayrl/rollout/source.py is the
single-turn one, with the same methods).

`generate` runs the step's trajectories (relayrl/rollout/multiturn.py) through the run's engines and the
environment workers, which live for the whole run; `score` turns each trajectory's combined environment
reward into its `Score` (component `env`), adds a `reward.fn` when one is configured (scored on the final
transcript), and hands the env/tito metrics to the step's metrics. `evaluate` runs held-out trajectories
greedily. Only `train.schedule=sync` for now: one_step_off and async submit whole batches to the engines
themselves (relayrl/schedules/overlap.py).
"""

from __future__ import annotations

from relayrl.envs.config import EnvConfig
from relayrl.envs.pool import EnvPool
from relayrl.envs.requests import turn_requests
from relayrl.errors import ConfigError
from relayrl.rollout.base import Sampling
from relayrl.rollout.chat import ChatCodec
from relayrl.rollout.multiturn import MultiTurnBatch, MultiTurnDriver
from relayrl.rollout.source import RolloutSource
from relayrl.types import Prompt, Rollout, Score


def response_budget(config) -> int:
    """Tokens after the first prompt that the engines' context must hold."""
    return max(config.rollout.max_tokens, config.env.max_total_tokens) if config.env.fn else config.rollout.max_tokens


def check_env(config) -> None:
    """A run's env.* settings that cannot work, found before anything is built or written."""
    if not config.env.fn:
        return
    if config.train.schedule != "sync":
        raise ConfigError(
            f"env.fn={config.env.fn!r} runs under train.schedule=sync only for now (got "
            f"{config.train.schedule}): one_step_off and async submit whole batches to the engines"
        )
    from relayrl.envs.base import load_env_class

    load_env_class(config.env.fn)


class MultiTurnSource(RolloutSource):
    def __init__(self, config, engines, rewards, sampler, sync):
        check_env(config)
        super().__init__(config, engines, rewards, sampler, sync)
        from relayrl.models.loading import load_tokenizer

        self.env: EnvConfig = config.env
        self.codec = ChatCodec(load_tokenizer(config.model.path), config.data.chat_template)
        self.pool = EnvPool(self.env.fn, self.env.kwargs, self.env.max_inflight, self.env.timeout_s)
        self.with_reward_fn = bool(config.reward.model_fields_set & {"fn", "components"})
        self._last: MultiTurnBatch | None = None

    def run(self, prompts: list[Prompt], sampling: Sampling) -> MultiTurnBatch:
        turns = turn_requests(self.engines, self.version)
        return MultiTurnDriver(turns, self.pool, self.codec, self.env, sampling).run(prompts, sampling.n)

    def generate(self, prompts: list[Prompt], sampling: Sampling) -> list[Rollout]:
        self._last = self.run(prompts, sampling)
        return self._last.rollouts

    def score_samples(self, rollouts: list[Rollout]) -> tuple[list[Score | None], dict[str, float]]:
        batch, self._last = self._last, None
        if batch is None or batch.rollouts is not rollouts:
            raise RuntimeError("MultiTurnSource.score takes the rollouts its last generate returned")
        scores: list[Score | None] = [Score(r, {"env": r}) for r in batch.rewards]
        metrics = dict(batch.metrics)
        if self.with_reward_fn and rollouts:
            extra, reward_metrics = self.rewards.score(rollouts)
            metrics.update(reward_metrics)
            scores = [
                None
                if e is None
                else Score(s.reward + e.reward, {**s.components, **(e.components or {"fn": e.reward})})
                for s, e in zip(scores, extra)
            ]
        return scores, metrics

    def evaluate(self, prompts: list[Prompt]) -> dict[str, float]:
        """Held-out trajectories, greedy: mean reward, success, first-turn success, turns."""
        r = self.config.rollout
        batch = self.run(prompts, Sampling.greedy(r.max_tokens, r.stop, r.min_tokens))
        m = batch.metrics
        return {
            "eval/greedy": sum(batch.rewards) / max(1, len(prompts)),
            "eval/success": m["env/success"],
            "eval/first_turn_success": m["env/first_turn_success"],
            "eval/turns_mean": m["env/turns_mean"],
        }

    def close(self) -> None:
        self.pool.close()
