"""The reward service under concurrent callers (the async schedule's producer threads share one service).

Every caller must get its own samples' scores back, whatever the other callers are doing; a sample that
hangs in one caller's batch must not hold up another caller. Real spawned workers, as in training.
"""

from __future__ import annotations

import threading
import time

import pytest

from relayrl.config import RewardConfig
from relayrl.rewards.service import build_reward_service
from relayrl.types import Prompt, Rollout

FNS = "tests.unit.reward_fns_for_service"


def rollouts(completions: list[str], prompt_id: str) -> list[Rollout]:
    prompt = Prompt(id=prompt_id, text="Q:", token_ids=[1], columns={})
    return [
        Rollout(
            prompt=prompt,
            group_index=i,
            response_ids=[3],
            response_text=c,
            behaviour_logprobs=[-0.5],
            finish_reason="stop",
            versions=[0],
        )
        for i, c in enumerate(completions)
    ]


def in_threads(callers: int, call) -> list[BaseException]:
    """Run `call(caller)` in that many threads started together; the exceptions they raised."""
    start, failures = threading.Barrier(callers), []

    def target(caller: int) -> None:
        start.wait()
        try:
            call(caller)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            failures.append(err)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a caller never returned"
    return failures


ENTERED = {"now": 0, "most": 0}


def not_thread_safe(prompts, completions, **columns):
    """Records how many calls are inside it at once (a reward holding a model or a judge engine)."""
    ENTERED["now"] += 1
    ENTERED["most"] = max(ENTERED["most"], ENTERED["now"])
    time.sleep(0.005)  # a window for another thread to enter
    ENTERED["now"] -= 1
    return [float(len(c)) for c in completions]


def test_in_process_rewards_are_called_one_at_a_time():
    service = build_reward_service(RewardConfig(fn=f"{__name__}:not_thread_safe"))
    wrong = []

    def call(caller: int) -> None:
        for round_index in range(10):
            completions = ["y" * (1 + 10 * caller + i) for i in range(3)]
            scores, _ = service.score(rollouts(completions, f"c{caller}"))
            if [s.reward for s in scores] != [float(len(c)) for c in completions]:
                wrong.append((caller, round_index))

    assert not in_threads(4, call) and not wrong
    assert ENTERED["most"] == 1  # user functions need not be thread-safe


@pytest.fixture(scope="module")
def length_service():
    """Scores each sample len(completion), in 2 workers, 2 samples per task."""
    service = build_reward_service(RewardConfig(fn=f"{FNS}:length", workers=2, batch_size=2, on_error="skip"))
    service.score(rollouts(["warm", "up"], "warm"))  # both workers imported
    yield service
    service.close()


def test_concurrent_callers_each_get_their_own_scores(length_service):
    wrong = []

    def call(caller: int) -> None:
        for round_index in range(12):
            # lengths unique to (caller, round, sample): a score that lands on another call's sample shows
            completions = ["x" * (1 + 100 * caller + 10 * (round_index % 10) + i) for i in range(5)]
            scores, metrics = length_service.score(rollouts(completions, f"c{caller}r{round_index}"))
            got = [None if s is None else s.reward for s in scores]
            if got != [float(len(c)) for c in completions] or metrics["reward/skipped"] != 0:
                wrong.append((caller, round_index, got))

    failures = in_threads(6, call)
    assert not failures, failures[:3]
    assert not wrong, wrong[:3]


def test_a_hanging_sample_holds_up_only_its_own_caller():
    config = RewardConfig(fn=f"{FNS}:hang_on_marker", workers=2, batch_size=1, timeout_s=6.0, on_error="zero")
    finished = []
    with build_reward_service(config) as service:
        service.score(rollouts(["warm", "up"], "warm"))

        def call(caller: int) -> None:
            completions = ["HANG", "ok"] if caller == 0 else ["a", "b", "c"]
            scores, metrics = service.score(rollouts(completions, f"c{caller}"))
            finished.append((caller, [s.reward for s in scores], metrics["reward/timeouts"]))

        assert not in_threads(2, call)
    # caller 1 is scored on the other worker while caller 0's sample runs into its deadline
    assert finished == [(1, [1.0, 1.0, 1.0], 0.0), (0, [0.0, 1.0], 1.0)]
