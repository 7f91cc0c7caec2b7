"""The multi-turn rollout source: what the schedules call when `env.fn` (or env.agent, env.tools) is set. It implements
the `RolloutSource` seam (relayrl/sources/base.py) from the same shared parts as the single-turn one
(relayrl/sources/single_turn.py): prompts drawn under a lock, the step's sampling settings, skipped groups dropped.

`generate` runs the step's trajectories (relayrl/sources/trajectories.py) through the run's engines and the
environment workers, which live for the whole run; `score` turns each trajectory's combined environment
reward into its `Score` (component `env`), adds a `reward.fn` when one is configured (scored on the final
transcript), and hands the env/tito metrics to the step's metrics; `merge_metrics` joins those of several chunks
(the async producers', one per replica) weighted by their trajectories. `evaluate` runs held-out trajectories
greedily.

Every schedule works (relayrl/schedules/modes.py). `submit` runs a batch of trajectories on a thread of its
own and `finish` joins it: under `one_step_off` the next step's trajectories advance while the learner
trains, under `async` each producer (one per engine replica) runs its chunks there. Each such lane has its own
environment workers (a pool serves one driver at a time), so held-out evaluation in the training thread never
shares them. A weight push can land between two turns of a trajectory: it is not pinned to one version; its
later turns run on the new weights, each token tagged with the version that produced it (Ray engine actors
tag what they hold when they run a call), and the async buffer bounds its staleness by its oldest token.

With a token-level estimator (`algorithm.advantage` gae, reinforce_pp, reinforce_pp_baseline) each turn's
reward sits on that turn's last generated token (`Rollout.turn_rewards`, relayrl/algorithms/advantages.py), so
the trajectory's reward is their plain sum and `env.reward` does not apply; group estimators combine the turns'
rewards per `env.reward`.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from relayrl.algorithms.advantages import TOKEN_LEVEL
from relayrl.data.chat import ChatCodec
from relayrl.data.verifiers_tasks import is_spec as is_verifiers_spec
from relayrl.envs.pool import EnvPool
from relayrl.errors import ConfigError
from relayrl.rewards.service import add_counts
from relayrl.sources.base import Batch, PromptDraws, SourceSettings, drop_skipped_groups, step_sampling
from relayrl.sources.trajectories import EnvTools, MultiTurnDriver
from relayrl.sources.trajectory import MultiTurnBatch, UnknownCharacters, trajectory_rows
from relayrl.sources.turn_requests import turn_requests
from relayrl.types import Prompt, Rollout, Sampling, Score

if TYPE_CHECKING:
    from relayrl.config.env import EnvConfig
    from relayrl.data.source import PromptSampler
    from relayrl.rewards.service import RewardService
    from relayrl.rollout.protocols import EngineGroup
    from relayrl.sources.ledger import PromptLedger
    from relayrl.sync.base import WeightSync

MAIN = "main"  # the lane of `generate` and `evaluate`: the calling (training) thread


def is_trl_spec(fn: str) -> bool:
    return fn.startswith("trl:")


def agent_of(env: EnvConfig) -> tuple[str, dict[str, Any]] | None:
    """The agent function (spec, kwargs) that answers each trajectory: env.agent's, the tool loop that runs a TRL
    environment_factory class (env.fn or env.agent trl:module:Class, relayrl/agents/trl_env.py), or the built-in one
    that runs a verifiers environment's episodes (env.fn verifiers:TASKSET, relayrl/envs/verifiers_env.py); None for
    an env.fn environment class."""
    if env.agent:
        return env.agent, env.kwargs
    if is_trl_spec(env.fn):
        return env.fn, env.kwargs
    if is_verifiers_spec(env.fn):
        return "relayrl.envs.verifiers_env:episode", {"spec": env.fn, "config": env.kwargs}
    return None


def check_env(settings: SourceSettings, partial_rollouts: float) -> None:
    """A run's env.* settings that cannot work, found before anything is built or written (whether a whole
    trajectory fits the model's context: relayrl/sources/context.py). `partial_rollouts`: `train.partial_rollouts`."""
    if not settings.env.multi_turn:
        return
    spec = f"env.agent={settings.env.agent!r}" if settings.env.agent else f"env.fn={settings.env.env_class!r}"
    if partial_rollouts:
        raise ConfigError(
            f"{spec} does not combine with train.partial_rollouts: a trajectory's turns are "
            "generated whole, each as the environment answers (set train.partial_rollouts=0)"
        )
    if settings.advantage in TOKEN_LEVEL and "reward" in settings.env.model_fields_set:
        from relayrl.config.warn import warn

        warn(
            f"env.reward={settings.env.reward} has no effect with algorithm.advantage={settings.advantage}: "
            "each turn's reward sits on its own last token, discounted per token by algorithm.gamma"
        )
    agent = agent_of(settings.env)
    if agent is not None and not is_verifiers_spec(settings.env.fn):
        from relayrl.agents.loading import load_agent
        from relayrl.rollout.tool_calls import check_parsers

        function = load_agent(agent[0])
        check_parsers(settings.env.tool_parser, settings.env.reasoning_parser)
        if getattr(function, "scores", True) is False and not settings.with_reward_fn:
            raise ConfigError(
                f"{spec}: the environment has no get_reward and no reward.fn is set, so every trajectory would "
                "score 0; define get_reward on the class (TRL's way) or set reward.fn"
            )
    elif is_verifiers_spec(settings.env.fn):
        from relayrl.envs.verifiers_env import check

        check(settings.env.fn, settings.env.kwargs)
    else:
        from relayrl.envs.base import load_env_class

        env_class = load_env_class(settings.env.env_class)
        if settings.env.tools:
            env_tools(settings.env, env_class, settings.chat_template, model_path=settings.model_path)


