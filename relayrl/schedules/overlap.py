"""Where a step's rollouts come from under each `train.schedule`.

- `sync`: generated now, with the weights the learner just pushed (with DAPO dynamic sampling, over rounds).
- `one_step_off`: the batch for step k+1 is submitted to the engines before step k trains. Engine calls
  run in the order they were sent, so that generation finishes with the weights of step k before the
  push of step k+1's weights is applied: every sample is exactly one version old.
- `async`: one producer thread per engine replica generates continuously into a `RolloutBuffer`, scoring
  each chunk as soon as it finishes (streaming rewards, overlapped with the other replicas and the
  learner); the learner takes a batch per step. Staleness is bounded by `train.max_staleness`, by
  waiting (admission control) or dropping (`train.on_stale`). With `train.partial_rollouts` (APRIL), each
  producer starts that factor more groups than it needs, stops the engine once enough have finished and
  carries the unfinished responses into its next call, where they continue under the newest weights
  (their tokens then span versions, each tagged; groups too old to be used are discarded and counted).
Each is built from a `RolloutSource` (relayrl/rollout/source.py: prompts, sampling, engines, rewards, the
published version) and the config, and returns a `Batch` from `batch(step, timer)`; `published(version)` is
called after every push and `close()` at the end of the run. DAPO's soft overlong punishment applies to the
batch of every schedule.
"""

from __future__ import annotations

import functools
import math
import threading
import time

from relayrl.algorithms.dapo import DynamicSampling, add_overlong_penalty
from relayrl.config import Config
from relayrl.errors import PlacementError
from relayrl.metrics.timer import StepTimer
from relayrl.rewards.service import add_counts
from relayrl.rollout.base import PartialSample
from relayrl.rollout.seeds import request_seed
from relayrl.rollout.source import Batch, RolloutSource
from relayrl.schedules.buffer import Group, RolloutBuffer


class Schedule:
    """The part every schedule shares: DAPO's soft overlong punishment on whatever batch it hands out."""

    def __init__(self, source: RolloutSource, config: Config):
        self.source, self.config = source, config
        self.overlong_buffer = config.algorithm.dapo.overlong_buffer

    def batch(self, step: int, timer: StepTimer) -> Batch:
        batch = self.collect(step, timer)
        if self.overlong_buffer:
            max_tokens = self.config.rollout.max_tokens
            batch.scores = add_overlong_penalty(batch.rollouts, batch.scores, max_tokens, self.overlong_buffer)
        return batch

    def collect(self, step: int, timer: StepTimer) -> Batch:
        raise NotImplementedError

    def published(self, version: int) -> None:
        pass

    def close(self) -> None:
        pass


class SyncSchedule(Schedule):
    """Generate and score one batch now; with DAPO dynamic sampling (the collector chosen here), keep only
    groups with a reward signal and generate more rounds until prompts_per_step groups are collected."""

    def __init__(self, source: RolloutSource, config: Config):
        super().__init__(source, config)
        dapo = config.algorithm.dapo
        rounds = DynamicSampling(config.rollout.prompts_per_step, dapo.max_rounds)
        self.rounds = rounds.collect if dapo.dynamic_sampling else one_round

    def collect(self, step: int, timer: StepTimer) -> Batch:
        reward_metrics: dict[str, float] = {}  # summed over the rounds
        rollouts, scores, metrics = self.rounds(functools.partial(self._round, step, timer, reward_metrics))
        return Batch(rollouts, scores, {**reward_metrics, **metrics})

    def _round(self, step: int, timer: StepTimer, reward_metrics: dict, round_index: int):
        prompts = self.source.prompts(self.config.rollout.prompts_per_step)
        with timer("generate"):
            rollouts = self.source.generate(prompts, self.source.sampling(step, round_index))
        with timer("reward"):
            scored = self.source.score(rollouts)
        reward_metrics.update(add_counts(reward_metrics, scored.metrics))
        return scored.rollouts, scored.scores


def one_round(generate_round) -> tuple[list, list, dict[str, float]]:
    """The collector without dynamic sampling: one round, trained as it is."""
    return (*generate_round(0), {})


class OneStepOff(Schedule):
    def __init__(self, source: RolloutSource, config: Config):
        super().__init__(source, config)
        self.pending = None

    def _submit(self, step: int):
        s = self.source
        return s.engines.submit(s.prompts(self.config.rollout.prompts_per_step), s.sampling(step), s.version)

    def collect(self, step: int, timer: StepTimer) -> Batch:
        if self.pending is None:
            self.pending = self._submit(step)
        with timer("generate"):  # what is left of the generation that ran during the previous step
            rollouts = self.source.engines.finish(self.pending)
        self.pending = self._submit(step + 1) if step + 1 < self.config.train.steps else None
        with timer("reward"):
            return self.source.score(rollouts)

    def close(self) -> None:
        if self.pending is not None:  # drain, so no call is left running in an engine
            self.source.engines.finish(self.pending)
            self.pending = None


