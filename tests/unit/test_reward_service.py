"""relayrl.rewards.service: weighted components, on_error policies, and worker processes with deadlines.

The worker tests start real worker processes (forked from the workers' server, which imports torch once); a
hanging reward must cost no more than its timeout.
"""

from __future__ import annotations

import time
import warnings

import pytest

from relayrl.config import RewardConfig, load_config
from relayrl.errors import ConfigError, RelayWarning, RewardError
from relayrl.rewards.service import InProcessRewards, WorkerRewards, build_reward_service
from relayrl.types import Prompt, Rollout, Score

FNS = "tests.unit.reward_fns_for_service"


def rollout(completion: str, index: int = 0, **columns) -> Rollout:
    prompt = Prompt(id="p", text="Q:", token_ids=[1], columns=columns)
    return Rollout(
        prompt=prompt,
        group_index=index,
        response_ids=[3],
        response_text=completion,
        behaviour_logprobs=[-0.5],
        finish_reason="stop",
        versions=[0],
    )


def batch(*completions: str, **columns) -> list[Rollout]:
    return [rollout(c, i, **columns) for i, c in enumerate(completions)]


# ---------------------------------------------------------------------------- config


def test_components_and_fn_are_exclusive():
    with pytest.raises(ConfigError, match="reward.components replaces reward.fn"):
        load_config(overrides=["reward.fn=math", "reward.components=[{fn: math}]"])


def test_component_names_must_be_distinct():
    with pytest.raises(ConfigError, match="the name 'math' is used twice"):
        load_config(overrides=["reward.components=[{fn: math}, {fn: math, weight: 2}]"])


def test_component_unknown_key_is_named():
    with pytest.raises(ConfigError, match="reward.components.0.wieght"):
        load_config(overrides=["reward.components=[{fn: math, wieght: 2}]"])


def test_timeout_without_workers_warns():
    with pytest.warns(UserWarning, match="no effect with reward.workers=0"):
        RewardConfig(timeout_s=3)


def test_single_fn_is_one_component():
    (component,) = RewardConfig(fn=f"{FNS}:length").resolved_components()
    assert component.label == "length" and component.weight == 1.0


# ---------------------------------------------------------------------------- in process


def test_default_is_in_process_and_unchanged():
    service = build_reward_service(RewardConfig())
    assert isinstance(service, InProcessRewards)
    scores, metrics = service.score(batch("4", "5", answer="4"))
    assert [s.reward for s in scores] == [1.0, 0.0]
    assert metrics == {"reward/errors": 0.0, "reward/timeouts": 0.0, "reward/skipped": 0.0, "reward/exact_match": 0.5}


def test_weighted_components_are_combined_and_logged():
    config = RewardConfig(
        components=[{"fn": f"{FNS}:length", "weight": 0.5}, {"fn": f"{FNS}:parts", "weight": 2.0, "name": "judged"}]
    )
    scores, metrics = build_reward_service(config).score(batch("ab", "abcd"))
    # 0.5 * len + 2 * (1.0 + 0.5)
    assert scores[0] == Score(4.0, {"length": 2.0, "judged": 1.5, "judged.correct": 1.0, "judged.format": 0.5})
    assert scores[1].reward == 5.0
    assert metrics["reward/length"] == 3.0 and metrics["reward/judged"] == 1.5


def test_a_single_weighted_component_keeps_its_weight():
    config = RewardConfig(components=[{"fn": f"{FNS}:parts", "weight": 0.5, "name": "judged"}])
    scores, metrics = build_reward_service(config).score(batch("ab"))
    assert scores[0] == Score(0.75, {"judged": 1.5, "judged.correct": 1.0, "judged.format": 0.5})
    assert metrics["reward/judged"] == 1.5  # the component's own mean, as with several components


def test_a_single_component_of_weight_one_keeps_its_score():
    scores, _ = build_reward_service(RewardConfig(components=[{"fn": f"{FNS}:parts"}])).score(batch("ab"))
    assert scores[0] == Score(1.5, {"correct": 1.0, "format": 0.5})


def test_the_parts_a_function_returns_are_logged_as_the_score_names_them():
    """They reached samples.jsonl (the Score's components) but not metrics.jsonl."""
    _, alone = build_reward_service(RewardConfig(fn=f"{FNS}:parts")).score(batch("ab", "cd"))
    assert alone["reward/correct"] == 1.0 and alone["reward/format"] == 0.5  # the Score is kept as is
    config = RewardConfig(components=[{"fn": f"{FNS}:length"}, {"fn": f"{FNS}:parts", "name": "judged"}])
    _, several = build_reward_service(config).score(batch("ab"))
    assert several["reward/judged.correct"] == 1.0 and several["reward/judged.format"] == 0.5
    assert "reward/correct" not in several and several["reward/judged"] == 1.5