def env_tools(
    env: EnvConfig, env_class: Any, chat_template: bool, tokenizer: Any = None, model_path: str = ""
) -> EnvTools:
    """env.tools' schemas and the parser that reads the turns (relayrl/envs/tools.py), checked: every tool, the
    chat template's `tools=` (data.chat_template), the parser's name; the tokenizer loaded from `model_path` when
    none is given, once the tools are known good."""
    from relayrl.envs.tools import parser_for, tool_schemas
    from relayrl.models.loading import load_tokenizer
    from relayrl.rollout.tool_calls import TurnParser, check_parsers

    schemas = tool_schemas(env.tools, env_class)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_path)
    name = parser_for(env.tool_parser, tokenizer, chat_template, schemas)
    check_parsers(name, env.reasoning_parser)
    return EnvTools(schemas, TurnParser(tokenizer, name, env.reasoning_parser))


# How two batches' metrics (MultiTurnDriver._metrics) make one batch's: the async producers' chunks, DAPO's rounds.
SUMMED = frozenset(
    (
        "env/trajectories",
        "env/errors",
        "env/timeouts",
        "env/no_call",
        "env/unknown_chars",
        "time/env",
        "tito/prefix_mismatch",
        "tito/forks",
    )
)
LARGEST = frozenset(("env/turns_max",))
PER_TRAJECTORY = frozenset(  # means over trajectories (obs_token_frac, over tokens, is weighted alike)
    (
        "env/turns_mean",
        "env/success",
        "env/first_turn_success",
        "env/tool_calls",
        "env/tool_errors",
        "env/truncated_frac",
        "response/obs_token_frac",
    )
)


def merge_batch_metrics(total: dict[str, float], part: dict[str, float]) -> dict[str, float]:
    """`part`'s trajectory metrics joined to `total`'s (the others are left as `part` has them): counts add up,
    the largest stays, every mean is weighted by the trajectories of each side (env/trajectories)."""
    out = dict(part)
    before, now = total.get("env/trajectories", 0.0), part.get("env/trajectories", 0.0)
    for key in part.keys() & total.keys():
        if key in SUMMED:
            out[key] = total[key] + part[key]
        elif key in LARGEST:
            out[key] = max(total[key], part[key])
        elif key in PER_TRAJECTORY and before + now > 0:
            out[key] = (total[key] * before + part[key] * now) / (before + now)
    return out


