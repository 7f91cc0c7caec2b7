"""An async checkpoint loses no prompt: what the producers had drawn and not yet handed to the learner (being
generated, scored and buffered) is in the sampler state the checkpoint saves, and a resumed run trains exactly the
prompts the uninterrupted run trains (real HF engine on a tiny random model, in this process; no Ray)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from relayrl.build import schedule_settings, source_settings
from relayrl.config import Config
from relayrl.data.source import PromptSampler
from relayrl.metrics.timer import StepTimer
from relayrl.rewards.service import build_reward_service
from relayrl.rollout.build import build_engine
from relayrl.rollout.local_group import LocalEngineGroup
from relayrl.schedules.buffer import Group, RolloutBuffer
from relayrl.schedules.modes import AsyncSchedule, PartialState
from relayrl.sources.ledger import PromptLedger
from relayrl.sources.single_turn import SingleTurnSource
from relayrl.types import Prompt, Rollout

STEPS, GROUPS = 5, 2


def build(model_dir, sampler_state=None, version=0, **train):
    from relayrl.models.loading import load_tokenizer

    config = Config.model_validate(
        {
            "model": {"path": str(model_dir)},
            "placement": {"mode": "ray"},  # allows every schedule; nothing here starts Ray
            "rollout": {"n": 2, "prompts_per_step": GROUPS, "max_tokens": 2},
            "train": {"steps": STEPS, "schedule": "async", "on_stale": "wait", "max_staleness": 1, **train},
        }
    )
    tokenizer = load_tokenizer(str(model_dir))
    texts = [f"{a}+{b}=" for a in range(5) for b in range(3)]  # 15 prompts: the run wraps into a second epoch
    prompts = [Prompt(str(i), t, tokenizer(t)["input_ids"], columns={"answer": "0"}) for i, t in enumerate(texts)]
    engine = LocalEngineGroup(build_engine("hf", str(model_dir), max_model_len=32, seed=0))
    sampler = PromptSampler(prompts, seed=0, shuffle=True)
    if sampler_state is not None:
        sampler.load_state(sampler_state)
    sync = SimpleNamespace(version=version)
    source = SingleTurnSource(source_settings(config), engine, build_reward_service(config.reward), sampler, sync)
    return AsyncSchedule(source, schedule_settings(config)), sync


def train(schedule: AsyncSchedule, sync, steps: range) -> list[list[str]]:
    """The prompt ids trained at each step, publishing a new version after each as the loop does."""
    trained = []
    for step in steps:
        batch = schedule.batch(step, StepTimer())
        trained.append(sorted(r.prompt.id for r in batch.rollouts if r.group_index == 0))
        sync.version = step + 1
        schedule.published(step + 1)
    return trained


def wait_until(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def test_a_resumed_async_run_trains_the_prompts_in_flight_at_its_checkpoint(random_model_dir):
    straight, sync = build(random_model_dir)
    expected = train(straight, sync, range(STEPS))
    straight.close()

    killed, sync = build(random_model_dir)
    before = train(killed, sync, range(2))
    # the producers run ahead: by (2 + max_staleness + 1) * G tickets; wait until some are buffered
    wait_until(lambda: killed.buffer.metrics()["buffer/groups"] >= 1, "a group is buffered")
    saved = killed.sampler_state()  # the checkpoint of step 1
    assert saved.get("replay"), saved  # drawn, not trained: to be drawn again
    assert saved["replay"] == killed.ledger.open_rows()[: len(saved["replay"])]
    killed.close()

    resumed, sync = build(random_model_dir, sampler_state=saved, version=2)
    after = train(resumed, sync, range(2, STEPS))
    resumed.close()
    assert before + after == expected  # the same prompts at the same steps; none skipped, none twice


def test_the_ledger_settles_taken_dropped_and_discarded_groups_and_replays_the_rest_in_draw_order():
    prompts = [Prompt(str(i), f"p{i}", [i]) for i in range(6)]
    sampler = PromptSampler(prompts, seed=0, shuffle=False)
    ledger = PromptLedger()
    ledger.drawn(sampler.next_rows(5))
    assert ledger.open_rows() == [0, 1, 2, 3, 4]

    def group(i: int, oldest: int) -> Group:
        return Group([Rollout(prompts[i], 0, [1], "x", [0.0], "stop", [oldest])], [None], oldest)

    buffer = RolloutBuffer(2, max_staleness=0, on_stale="drop", on_drop=lambda gs: ledger.settle(_ids(gs)))
    buffer.put(group(1, oldest=0))
    buffer.advance(1)  # group 1 is now too stale: dropped, so settled
    ledger.settle(["0"])  # taken by the learner
    partial = PartialState()
    partial.start(prompts[3], 2, seed=None)
    partial.running[0].versions = [0]
    ledger.settle(partial.discard_older_than(1))  # carried unfinished, too old to train: discarded
    assert ledger.open_rows() == [2, 4]

    resumed = PromptSampler(prompts, seed=0, shuffle=False)
    resumed.load_state({**sampler.state(), "replay": ledger.open_rows()})
    assert [p.id for p in resumed.next(3)] == ["2", "4", "5"]  # the unsettled first, then the epoch goes on
    assert resumed.state() == {"epoch": 0, "position": 6, "prompts": 6}  # no replay left: the state reads as before


def test_a_prompt_drawn_in_two_epochs_is_settled_once_per_draw():
    prompts = [Prompt(str(i), f"p{i}", [i]) for i in range(2)]
    sampler = PromptSampler(prompts, seed=0, shuffle=False)
    ledger = PromptLedger()
    ledger.drawn(sampler.next_rows(3))  # 0, 1, then 0 again
    ledger.settle(["0"])
    assert ledger.open_rows() == [1, 0]


def _ids(groups):
    return [g.rollouts[0].prompt.id for g in groups]