def test_a_part_named_like_a_step_metric_keeps_its_component_name(tmp_path):
    (tmp_path / "stats.py").write_text("def stats(prompts, completions, **columns):\n    return [{'mean': 2.0}]\n")
    _, metrics = build_reward_service(RewardConfig(fn=f"{tmp_path / 'stats.py'}:stats")).score(batch("ab"))
    assert metrics["reward/stats.mean"] == 2.0 and "reward/mean" not in metrics  # the step's own reward/mean


@pytest.mark.parametrize("on_error, expected, skipped", [("zero", [1.0, 0.0, 0.0], 0), ("skip", [1.0, None, None], 2)])
def test_in_process_errors_follow_the_policy(on_error, expected, skipped):
    service = build_reward_service(RewardConfig(fn=f"{FNS}:hang_on_marker", on_error=on_error))
    scores, metrics = service.score(batch("ok", "RAISE", "NAN"))
    assert [None if s is None else s.reward for s in scores] == expected
    assert metrics["reward/errors"] == 2 and metrics["reward/skipped"] == skipped
    assert metrics["reward/hang_on_marker"] == pytest.approx(
        sum(v for v in expected if v is not None) / sum(v is not None for v in expected)
    )


def test_a_reward_failing_on_every_sample_stops_instead_of_training_on_zeros():
    service = build_reward_service(RewardConfig(fn=f"{FNS}:hang_on_marker", on_error="zero"))
    with pytest.raises(
        RewardError,
        match=r"reward 'hang_on_marker' \(tests.unit.reward_fns_for_service:hang_on_marker\) "
        r"failed on 3 of 3 samples .*\(3 errors, 0 timeouts; first: sample p#0 raised ValueError: boom\).*max_error_frac=1",
    ):
        service.score(batch("RAISE", "NAN", "RAISE"))


@pytest.mark.parametrize("workers", [0, 1])
def test_a_raising_trl_style_reward_is_an_error_not_a_does_not_apply_zero(workers):
    config = RewardConfig(fn=f"{FNS}:trl_raise_on_marker", on_error="zero", workers=workers, max_error_frac=0.9)
    with build_reward_service(config) as service:
        scores, metrics = service.score(batch("ok", "RAISE", "SKIP"))
    assert [s.reward for s in scores] == [1.0, 0.0, 0.0]
    assert metrics["reward/errors"] == 1  # the raise; SKIP's None is TRL's "does not apply", not an error
    assert [s.error for s in scores] == [None, "sample p#1 raised ValueError: boom in a TRL-style reward", None]


def test_the_stop_line_says_what_the_first_failure_raised():
    service = build_reward_service(RewardConfig(fn=f"{FNS}:trl_raise_on_marker", on_error="zero"))
    with pytest.raises(RewardError, match=r"first: sample p#0 raised ValueError: boom in a TRL-style reward"):
        service.score(batch("RAISE", "RAISE"))
    service = build_reward_service(RewardConfig(fn=f"{FNS}:hang_on_marker", on_error="skip"))
    with pytest.raises(RewardError, match=r"3 errors, 0 timeouts; first: sample p#0 is nan"):
        service.score(batch("NAN", "RAISE", "RAISE"))


