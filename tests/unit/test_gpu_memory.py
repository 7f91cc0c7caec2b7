"""The engines' shares of a GPU (relayrl/rollout/memory.py): `rollout.gpu_memory_utilization: auto` resolved from the
placement and a judge beside the engine, the choice and its reason in the dump; shares that add up past 1, or past
what a GPU has free, refused naming both roles and the numbers before vLLM could fail on its own free-memory check."""

import pytest

from relayrl.build import resolve
from relayrl.config import dump_config, load_config
from relayrl.errors import ConfigError
from relayrl.rollout.memory import ALONE, COLOCATED, JUDGE_ROLE, ROLLOUT, GpuLedger, engine_share, resolve_engine_share

JUDGED = ("reward.fn=judge", "reward.kwargs={model: m}")


def resolved(model_dir, *overrides):
    return resolve(load_config(None, [f"model.path={model_dir}", *overrides]))


def test_auto_takes_most_of_a_gpu_alone_and_the_plans_share_beside_a_learner():
    assert resolve_engine_share(colocated=False, judge=None) == (ALONE, "the engine's GPU alone")
    assert resolve_engine_share(colocated=True, judge=None)[0] == COLOCATED == 0.5 and 0.85 <= ALONE <= 0.9
    share, why = resolve_engine_share(colocated=False, judge=0.3)
    assert share == pytest.approx(0.6) and "less the judge reward's 0.3" in why  # 0.6 + 0.3 <= 1
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization=0.95 leaves the rollout engine nothing"):
        resolve_engine_share(colocated=True, judge=0.95)


def test_a_local_run_resolves_auto_records_why_and_leaves_a_judge_its_share(random_model_dir):
    config = resolved(random_model_dir)
    assert (
        config.rollout.gpu_memory_utilization == COLOCATED
        and engine_share(config.rollout, config.placement, config.reward) == COLOCATED
    )
    assert "rollout.gpu_memory_utilization" in config._auto and "beside a learner rank" in dump_config(config)
    judged = resolved(random_model_dir, "reward.fn=judge", "reward.kwargs={model: m, gpu_memory_utilization: 0.5}")
    assert judged.rollout.gpu_memory_utilization == pytest.approx(0.4)  # 0.9 in all for the two engines
    fixed = resolved(random_model_dir, "rollout.gpu_memory_utilization=0.7")
    assert fixed.rollout.gpu_memory_utilization == 0.7 and "rollout.gpu_memory_utilization" not in fixed._auto


def test_explicit_shares_past_one_on_the_judges_gpu_are_refused_at_resolve(random_model_dir):
    with pytest.raises(ConfigError, match=r"rollout.gpu_memory_utilization=0.8 and the judge reward's reward.kwargs"):
        resolved(random_model_dir, "rollout.engine=vllm", "rollout.gpu_memory_utilization=0.8", *JUDGED)
    assert resolved(random_model_dir, "rollout.engine=hf", "rollout.gpu_memory_utilization=0.8", *JUDGED)  # no share


def test_a_judge_whose_share_does_not_fit_beside_the_engine_is_refused_naming_both():
    ledger = GpuLedger()
    ledger.claim(0, ROLLOUT, 0.9)
    with pytest.raises(ConfigError) as refused:
        ledger.claim(0, JUDGE_ROLE, 0.3)
    message = str(refused.value)
    assert "GPU 0: the judge reward's engine (reward.kwargs.gpu_memory_utilization) asks for 0.3" in message
    assert "beside the rollout engine (rollout.gpu_memory_utilization) at 0.9: the shares add up past 1" in message
    ledger.claim(1, JUDGE_ROLE, 0.3)  # another GPU: its own
    ledger.claim(0, ROLLOUT, 0.6)  # the same role again replaces its claim
    ledger.claim(0, JUDGE_ROLE, 0.3)
    assert ledger.shares == {0: {ROLLOUT: 0.6, JUDGE_ROLE: 0.3}, 1: {JUDGE_ROLE: 0.3}}


def test_a_share_larger_than_the_free_memory_is_refused_before_vllm_sees_it():
    gib = 2**30
    with pytest.raises(ConfigError, match=r"asks for 0.5 .*what else holds it .* at 0.6.*5.0 GiB asked, 4.0 GiB free"):
        GpuLedger().claim(0, JUDGE_ROLE, 0.5, free_bytes=4 * gib, total_bytes=10 * gib)
    GpuLedger().claim(0, JUDGE_ROLE, 0.4, free_bytes=4 * gib, total_bytes=10 * gib)


def test_a_reward_model_moved_onto_an_engines_gpu_is_refused_naming_the_engine():
    """What `claim_bytes` records for a reward model's weights on GPU 0 beside the rollout engine's 0.9."""
    from relayrl.rollout.memory import REWARD_MODEL_ROLE

    ledger, gib = GpuLedger(), 2**30
    ledger.claim(0, ROLLOUT, 0.9)
    with pytest.raises(ConfigError, match=r"the reward model \(reward.kwargs.device\) asks for 0.2 .* rollout engine"):
        ledger.claim(0, REWARD_MODEL_ROLE, 16 * gib / (80 * gib), free_bytes=8 * gib, total_bytes=80 * gib)


def test_a_share_outside_zero_to_one_is_refused_naming_the_key():
    with pytest.raises(
        ConfigError, match=r"rollout.gpu_memory_utilization=1.5: a share of the GPU in \(0, 1\], or auto"
    ):
        load_config(None, ["rollout.gpu_memory_utilization=1.5"])
