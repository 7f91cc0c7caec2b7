"""Multi-turn under the overlapped schedules, on an engine that answers the `retry` environment wrong then right
(real environment workers, no Ray): one_step_off runs the next step's trajectories while the learner trains,
async producers run theirs into the buffer, and a weight push that lands between two turns shows in the
trajectory's tokens (first turn version 0, second version 1). Also: the env settings refused or checked at
start (partial rollouts, a trajectory longer than the model's context), and how groups of several sizes fill
the async buffer's tickets."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from relayrl.build import schedule_settings, source_settings
from relayrl.config import Config
from relayrl.data.source import PromptSampler
from relayrl.errors import ConfigError
from relayrl.metrics.timer import StepTimer
from relayrl.rollout.local_group import LocalEngineGroup
from relayrl.schedules.modes import AsyncSchedule, OneStepOff, split_groups
from relayrl.sources.context import context_budget
from relayrl.sources.multi_turn import MultiTurnSource, check_env
from relayrl.types import Prompt, Rollout


class RetryEngine:
    """Answers 9 on a first turn and 5 (right) after the feedback, tagging tokens with the version it holds when it
    runs the call, as a Ray engine actor does. The second turns of the batch seeded `hold_seed` wait for the
    weights of version 1 (`holding` says one is waiting), so a push lands mid-trajectory."""

    def __init__(self, tokenizer):
        self.tokenizer, self.version, self.hold_seed = tokenizer, 0, None
        self.pushed, self.holding = threading.Event(), threading.Event()

    def generate(self, prompts, sampling, version):
        out = []
        for p in prompts:
            second = self.tokenizer.decode(p.token_ids, skip_special_tokens=True).count("=") > 1
            if second and sampling.seed == self.hold_seed:
                self.holding.set()
                assert self.pushed.wait(60), "the test never pushed"
            ids = self.tokenizer("5" if second else "9", add_special_tokens=False)["input_ids"]
            ids += [self.tokenizer.eos_token_id]
            out.append(Rollout(p, 0, ids, "", [-0.1] * len(ids), "stop", [self.version] * len(ids)))
        return out

    def load_weights(self, named_tensors, version):
        self.version = version
        self.pushed.set()


def build(model_dir, **train):
    config = Config.model_validate(
        {
            "model": {"path": str(model_dir)},
            "placement": {"mode": "ray"},  # allows every schedule; nothing here starts Ray
            "env": {"fn": "retry", "kwargs": {"feedback": " 1+1="}, "max_turns": 2, "max_inflight": 4},
            "rollout": {"n": 2, "prompts_per_step": 2, "max_tokens": 4},
            "train": {"steps": 2, **train},
        }
    )
    from relayrl.models.loading import load_tokenizer

    tokenizer = load_tokenizer(str(model_dir))
    prompts = [
        Prompt(str(i), t, tokenizer(t)["input_ids"], columns={"answer": "5"})
        for i, t in enumerate(["2+3=", "1+4=", "0+5=", "4+1=", "3+2=", "5+0="])
    ]
    engine = RetryEngine(tokenizer)
    sync = SimpleNamespace(version=0)
    source = MultiTurnSource(
        source_settings(config), LocalEngineGroup(engine), None, PromptSampler(prompts, 0, False), sync
    )
    return source, config, engine, sync


def push(engine, sync, schedule) -> None:
    """What the loop does after an update: new weights on the engine, then the schedule told."""
    assert engine.holding.wait(60), "no trajectory reached its second turn"
    engine.load_weights(None, 1)
    sync.version = 1
    schedule.published(1)


def turns(rollout: Rollout) -> list[list[int]]:
    """The versions of each generated turn's tokens (runs of loss-mask-1 tokens)."""
    runs, previous = [], 0
    for mask, version in zip(rollout.loss_mask, rollout.versions):
        if mask and not previous:
            runs.append([])
        if mask:
            runs[-1].append(version)
        previous = mask
    return runs


def check_spans_the_push(batch) -> None:
    assert len(batch.rollouts) == 4 and batch.metrics["env/turns_mean"] == 2
    per_trajectory = [turns(r) for r in batch.rollouts]
    assert all(len(t) == 2 and set(t[1]) == {1} and len(set(t[0])) == 1 for t in per_trajectory)
    assert [0] * len(per_trajectory[0][0]) in [t[0] for t in per_trajectory]  # at least one spans versions 0 -> 1
    for rollout, score in zip(batch.rollouts, batch.scores):
        assert score.reward == 1.0  # found on the second attempt
        assert [reward for _, reward in rollout.turn_rewards] == [0.0, 1.0]
        for index, _ in rollout.turn_rewards:  # on each turn's last generated token
            assert rollout.loss_mask[index] == 1 and (
                index + 1 == len(rollout.loss_mask) or not rollout.loss_mask[index + 1]
            )


