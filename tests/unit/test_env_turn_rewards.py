"""Per-turn rewards for the token-level estimators, worked out by hand on one 2-turn trajectory (gamma 0.5, so
where a reward sits changes every advantage): each turn's reward on its own last generated token, the rest of
the sample's reward (a reward.fn's part) on the last token, observation tokens passed through. Also which
turn adapter an engine group's declared capability picks."""

from __future__ import annotations

import functools

import pytest
import torch

from relayrl.algorithms.advantages import ADVANTAGES
from relayrl.algorithms.stage import estimate_advantages
from relayrl.build import source_settings
from relayrl.learner.batching import make_experience
from relayrl.types import Prompt, Rollout, Score

# prompt [1, 2]; response: turn 1 (2 tokens), observation (2), turn 2 (2); turn rewards 1 and 2, reward.fn 0.5
TRAJECTORY = Rollout(
    prompt=Prompt("p", "", [1, 2]),
    group_index=0,
    response_ids=[3, 4, 5, 6, 7, 8],
    response_text="",
    behaviour_logprobs=[0.0] * 6,
    finish_reason="stop",
    versions=[0] * 6,
    loss_mask=[1, 1, 0, 0, 1, 1],
    turn_rewards=[(1, 1.0), (5, 2.0)],
)


def advantages(per_turn: bool, values: list[float], lam: float = 1.0) -> torch.Tensor:
    """gae(gamma=0.5) advantages of TRAJECTORY's response tokens, scored 3.5 (turns 1 + 2, reward.fn 0.5)."""
    exp = make_experience([TRAJECTORY], [Score(3.5)], pad_id=0)
    exp.values = torch.tensor([[0.0] + values])  # target columns: the response starts at column 1
    gae = functools.partial(ADVANTAGES["gae"], gamma=0.5, lam=lam)
    exp = estimate_advantages(gae, False, exp, [TRAJECTORY], per_turn=per_turn)
    return exp.advantages[0, 1:]


def test_each_turn_reward_sits_on_its_turns_last_token():
    # token rewards [0, 1, -, -, 0, 2 + 0.5]; returns-to-go over trained tokens with gamma 0.5
    expected = torch.tensor([0.8125, 1.625, 0.0, 0.0, 1.25, 2.5])
    assert torch.allclose(advantages(True, [0.0] * 6), expected)
    at_the_end = torch.tensor([0.4375, 0.875, 0.0, 0.0, 1.75, 3.5])  # the whole 3.5 on the last token
    assert torch.allclose(advantages(False, [0.0] * 6), at_the_end)


def test_gae_bootstraps_across_the_observation_from_the_next_trained_token():
    # lam 0: A_t = r_t + 0.5 V(next trained token) - V_t; after turn 1 the next trained token is b1 (V 0.3)
    values = [0.5, 0.4, 9.0, 9.0, 0.3, 0.2]
    expected = torch.tensor([0.5 * 0.4 - 0.5, 1.0 + 0.5 * 0.3 - 0.4, 0.0, 0.0, 0.5 * 0.2 - 0.3, 2.5 - 0.2])
    assert torch.allclose(advantages(True, values, lam=0.0), expected)


def test_reinforce_pp_places_the_turn_rewards_too():
    exp = make_experience([TRAJECTORY, TRAJECTORY], [Score(3.5), Score(3.5)], pad_id=0)
    estimator = functools.partial(ADVANTAGES["reinforce_pp"], gamma=0.5)
    placed = estimate_advantages(estimator, False, exp, [TRAJECTORY, TRAJECTORY], per_turn=True).advantages
    returns = torch.tensor([0.8125, 1.625, 1.25, 2.5])  # whitened over the 8 trained tokens
    whitened = (returns - returns.mean()) / returns.var(unbiased=False).sqrt()
    assert torch.allclose(placed[0, [1, 2, 5, 6]], whitened, atol=1e-5)


def test_the_turn_adapter_follows_the_groups_declared_request_loop():
    from relayrl.config import PlacementConfig
    from relayrl.placement.engines import RayEngineGroup
    from relayrl.rollout.local_group import LocalEngineGroup
    from relayrl.sources.turn_requests import BatchTurns, turn_requests

    class Engine:
        llm = "looks like vLLM, but is not one"

    local = LocalEngineGroup(Engine())
    assert local.request_loop is None and isinstance(turn_requests(local), BatchTurns)
    ray_group = RayEngineGroup(lambda index: object(), PlacementConfig(engines=2))
    assert ray_group.request_loop is None and isinstance(turn_requests(ray_group, 3, [1]), BatchTurns)


def test_a_token_level_estimator_ignores_env_reward_and_says_so(random_model_dir):
    from relayrl.config import Config
    from relayrl.errors import ConfigWarning
    from relayrl.sources.multi_turn import check_env

    config = Config.model_validate(
        {
            "model": {"path": str(random_model_dir)},
            "env": {"fn": "retry", "reward": "final"},
            "algorithm": {"advantage": "reinforce_pp"},
        }
    )
    with pytest.warns(ConfigWarning, match="env.reward=final has no effect with algorithm.advantage=reinforce_pp"):
        check_env(source_settings(config), config.train.partial_rollouts)