@dataclass
class Lane:
    """What one driver at a time uses: environment workers (or agents), and a tokenizer of its own (a fast tokenizer
    is not safe to call from two threads at once)."""

    pool: Any  # EnvPool, or AgentPool (relayrl/agents/pool.py) under env.agent
    codec: ChatCodec
    tools: EnvTools | None = None  # env.tools: its parser holds the lane's tokenizer
    lock: threading.Lock = field(default_factory=threading.Lock)


class MultiTurnSource:
    def __init__(
        self,
        settings: SourceSettings,
        engines: EngineGroup,
        rewards: RewardService | None,
        sampler: PromptSampler,
        sync: WeightSync,
        max_len: int | None = None,
    ):
        self.settings, self.engines, self.rewards, self.sync = settings, engines, rewards, sync
        self.draws = PromptDraws(sampler)
        self.max_len = max_len  # the engines' context: no turn's prompt and budget go past it
        token_level = settings.advantage in TOKEN_LEVEL  # the turns' rewards are placed, so summed
        self.env: EnvConfig = settings.env.model_copy(update={"reward": "sum"}) if token_level else settings.env
        self.with_reward_fn = settings.with_reward_fn
        self._lock = threading.Lock()  # guards the dicts here: the schedules' threads share this source
        self._lanes: dict[str, Lane] = {}
        self._generated: dict[int, MultiTurnBatch] = {}  # by id(batch.rollouts), until scored
        self._threads: ThreadPoolExecutor | None = None
        self._server = None  # env.agent: the agents' endpoint (relayrl/agents/server.py), shared by the lanes
        self._faults = None  # env.agent: what the agents got wrong (relayrl/agents/outcomes.py), shared by the lanes
        self.unknown = UnknownCharacters()  # characters the tokenizer lacks: warned about once per run
        self.codec = self._lane_of(MAIN).codec  # the main lane's workers start now, as the run is built

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

    def run(
        self, prompts: list[Prompt], sampling: Sampling, lane: str = MAIN, replicas: list[int] | None = None
    ) -> MultiTurnBatch:
        """The trajectories of `prompts` (n each) on `replicas` (default all), with the workers of `lane`."""
        own = self._lane_of(lane)
        with own.lock:
            turns = turn_requests(self.engines, self.version, replicas)
            driver = MultiTurnDriver(
                turns,
                own.pool,
                own.codec,
                self.env,
                sampling,
                unknown=self.unknown,
                context=self.max_len,
                tools=own.tools,
            )
            batch = driver.run(prompts, sampling.n)
        if self._faults is not None:  # env.agent: a warning repeated across the step's trajectories, summed up
            self._faults.notices.step_ended()
        with self._lock:
            self._generated[id(batch.rollouts)] = batch
        return batch

    def generate(self, prompts: list[Prompt], sampling: Sampling) -> list[Rollout]:
        return self.run(prompts, sampling).rollouts

    def submit(self, prompts: list[Prompt], sampling: Sampling, version: int, replicas: list[int] | None = None):
        """Run the trajectories on a thread of their own (one lane per replica set); `finish` joins it. `version`
        is not needed: the engines tag each turn's tokens with the weights that generate them."""
        lane = "all" if replicas is None else ",".join(map(str, replicas))
        with self._lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(thread_name_prefix="trajectories")
            return self._threads.submit(self.run, prompts, sampling, lane, replicas)

    def finish(self, pending: Future) -> list[Rollout]:
        return pending.result().rollouts

    def score_samples(self, rollouts: list[Rollout]) -> tuple[list[Score | None], dict[str, float]]:
        with self._lock:
            batch = self._generated.pop(id(rollouts), None)
        if batch is None or batch.rollouts is not rollouts:
            raise RuntimeError("MultiTurnSource.score takes the rollouts a generate or finish returned")
        env_scores = [Score(r, {"env": r}) for r in batch.rewards]
        scores: list[Score | None] = list(env_scores)
        metrics = dict(batch.metrics)
        if self.with_reward_fn and rollouts:
            assert self.rewards is not None, "a reward.fn is scored by the run's reward service"
            rows = trajectory_rows(rollouts)  # a forked sample takes its trajectory's score, not one of its own
            last = [row for row, own in enumerate(rows) if own == row]
            scored, reward_metrics = self.rewards.score([rollouts[row] for row in last])
            by_row = dict(zip(last, scored))
            extra = [by_row[own] for own in rows]
            metrics.update(reward_metrics)
            scores = [
                None
                if e is None
                else Score(s.reward + e.reward, {**s.components, **(e.components or {"fn": e.reward})}, e.error)
                for s, e in zip(env_scores, extra)
            ]
        return scores, metrics

    def score(self, rollouts: list[Rollout]) -> Batch:
        """`score_samples`; a group with a skipped sample (reward.on_error=skip) is dropped whole."""
        return drop_skipped_groups(rollouts, *self.score_samples(rollouts))

    def merge_metrics(self, total: dict[str, float], part: dict[str, float]) -> dict[str, float]:
        """As the single-turn source for the reward's metrics; env/* and tito/* weighted by trajectories."""
        return merge_batch_metrics(total, add_counts(total, part))

    def evaluate(self, prompts: list[Prompt]) -> dict[str, float]:
        """Held-out trajectories, greedy: mean reward, success, first-turn success, turns."""
        r = self.settings.rollout
        mean, m = self.held_out(prompts, Sampling.greedy(r.max_tokens, r.stop, r.min_tokens))
        return {
            "eval/greedy": mean,
            "eval/success": m["env/success"],
            "eval/first_turn_success": m["env/first_turn_success"],
            "eval/turns_mean": m["env/turns_mean"],
        }

    def held_out(self, prompts: list[Prompt], sampling: Sampling) -> tuple[float, dict[str, float]]:
        """Mean reward over prompts x sampling.n trajectories, scored by their environment (a dropped one counts
        as 0), and the metrics of running them (env/success, env/turns_mean, env/errors, ...)."""
        batch = self.run(prompts, sampling)
        with self._lock:
            self._generated.pop(id(batch.rollouts), None)  # not scored by the reward service
        return sum(batch.rewards) / max(1, len(prompts) * sampling.n), batch.metrics

    def _lane_of(self, name: str) -> Lane:
        from relayrl.models.loading import load_tokenizer

        with self._lock:
            if name not in self._lanes:
                codec = ChatCodec(load_tokenizer(self.settings.model_path), self.settings.chat_template)
                tools = None
                if self.env.tools:
                    from relayrl.envs.base import load_env_class

                    tools = env_tools(
                        self.env, load_env_class(self.env.env_class), self.settings.chat_template, codec.tokenizer
                    )
                self._lanes[name] = Lane(self._pool(codec.tokenizer), codec, tools=tools)
            return self._lanes[name]

    def _pool(self, tokenizer):
        """A lane's environment workers, or (env.agent) its agents on the run's endpoint (started with the first)."""
        env = self.env
        agent = agent_of(env)
        if agent is None:
            return EnvPool(env.env_class, env.kwargs, env.max_inflight, env.timeout_s, env.tools)
        from relayrl.agents.outcomes import Faults
        from relayrl.agents.pool import AgentPool
        from relayrl.agents.sampling import RunSampling
        from relayrl.agents.server import AgentServer

        if self._server is None:
            self._faults = Faults()
            r = self.settings.rollout
            values = {"temperature": r.temperature, "top_p": r.top_p, "stop": list(r.stop)}
            values.update(top_k=r.top_k if r.top_k > 0 else -1, max_tokens=env.max_tokens_per_turn or r.max_tokens)
            self._server, self._run_sampling = AgentServer(), RunSampling(values)
        return AgentPool(
            self._server,
            *agent,
            env.max_inflight,
            env.timeout_s,
            tokenizer,
            env.tool_parser,
            self._run_sampling,
            env.reasoning_parser,
            self._faults,
        )

    def close(self) -> None:
        if self._threads is not None:  # a batch still running ends on its own (the engines are gone by now)
            self._threads.shutdown(wait=True, cancel_futures=True)
        for lane in self._lanes.values():
            lane.pool.close()
        if self._server is not None:
            self._server.close()