def test_one_step_off_runs_the_next_trajectories_while_training_and_a_push_lands_between_turns(random_model_dir):
    source, config, engine, sync = build(random_model_dir, schedule="one_step_off")
    engine.hold_seed = source.sampling(1).seed  # step 1's trajectories wait at their second turn for the push
    schedule = OneStepOff(source, schedule_settings(config))
    try:
        first = schedule.batch(0, StepTimer())
        assert all(set(r.versions) == {0} for r in first.rollouts)
        assert not schedule.pending.done()  # step 1's trajectories run meanwhile
        push(engine, sync, schedule)  # the update of step 0 is done: weights of version 1
        check_spans_the_push(schedule.batch(1, StepTimer()))
        assert schedule.pending is None
    finally:
        schedule.close()
        source.close()


def test_async_producers_run_trajectories_and_the_buffer_bounds_them_by_their_oldest_token(random_model_dir):
    source, config, engine, sync = build(random_model_dir, schedule="async", max_staleness=1, on_stale="wait")
    engine.hold_seed = source.sampling(2).seed  # the second chunk (tickets 2, 3) waits for the push
    schedule = AsyncSchedule(source, schedule_settings(config))
    try:
        first = schedule.batch(0, StepTimer())
        assert all(set(r.versions) == {0} for r in first.rollouts)
        push(engine, sync, schedule)
        second = schedule.batch(1, StepTimer())
        check_spans_the_push(second)
        assert second.metrics["buffer/dropped"] == 0 and second.metrics["env/success"] == 1.0
    finally:
        schedule.close()
        source.close()


def test_env_settings_checked_at_start(random_model_dir):
    base = {"model": {"path": str(random_model_dir)}, "env": {"fn": "retry", "max_total_tokens": 250}}

    def budget(config: Config, longest: int) -> int:
        check_env(source_settings(config), config.train.partial_rollouts)
        return context_budget(longest, config.rollout, config.env, config.model.path, config.data.max_prompt_tokens)

    assert budget(Config.model_validate(base), 6) == 256  # 256 positions hold 6 + 250
    with pytest.raises(ConfigError) as error:
        budget(Config.model_validate({**base, "data": {"max_prompt_tokens": 16}}), 7)
    assert "env.max_total_tokens=250" in str(error.value) and "data.max_prompt_tokens=16" in str(error.value)
    assert "257 tokens, over the model's context of 256" in str(error.value)
    partial = {**base, "placement": {"mode": "ray"}}
    partial["train"] = {"schedule": "async", "on_stale": "drop", "partial_rollouts": 1.5}
    with pytest.raises(ConfigError, match="train.partial_rollouts"):
        invalid = Config.model_validate(partial)
        check_env(source_settings(invalid), invalid.train.partial_rollouts)


def test_groups_of_several_sizes_fill_the_tickets_in_order():
    prompt = Prompt("p", "", [1])
    rollouts = [Rollout(prompt, i, [1], "", [0.0], "stop", [0]) for i in (0, 1, 0, 0, 1, 2)]
    groups = split_groups(rollouts, list(range(6)))
    assert [scores for _, scores in groups] == [[0, 1], [2], [3, 4, 5]]


class RightFirst(RetryEngine):
    """Answers 5 (right) on the first turn: its trajectories take one turn."""

    def generate(self, prompts, sampling, version):
        out = []
        for p in prompts:
            ids = self.tokenizer("5", add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            out.append(Rollout(p, 0, ids, "", [-0.1] * len(ids), "stop", [self.version] * len(ids)))
        return out


class TwoReplicas(LocalEngineGroup):
    """Replica 0 answers wrong first (two turns a trajectory), replica 1 right first (one)."""

    def __init__(self, tokenizer):
        super().__init__(RetryEngine(tokenizer))
        self.replicas = [self.engine, RightFirst(tokenizer)]

    def submit(self, prompts, sampling, version, replicas=None):
        return self.replicas[(replicas or [0])[0]].generate(prompts, sampling, version)


def test_async_env_metrics_are_the_mean_over_the_replicas_chunks_not_the_last_chunks(random_model_dir):
    """Each producer (one per replica) scores its own chunk; the batch's env/* used to be the last chunk's."""
    source, config, _, sync = build(random_model_dir, schedule="async", max_staleness=1, on_stale="wait")
    from relayrl.models.loading import load_tokenizer

    source.engines = TwoReplicas(load_tokenizer(str(random_model_dir)))
    schedule = AsyncSchedule(source, schedule_settings(config))
    try:
        metrics = schedule.batch(0, StepTimer()).metrics
    finally:
        schedule.close()
        source.close()
    # a chunk of each replica at least (the batch takes one group of each); a producer may have scored one more
    assert 1 < metrics["env/turns_mean"] < 2 and metrics["env/trajectories"] >= 4
    assert metrics["env/turns_max"] == 2 and metrics["env/success"] == 1.0
