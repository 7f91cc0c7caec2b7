"""Colocated time-sharing (relayrl/placement/time_sharing.py, relayrl/rollout/sleep.py): the order of the engine's
sleep and wake and the learner's offload around a step, checked on CPU against the engine and learner protocols
(the memory they free is measured on a GPU by benchmarks/gpu_check.sh), and `rollout.sleep: auto`'s choices."""

from __future__ import annotations

import pytest

import relayrl.controller as controller
from relayrl.build import choose_time_sharing, loop_settings
from relayrl.config import load_config
from relayrl.config.root import Config
from relayrl.errors import ConfigError
from relayrl.learner.result import UpdateResult
from relayrl.metrics.timer import StepTimer
from relayrl.placement.time_sharing import TimeSharing
from relayrl.sources.base import Batch


class Recorder:
    """Stands in for every role: each call is appended to one log."""

    def __init__(self, log: list, name: str):
        self.log, self.name = log, name
        self.version, self.last = 0, {}

    def sleep(self, level):
        self.log.append(f"engine sleeps (level {level})")

    def wake_up(self, tags=None):
        self.log.append(f"engine wakes {tags}")

    def offload_states(self):
        self.log.append("learner offloads")

    def reload_states(self):
        self.log.append("learner reloads")

    def prepare(self, exp):
        self.log.append("log-probs")
        return exp

    def update(self, step, exp, sample_rows=0):
        self.log.append("update")
        return UpdateResult({})

    def push(self, learner, engines, version=None):
        self.log.append("push")
        self.version += 1
        return self.version

    def batch(self, step, timer):
        self.log.append("generate")
        return Batch([], [])

    def published(self, version):
        pass

    def metrics(self):
        return {}


def stand_in_trainer(log: list[str], engines: Recorder, learner: Recorder, **extra) -> controller.Trainer:
    """The step's Trainer over recording stand-ins (every role call appends to `log`), with `extra` fields."""
    return controller.Trainer(
        loop=loop_settings(Config()),
        engines=engines,  # pyright: ignore[reportArgumentType]
        learner=learner,  # pyright: ignore[reportArgumentType]
        sync=Recorder(log, "sync"),  # pyright: ignore[reportArgumentType]
        source=None,  # pyright: ignore[reportArgumentType]
        sampler=None,  # pyright: ignore[reportArgumentType]
        make_schedule=lambda: None,  # pyright: ignore[reportArgumentType]
        advantages=lambda exp, rollouts: exp,
        eval_prompts=[],
        tokenizer=None,
        run_dir=None,  # pyright: ignore[reportArgumentType]
        data_metrics={},
        pad_id=0,
        **extra,
    )


def test_a_colocated_step_pushes_before_the_learner_offloads(monkeypatch):
    log: list[str] = []
    engines, learner = Recorder(log, "engines"), Recorder(log, "learner")
    monkeypatch.setattr(controller, "make_experience", lambda rollouts, scores, pad: "exp")
    monkeypatch.setattr(controller, "step_metrics", lambda *args: {})
    trainer = stand_in_trainer(
        log, engines, learner, time_sharing=TimeSharing(engines, learner, sleep_level=2, offload=True)
    )
    trainer.schedule = Recorder(log, "schedule")  # pyright: ignore[reportAttributeAccessIssue]
    monkeypatch.setattr(trainer, "record", lambda *args: None)
    trainer.time_sharing.start()
    trainer.step(0)
    assert log == [
        "learner offloads",  # before the first generate: the engine has the device
        "generate",
        "engine sleeps (level 2)",
        "learner reloads",
        "log-probs",
        "update",
        "engine wakes ['weights']",
        "push",  # into the woken weights, read from the learner's device (verl's order: no host round trip)
        "learner offloads",  # only once the push is in
        "engine wakes ['kv_cache']",  # into the room the learner's states left
    ]


def test_time_sharing_off_calls_nothing_and_times_nothing():
    timer = StepTimer()
    off = TimeSharing.off()
    off.start()
    off.before_update(timer), off.before_push(timer), off.after_push(timer)
    assert timer.seconds == {} and not off.on