def test_failing_on_most_samples_warns_once():
    service = build_reward_service(RewardConfig(fn=f"{FNS}:hang_on_marker", on_error="skip"))
    with pytest.warns(RelayWarning, match=r"failed on 2 of 3 samples.*dropped \(reward.on_error=skip\)"):
        service.score(batch("RAISE", "ok", "NAN"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        service.score(batch("RAISE", "ok", "NAN"))  # once per service: no second warning


def test_max_error_frac_sets_the_share_that_stops():
    config = RewardConfig(fn=f"{FNS}:hang_on_marker", on_error="zero", max_error_frac=0.5)
    service = build_reward_service(config)
    assert [s.reward for s in service.score(batch("ok", "ok", "RAISE"))[0]] == [1.0, 1.0, 0.0]  # 1 of 3 passes
    with pytest.raises(RewardError, match="failed on 2 of 4 samples"):
        service.score(batch("ok", "RAISE", "ok", "NAN"))
    with pytest.raises(ConfigError, match="reward.max_error_frac"):
        load_config(overrides=["reward.max_error_frac=1.5"])


def test_in_process_error_names_the_sample():
    service = build_reward_service(RewardConfig(fn=f"{FNS}:hang_on_marker"))
    with pytest.raises(RewardError, match="sample p#1"):
        service.score(batch("ok", "RAISE"))


def test_bad_spec_fails_at_construction():
    with pytest.raises(RewardError, match="has no function 'nope'"):
        build_reward_service(RewardConfig(fn=f"{FNS}:nope"))


# ---------------------------------------------------------------------------- workers


@pytest.fixture(scope="module")
def skip_workers():
    config = RewardConfig(fn=f"{FNS}:hang_on_marker", workers=2, timeout_s=1.0, batch_size=2, on_error="skip")
    service = build_reward_service(config)
    service.score(batch("warm", "up"))  # wait for both workers to import
    yield service
    service.close()


def test_workers_score_like_in_process(skip_workers):
    assert isinstance(skip_workers, WorkerRewards)
    scores, metrics = skip_workers.score(batch("a", "b", "c", "d", "e"))
    assert [s.reward for s in scores] == [1.0] * 5 and metrics["reward/skipped"] == 0


def test_a_hanging_sample_costs_its_timeout_and_is_skipped(skip_workers):
    start = time.monotonic()
    scores, metrics = skip_workers.score(batch("a", "HANG", "c", "d"))
    elapsed = time.monotonic() - start
    # the batch [a, HANG] times out (2 s for 2 samples), then HANG alone (1 s); c, d score meanwhile
    assert elapsed < 2.0 + 1.0 + 1.5, f"scoring stalled {elapsed:.1f} s"
    assert [None if s is None else s.reward for s in scores] == [1.0, None, 1.0, 1.0]
    assert metrics["reward/timeouts"] == 1 and metrics["reward/skipped"] == 1
    scores, _ = skip_workers.score(batch("after", "the", "kill"))  # the replacement worker serves
    assert [s.reward for s in scores] == [1.0, 1.0, 1.0]


def test_errors_in_workers_follow_the_policy(skip_workers):
    scores, metrics = skip_workers.score(batch("RAISE", "ok", "NAN"))
    assert [None if s is None else s.reward for s in scores] == [None, 1.0, None]
    assert metrics["reward/errors"] == 2 and metrics["reward/timeouts"] == 0


def test_timeout_with_on_error_zero_and_error():
    config = RewardConfig(fn=f"{FNS}:hang_on_marker", workers=1, timeout_s=1.0, batch_size=1, on_error="zero")
    with build_reward_service(config) as service:
        service.score(batch("warm"))
        scores, metrics = service.score(batch("HANG", "ok"))
        assert [s.reward for s in scores] == [0.0, 1.0] and metrics["reward/timeouts"] == 1
        service.on_error = "error"
        start = time.monotonic()
        with pytest.raises(RewardError, match=r"reward 'hang_on_marker' on sample p#0: timed out after 1 s"):
            service.score(batch("HANG"))
        assert time.monotonic() - start < 2.5
        assert [s.reward for s in service.score(batch("ok"))[0]] == [1.0]  # still serving after the error


def test_a_worker_carries_on_through_a_stop_signal_sent_to_the_whole_group():
    import os
    import signal

    config = RewardConfig(fn=f"{FNS}:length", workers=1)
    with build_reward_service(config) as service:
        service.score(batch("warm"))
        (worker,) = service.dispatcher.pool.workers
        os.kill(worker.process.pid, signal.SIGTERM)  # as `timeout` or a scheduler sends it to the group
        os.kill(worker.process.pid, signal.SIGINT)
        scores, metrics = service.score(batch("abc"))
        assert scores[0].reward == 3.0 and metrics["reward/errors"] == 0
        assert service.dispatcher.pool.workers == [worker] and worker.process.is_alive()


def test_a_dying_worker_is_replaced_and_counted():
    config = RewardConfig(fn=f"{FNS}:die_on_marker", workers=1, batch_size=4, on_error="zero")
    with build_reward_service(config) as service:
        scores, metrics = service.score(batch("ok", "DIE", "ok"))
        assert [s.reward for s in scores] == [1.0, 0.0, 1.0] and metrics["reward/errors"] == 1


def test_workers_dying_on_every_sample_stop_the_call():
    config = RewardConfig(fn=f"{FNS}:die_on_marker", workers=1, batch_size=4, on_error="zero")
    with (
        build_reward_service(config) as service,
        pytest.raises(
            RewardError,
            match=r"failed on 2 of 2 samples .*\(2 errors, 0 timeouts; first: sample p#0: reward worker "
            r"died \(exit code 3\)\)",
        ),
    ):
        service.score(batch("DIE", "DIE"))


def test_setup_mistakes_in_workers_raise_as_is():
    config = RewardConfig(fn=f"{FNS}:needs_column", workers=1, on_error="skip")
    with build_reward_service(config) as service, pytest.raises(RewardError, match="needs an 'answer' column"):
        service.score(batch("x"))


def test_a_spec_that_cannot_load_in_the_worker_is_named():
    with (
        pytest.raises(RewardError, match="could not load the reward functions.*has no function 'nope'"),
        build_reward_service(RewardConfig(fn=f"{FNS}:nope", workers=1)) as service,
    ):
        service.score(batch("x"))
