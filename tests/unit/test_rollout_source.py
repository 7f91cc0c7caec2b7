"""The seams the training loop holds, on a fake engine and reward service: a local engine is a one-replica
`EngineGroup` (relayrl/rollout/local_group.py), the sync schedule's DAPO collector runs its generation rounds
through the `RolloutSource`, and every schedule's batch carries DAPO's soft overlong punishment."""

import pytest
import torch

from relayrl.build import schedule_settings, source_settings
from relayrl.config import Config
from relayrl.data.source import PromptSampler
from relayrl.metrics.timer import StepTimer
from relayrl.rollout.local_group import LocalEngineGroup
from relayrl.schedules.modes import OneStepOff, SyncSchedule
from relayrl.sources.single_turn import SingleTurnSource
from relayrl.sync.inprocess import InProcessSync
from relayrl.types import Prompt, Rollout, Score


class FakeEngine:
    """Responses of 4 tokens; every call's seed is recorded."""

    def __init__(self):
        self.version, self.seeds, self.loaded = 0, [], []

    def generate(self, prompts, sampling, version):
        self.seeds.append(sampling.seed)
        return [
            Rollout(p, j, [7, 7, 7, 7], "7777", [-0.5] * 4, "stop", [version] * 4)
            for p in prompts
            for j in range(sampling.n)
        ]

    def load_weights(self, named_tensors, version):
        self.loaded.append((dict(named_tensors), version))
        self.version = version

    def prompt_logprobs(self, token_ids):
        return [0.0] * (len(token_ids) - 1)


class Rewards:
    """Flat groups on the first call (no signal), then group members scored 0, 1, 0, 1, ..."""

    def __init__(self):
        self.calls = 0

    def score(self, rollouts):
        self.calls += 1
        scores = [Score(float(self.calls > 1 and r.group_index % 2)) for r in rollouts]
        return scores, {"reward/errors": 1.0}


def source_and_config(**dapo):
    config = Config.model_validate(
        {
            "placement": {"mode": "ray"},  # a config that allows every schedule; nothing here starts Ray
            "rollout": {"prompts_per_step": 2, "n": 2, "max_tokens": 4},
            "algorithm": {"dapo": {"overlong_buffer": 2, **dapo}},
        }
    )
    prompts = [Prompt(f"p{i}", f"{i}+1=", [1, 2, 3]) for i in range(8)]
    engines = LocalEngineGroup(FakeEngine())
    source = SingleTurnSource(
        source_settings(config), engines, Rewards(), PromptSampler(prompts, 0, False), InProcessSync()
    )
    return source, config


def test_a_local_engine_is_a_one_replica_group():
    engine = FakeEngine()
    group = LocalEngineGroup(engine)
    prompts = [Prompt("a", "1+1=", [1, 2])]
    source, _ = source_and_config()
    sampling = source.sampling(step=0)
    assert group.replicas == [engine]
    assert group.finish(group.submit(prompts, sampling, 0, replicas=[0])) == group.generate(prompts, sampling, 0)
    with pytest.raises(ValueError, match="replica 0 only"):
        group.submit(prompts, sampling, 0, replicas=[1])
    assert group.take_spans() == [] and group.metrics() == {"time/engine_start": 0.0}

    class Learner:
        def named_weights(self):
            return iter([("w", torch.ones(3))])

    sync = InProcessSync()
    assert sync.push(Learner(), group) == 1
    assert engine.version == 1 and list(engine.loaded[0][0]) == ["w"] and sync.last["sync/bytes"] == 12.0


def test_dynamic_sampling_is_the_collector_chosen_at_construction():
    source, config = source_and_config(dynamic_sampling=True, max_rounds=3)
    schedule = SyncSchedule(source, schedule_settings(config))
    batch = schedule.batch(step=5, timer=StepTimer())
    assert batch.metrics["dynamic/rounds"] == 2.0  # the flat first round, then an informative one
    assert batch.metrics["reward/errors"] == 2.0  # counts add up over the rounds
    assert [s.reward for s in batch.scores] == [-1.0, 0.0, -1.0, 0.0]  # 0/1 minus the full overlong penalty
    seeds = source.engines.engine.seeds
    assert len(seeds) == 2 and seeds[1] == seeds[0] + 1  # each round draws its own samples
    assert source.engines.engine.seeds[0] == source.sampling(5).seed


def test_every_schedule_gives_its_batch_the_soft_overlong_penalty():
    source, config = source_and_config()
    schedule = OneStepOff(source, schedule_settings(config))
    batch = schedule.batch(step=0, timer=StepTimer())
    schedule.close()
    assert [s.components["overlong"] for s in batch.scores] == [-1.0] * 4  # 4 tokens = max_tokens, buffer 2