def test_the_swaps_are_timed_as_their_own_phase():
    log: list[str] = []
    timer = StepTimer()
    sharing = TimeSharing(Recorder(log, "e"), Recorder(log, "l"), sleep_level=1, offload=False)
    sharing.before_update(timer), sharing.before_push(timer), sharing.after_push(timer)
    assert set(timer.seconds) == {"swap"} and log == [
        "engine sleeps (level 1)",
        "engine wakes ['weights']",
        "engine wakes ['kv_cache']",
    ]


def _resolved(*overrides, gpu=True) -> Config:
    config = Config.model_validate({})
    for override in overrides:
        key, value = override.split("=")
        section, name = key.split(".")
        setattr(getattr(config, section), name, int(value) if value.isdigit() else value)
    choose_time_sharing(config, cuda=lambda: gpu)
    return config


@pytest.mark.parametrize(
    ("overrides", "gpu", "sleep", "offload"),
    [
        ((), True, 2, "between_phases"),  # local = colocated, on a GPU, sync
        (("placement.mode=ray", "placement.layout=colocated"), True, 2, "between_phases"),
        (("placement.mode=ray", "placement.layout=disaggregated"), True, "off", "none"),
        (("placement.mode=ray", "train.schedule=async"), True, "off", "none"),
        ((), False, "off", "none"),  # CPU: no sleep mode
    ],
)
def test_rollout_sleep_auto_is_on_only_for_colocated_gpu_sync_runs(overrides, gpu, sleep, offload):
    config = _resolved(*overrides, gpu=gpu)
    assert (config.rollout.sleep, config.learner.offload) == (sleep, offload)
    assert "rollout.sleep" in config._auto  # the dump says auto and why


def test_sleep_levels_that_cannot_take_effect_are_refused_by_name():
    with pytest.raises(ConfigError, match=r"rollout.sleep=2 needs a GPU: vLLM's CPU platform has no sleep mode"):
        _resolved("rollout.sleep=2", gpu=False)
    with pytest.raises(ConfigError, match=r"rollout.sleep=1 frees the engine between phases, but train.schedule="):
        _resolved("placement.mode=ray", "train.schedule=one_step_off", "rollout.sleep=1")
    with pytest.raises(ConfigError, match=r"placement.layout=disaggregated gives the engines devices"):
        _resolved("placement.mode=ray", "placement.layout=disaggregated", "rollout.sleep=1")


def test_sharded_ranks_offload_between_phases_when_set():
    """auto keeps a sharded rank's 1/W share on its GPU; between_phases set moves it (relayrl/learner/offload.py)."""
    ranks = ("placement.mode=ray", "placement.layout=colocated", "placement.learner_ranks=2")
    assert _resolved(*ranks).learner.offload == "none"
    assert _resolved(*ranks, "learner.offload=between_phases").learner.offload == "between_phases"


def test_the_dump_keeps_auto_with_its_choice_and_reason():
    from relayrl.build import resolve
    from relayrl.config import dump_config

    text = dump_config(resolve(load_config(None, [])))  # this CPU machine
    assert "  sleep: auto  # auto chose off: no GPU here (vLLM's CPU platform has no sleep mode)" in text
    assert "  offload: auto  # auto chose none: rollout.sleep is off" in text
    assert load_config(None, ["rollout.sleep=off"]).rollout.sleep == "off"


@pytest.mark.parametrize(
    "phases,woken",
    [
        ([], []),  # never put to sleep
        (["before_update"], ["engine wakes ['weights', 'kv_cache']"]),  # a learner failed during its update
        (["before_update", "before_push"], ["engine wakes ['kv_cache']"]),  # ... during the push
        (["before_update", "before_push", "after_push"], []),  # the step ended: awake
    ],
)
def test_wake_wakes_whatever_of_the_engine_still_sleeps(phases, woken):
    """A learner restart (Trainer.heal) pushes weights and generates again wherever the step stopped."""
    log: list[str] = []
    sharing = TimeSharing(Recorder(log, "engine"), Recorder(log, "learner"), 1, offload=False)
    for phase in phases:
        getattr(sharing, phase)(StepTimer())
    del log[:]
    sharing.wake()
    sharing.wake()  # once only
    assert log == woken
