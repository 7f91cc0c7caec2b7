"""A one_step_off checkpoint loses no prompts: the batch in flight when the checkpoint is written was not trained,
so the sampler state it saves is the one before that batch was drawn, and a resumed run draws those prompts
again (real HF engine on a tiny random model, in this process; no Ray)."""

from __future__ import annotations

from types import SimpleNamespace

from relayrl.build import schedule_settings, source_settings
from relayrl.config import Config
from relayrl.data.source import PromptSampler
from relayrl.metrics.timer import StepTimer
from relayrl.rewards.service import build_reward_service
from relayrl.rollout.build import build_engine
from relayrl.rollout.local_group import LocalEngineGroup
from relayrl.schedules.modes import OneStepOff, SyncSchedule
from relayrl.sources.single_turn import SingleTurnSource
from relayrl.types import Prompt


def build(model_dir, schedule: str):
    from relayrl.models.loading import load_tokenizer

    config = Config.model_validate(
        {
            "model": {"path": str(model_dir)},
            "placement": {"mode": "ray"},  # allows every schedule; nothing here starts Ray
            "rollout": {"n": 2, "prompts_per_step": 2, "max_tokens": 2},
            "train": {"steps": 4, "schedule": schedule},
        }
    )
    tokenizer = load_tokenizer(str(model_dir))
    texts = [f"{a}+{b}=" for a in range(4) for b in range(2)]
    prompts = [Prompt(str(i), t, tokenizer(t)["input_ids"], columns={"answer": "0"}) for i, t in enumerate(texts)]
    engine = LocalEngineGroup(build_engine("hf", str(model_dir), max_model_len=32, seed=0))
    sampler = PromptSampler(prompts, seed=0, shuffle=True)
    source = SingleTurnSource(
        source_settings(config), engine, build_reward_service(config.reward), sampler, SimpleNamespace(version=0)
    )
    return source, config


def trained_prompts(batch) -> list[str]:
    return sorted({r.prompt.id for r in batch.rollouts})


def test_a_one_step_off_checkpoint_saves_the_sampler_before_the_batch_in_flight(random_model_dir):
    source, config = build(random_model_dir, "one_step_off")
    schedule = OneStepOff(source, schedule_settings(config))
    first = schedule.batch(0, StepTimer())  # step 1's batch is drawn and in flight now
    saved = schedule.sampler_state()
    assert saved != source.sampler_state()  # the live sampler is past the batch in flight
    in_flight = trained_prompts(schedule.batch(1, StepTimer()))  # what the uninterrupted run trains at step 1
    schedule.close()

    resumed_source, _ = build(random_model_dir, "one_step_off")
    resumed_source.draws.sampler.load_state(saved)  # a run resumed from the checkpoint of step 0
    resumed = OneStepOff(resumed_source, schedule_settings(config))
    assert trained_prompts(resumed.batch(1, StepTimer())) == in_flight  # nothing skipped
    assert set(trained_prompts(first)).isdisjoint(in_flight)
    resumed.close()


def test_after_the_last_step_and_under_sync_the_sampler_state_is_the_live_one(random_model_dir):
    source, config = build(random_model_dir, "sync")
    schedule = SyncSchedule(source, schedule_settings(config))
    schedule.batch(0, StepTimer())
    assert schedule.sampler_state() == source.sampler_state()
    source, config = build(random_model_dir, "one_step_off")
    last = OneStepOff(source, schedule_settings(config))
    last.batch(config.train.steps - 1, StepTimer())  # nothing is submitted after the last step
    assert last.pending is None and last.sampler_state() == source.sampler_state()