class AsyncSchedule(Schedule):
    def __init__(self, source: RolloutSource, config: Config):
        super().__init__(source, config)
        self.buffer = RolloutBuffer(
            config.rollout.prompts_per_step, config.train.max_staleness, config.train.on_stale, version=source.version
        )
        replicas = len(source.engines.replicas)
        self.chunk = max(1, config.rollout.prompts_per_step // replicas)
        self.metrics_lock = threading.Lock()
        self.reward_metrics: dict[str, float] = {}  # summed over the chunks scored since the last batch
        self.failure = None
        self.partial_states: list[PartialState] = []
        self.threads = [
            threading.Thread(target=self._produce, args=(i,), name=f"producer-{i}", daemon=True)
            for i in range(replicas)
        ]
        for thread in self.threads:
            thread.start()

    def _produce(self, replica: int) -> None:
        try:
            if self.config.train.partial_rollouts:
                state = PartialState()
                self.partial_states.append(state)
                while self._produce_partial(replica, state):
                    pass
            else:
                while self._produce_chunk(replica):
                    pass
        except BaseException as err:  # surfaces in the training loop's next `batch`
            self.failure = err
            self.buffer.close()

    def _admit_chunk(self) -> list[int] | None:
        tickets = []
        for _ in range(self.chunk):
            ticket = self.buffer.admit()
            if ticket is None:
                return None
            tickets.append(ticket)
        return tickets

    def _produce_chunk(self, replica: int) -> bool:
        s, tickets = self.source, self._admit_chunk()
        if tickets is None:
            return False
        prompts = s.prompts(len(tickets))
        version = self.buffer.version
        rollouts = s.engines.finish(s.engines.submit(prompts, s.sampling(tickets[0]), version, replicas=[replica]))
        self._score_and_put(rollouts, tickets, version)
        return True

    def _score_and_put(self, rollouts, tickets: list[int], version: int) -> None:
        """Score as soon as generated (streaming), one group per ticket; a group with a skipped sample still
        fills its ticket, empty, so the learner never waits for it."""
        n = self.config.rollout.n
        scores, metrics = self.source.score_samples(rollouts)
        with self.metrics_lock:
            self.reward_metrics = add_counts(self.reward_metrics, metrics)
        for i, ticket in enumerate(tickets):
            group, group_scores = rollouts[i * n : (i + 1) * n], scores[i * n : (i + 1) * n]
            if any(s is None for s in group_scores):
                group, group_scores = [], []
            oldest = min((v for r in group for v in r.versions), default=version)
            self.buffer.put(Group(group, group_scores, oldest, ticket))

    def _produce_partial(self, replica: int, state: "PartialState") -> bool:
        s, train = self.source, self.config.train
        n, tickets = self.config.rollout.n, self._admit_chunk()
        if tickets is None:
            return False
        state.discard_older_than(self.buffer.version - train.max_staleness)
        wanted = math.ceil(len(tickets) * train.partial_rollouts) - state.groups_started()
        prompts = s.prompts(max(0, wanted))
        sampling = s.sampling(tickets[0])
        for prompt in prompts:
            state.start(prompt, n, request_seed(sampling.seed, state.next_group, n))
        needed = max(0, len(tickets) - len(state.ready))
        state.running = s.engines.generate_until(replica, state.running, sampling, needed)  # a remote copy
        state.collect()
        rollouts = [sample.to_rollout() for group in state.ready[: len(tickets)] for sample in group]
        self._score_and_put(rollouts, tickets[: len(state.ready)], self.buffer.version)
        state.ready = state.ready[len(tickets) :]
        return True

    def collect(self, step: int, timer: StepTimer) -> Batch:
        with timer("wait"):  # the learner idles here when the engines are behind
            try:
                groups = self.buffer.take(self.source.version, self.config.placement.call_timeout_s)
            except PlacementError:
                if self.failure is not None:
                    raise self.failure from None
                raise
        rollouts = [r for g in groups for r in g.rollouts]
        scores = [s for g in groups for s in g.scores]
        with self.metrics_lock:
            reward_metrics, self.reward_metrics = self.reward_metrics, {}
        spanning = sum(len(set(r.versions)) > 1 for r in rollouts) / max(1, len(rollouts))
        metrics = {**reward_metrics, **self.buffer.metrics()}
        if self.config.train.partial_rollouts:
            metrics.update(
                {
                    "partial/spanning_frac": spanning,
                    "partial/running": float(sum(len(p.running) for p in self.partial_states)),
                    "partial/discarded_groups": float(sum(p.discarded for p in self.partial_states)),
                }
            )
        return Batch(rollouts, scores, metrics)

    def published(self, version: int) -> None:
        self.buffer.advance(version)

    def close(self) -> None:
        self.buffer.close()
        deadline = time.monotonic() + self.config.placement.call_timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))


class PartialState:
    """One producer's partial rollouts: groups running (some samples unfinished) and groups finished but
    not yet handed to the buffer."""

    def __init__(self):
        self.running: list[PartialSample] = []
        self.ready: list[list[PartialSample]] = []
        self.next_group = 0
        self.discarded = 0

    def start(self, prompt, n: int, seed: int | None) -> None:
        self.running += [
            PartialSample(prompt=prompt, group=self.next_group, group_index=j, seed=None if seed is None else seed + j)
            for j in range(n)
        ]
        self.next_group += 1

    def groups_started(self) -> int:
        return len({s.group for s in self.running}) + len(self.ready)

    def collect(self) -> None:
        """Move every group whose samples have all finished from `running` to `ready` (oldest group first)."""
        groups: dict[int, list[PartialSample]] = {}
        for sample in self.running:
            groups.setdefault(sample.group, []).append(sample)
        done = [g for g in sorted(groups) if all(s.finished for s in groups[g])]
        self.ready += [groups[g] for g in done]
        self.running = [s for s in self.running if s.group not in set(done)]

    def discard_older_than(self, version: int) -> None:
        """Drop groups, running or finished and carried, holding tokens older than `version`: they could not be
        trained in time (the buffer would only drop them after they were scored)."""
        old = {s.group for s in self.running if s.versions and min(s.versions) < version}
        fresh = [g for g in self.ready if all(not s.versions or min(s.versions) >= version for s in g)]
        self.discarded += len(old) + len(self.ready) - len(fresh)
        self.running = [s for s in self.running if s.group not in old]
        self.ready = fresh


SCHEDULES = {"sync": SyncSchedule, "one_step_off": OneStepOff, "async": AsyncSchedule}
