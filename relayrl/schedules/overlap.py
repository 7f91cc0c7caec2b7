"""Where a step's rollouts come from under each `train.schedule`.

- `sync`: generated now, with the weights the learner just pushed (the trainer's own `collect`).
- `one_step_off`: the batch for step k+1 is submitted to the engines before step k trains. Engine calls
  run in the order they were sent, so that generation finishes with the weights of step k before the
  push of step k+1's weights is applied: every sample is exactly one version old.
- `async`: one producer thread per engine replica generates continuously into a `RolloutBuffer`, scoring
  each chunk as soon as it finishes (streaming rewards, overlapped with the other replicas and the
  learner); the learner takes a batch per step. Staleness is bounded by `train.max_staleness`, by
  waiting (admission control) or dropping (`train.on_stale`).
Each returns `(rollouts, scores, metrics)` from `batch(step, timer)`; `published(version)` is called
after every push and `close()` at the end of the run.
"""

from __future__ import annotations

import threading
import time

from relayrl.errors import PlacementError
from relayrl.rewards import score_rollouts
from relayrl.schedules.buffer import Group, RolloutBuffer


class SyncSchedule:
    def __init__(self, trainer):
        self.trainer = trainer

    def batch(self, step: int, timer):
        return self.trainer.collect(step, timer)

    def published(self, version: int) -> None:
        pass

    def close(self) -> None:
        pass


class OneStepOff(SyncSchedule):
    def __init__(self, trainer):
        super().__init__(trainer)
        self.pending = None

    def _submit(self, step: int):
        t = self.trainer
        prompts = t.sampler.next(t.config.rollout.prompts_per_step)
        return t.engine.submit(prompts, t.sampling(step), t.sync.version)

    def batch(self, step: int, timer):
        t = self.trainer
        if self.pending is None:
            self.pending = self._submit(step)
        with timer("generate"):  # what is left of the generation that ran during the previous step
            rollouts = t.engine.finish(self.pending)
        self.pending = self._submit(step + 1) if step + 1 < t.config.train.steps else None
        with timer("reward"):
            scores, errors = score_rollouts(t.reward_fn, rollouts, t.config.reward.on_error)
        return rollouts, scores, {"reward/errors": float(errors)}

    def close(self) -> None:
        if self.pending is not None:  # drain, so no call is left running in an engine
            self.trainer.engine.finish(self.pending)
            self.pending = None


class AsyncSchedule(SyncSchedule):
    def __init__(self, trainer):
        super().__init__(trainer)
        cfg = trainer.config
        self.buffer = RolloutBuffer(cfg.rollout.prompts_per_step, cfg.train.max_staleness, cfg.train.on_stale,
                                    version=trainer.sync.version)
        replicas = len(trainer.engine.replicas)
        self.chunk = max(1, cfg.rollout.prompts_per_step // replicas)
        self.sampler_lock = threading.Lock()
        self.errors, self.failure = 0, None
        self.threads = [threading.Thread(target=self._produce, args=(i,), name=f"producer-{i}", daemon=True)
                        for i in range(replicas)]
        for thread in self.threads:
            thread.start()

    def _produce(self, replica: int) -> None:
        try:
            while self._produce_chunk(replica):
                pass
        except BaseException as err:  # surfaces in the training loop's next `batch`
            self.failure = err
            self.buffer.close()

    def _produce_chunk(self, replica: int) -> bool:
        t, n = self.trainer, self.trainer.config.rollout.n
        tickets = []
        for _ in range(self.chunk):
            ticket = self.buffer.admit()
            if ticket is None:
                return False
            tickets.append(ticket)
        with self.sampler_lock:
            prompts = t.sampler.next(len(tickets))
        version = self.buffer.version
        rollouts = t.engine.finish(t.engine.submit(prompts, t.sampling(tickets[0]), version, replicas=[replica]))
        scores, errors = score_rollouts(t.reward_fn, rollouts, t.config.reward.on_error)  # streaming: now
        self.errors += errors
        for i, ticket in enumerate(tickets):
            group = rollouts[i * n:(i + 1) * n]
            oldest = min((v for r in group for v in r.versions), default=version)
            self.buffer.put(Group(group, scores[i * n:(i + 1) * n], oldest, ticket))
        return True

    def batch(self, step: int, timer):
        t = self.trainer
        with timer("wait"):  # the learner idles here when the engines are behind
            try:
                groups = self.buffer.take(t.sync.version, t.config.placement.call_timeout_s)
            except PlacementError:
                if self.failure is not None:
                    raise self.failure from None
                raise
        rollouts = [r for g in groups for r in g.rollouts]
        scores = [s for g in groups for s in g.scores]
        errors, self.errors = self.errors, 0
        return rollouts, scores, {"reward/errors": float(errors), **self.buffer.metrics()}

    def published(self, version: int) -> None:
        self.buffer.advance(version)

    def close(self) -> None:
        self.buffer.close()
        deadline = time.monotonic() + self.trainer.config.placement.call_timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))


SCHEDULES = {"sync": SyncSchedule, "one_step_off": OneStepOff, "async": AsyncSchedule}
