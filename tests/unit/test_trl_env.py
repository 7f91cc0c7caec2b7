"""TRL `environment_factory` classes as they are written for TRL, run through `env.agent: trl:module:Class`
(relayrl/agents/trl_env.py) by the multi-turn driver with a scripted engine: the tools are rendered from the
methods' docstrings, vLLM's hermes parser reads the calls, the results come back as tool messages after the
sampled tokens, `get_reward` is the reward, and a class TRL would refuse is refused naming what is missing."""

from __future__ import annotations

import pytest

from relayrl.agents.loading import load_agent
from relayrl.agents.pool import AgentPool
from relayrl.agents.sampling import RunSampling
from relayrl.agents.server import AgentServer
from relayrl.build import source_settings
from relayrl.config.env import EnvConfig
from relayrl.data.chat import ChatCodec
from relayrl.errors import EnvError
from relayrl.sources.trajectories import MultiTurnDriver
from relayrl.types import Prompt, Sampling
from tests.unit.agent_harness import tool_tokenizer
from tests.unit.test_multiturn import ScriptedTurns

HERE = "tests.unit.test_trl_env"


class Calculator:
    """As a TRL user writes it: tools are public methods with type hints and Google-style docstrings, the reward
    comes from the environment's own state."""

    def __init__(self, bonus: float = 0.0):
        self.bonus = bonus

    def reset(self, **kwargs) -> str:
        self.answer, self.submitted = kwargs["answer"], None
        return " (use the tools)"

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a + b

    def divide(self, a: int, b: int) -> float:
        """Divide a by b.

        Args:
            a: The dividend.
            b: The divisor.
        """
        return a / b

    def submit(self, answer: str) -> str:
        """Submit the final answer.

        Args:
            answer: The answer.
        """
        self.submitted = answer
        return "submitted"

    def get_reward(self) -> float:
        return float(self.submitted == self.answer) + self.bonus


class NoReward:
    def reset(self, **kwargs) -> None:
        return None


class NoReset:
    def add(self, a: int) -> int:
        """Add.

        Args:
            a: A number.
        """
        return a


class Undocumented:
    def reset(self, **kwargs) -> None:
        return None

    def add(self, a, b):
        return a + b


ENVIRONMENTS = {"calculator": Calculator, "quiet": NoReward}


def call(name: str, **arguments) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def server():
    endpoint = AgentServer()
    yield endpoint
    endpoint.close()


def run(server, name: str, script: list[str], columns=None, kwargs=None, **env):
    spec = f"trl:{HERE}:{name}"
    codec = ChatCodec(tool_tokenizer())
    turns = ScriptedTurns(codec, script)
    sampling = RunSampling({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 128, "stop": []})
    pool = AgentPool(server, spec, kwargs or {}, 4, 10.0, codec.tokenizer, "hermes", sampling)
    rows = [Prompt(id="0", text="2+3=", token_ids=[], columns=columns or {"answer": "5"})]
    try:
        driver = MultiTurnDriver(turns, pool, codec, EnvConfig(agent=spec, **env), Sampling(max_tokens=128))
        batch = driver.run(rows, 1)
    finally:
        pool.close()
    return batch, [codec.tokenizer.decode(ids) for _, ids in turns.prompts]


def test_a_trl_environment_runs_its_tools_and_scores_with_get_reward(server):
    script = [call("add", a=2, b=3), call("submit", answer="5"), "done"]
    batch, prompts = run(server, "Calculator", script, max_turns=4)
    first, second, third = prompts
    assert "add;divide;submit;" in first  # the methods as tools= (the template lists their names)
    assert "2+3= (use the tools)" in first  # what reset returned, appended to the user's message
    assert second.endswith("<tool_response>5</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert "<tool_response>submitted</tool_response>" in third
    assert batch.rewards == [1.0] and batch.metrics["env/turns_mean"] == 3 and batch.metrics["env/tool_calls"] == 2
    (rollout,) = batch.rollouts
    assert [r for _, r in rollout.turn_rewards or []] == [0.0, 0.0, 1.0]


def test_env_kwargs_build_the_environment_and_a_wrong_answer_scores_what_get_reward_says(server):
    batch, _ = run(server, "Calculator", [call("submit", answer="6"), "done"], kwargs={"bonus": 0.25}, max_turns=3)
    assert batch.rewards == [0.25]


@pytest.mark.filterwarnings("ignore:.*not in the tokenizer's vocabulary")  # the test tokenizer has no quote mark
def test_a_tool_that_raises_answers_with_trls_error_and_the_trajectory_goes_on(server):
    batch, prompts = run(server, "Calculator", [call("divide", a=1, b=0), call("submit", answer="5"), "ok"])
    assert "<tool_response>{<unk>error<unk>: <unk>division by zero<unk>}</tool_response>" in prompts[1]
    assert batch.rewards == [1.0]


def test_without_get_reward_the_environment_scores_0_and_a_dict_picks_by_the_environment_column(server):
    batch, prompts = run(server, "ENVIRONMENTS", ["hello"], columns={"answer": "5", "environment": "quiet"})
    assert batch.rewards == [0.0] and "add;" not in prompts[0]  # the quiet environment has no tools
    batch, _ = run(
        server, "ENVIRONMENTS", [call("submit", answer="5"), "ok"], columns={"answer": "5", "environment": "calculator"}
    )
    assert batch.rewards == [1.0]
    batch, _ = run(server, "ENVIRONMENTS", ["x"], columns={"answer": "5"}, on_error="zero")
    assert batch.metrics["env/errors"] == 1  # no environment column: the trajectory's error, named


def test_classes_trl_would_refuse_are_refused_when_they_load():
    with pytest.raises(EnvError, match=r"NoReset has no reset method"):
        load_agent(f"trl:{HERE}:NoReset")
    with pytest.raises(EnvError, match=r"tool Undocumented.add: .*no docstring.*Google-style docstring"):
        load_agent(f"trl:{HERE}:Undocumented")
    with pytest.raises(EnvError, match=r"'tests.unit.test_trl_env' has no 'Nope'"):
        load_agent(f"trl:{HERE}:Nope")
    with pytest.raises(EnvError, match=r"not of the form trl:module:Class"):
        load_agent("trl:Calculator")


def test_a_trl_spec_with_a_file_is_resolved_against_the_config_file(tmp_path):
    from relayrl.config import load_config

    (tmp_path / "envs.py").write_text("class Env:\n    def reset(self, **kwargs):\n        return None\n")
    (tmp_path / "run.yaml").write_text("env: {agent: 'trl:envs.py:Env'}\n")
    config = load_config(tmp_path / "run.yaml", [])
    assert config.env.agent == f"trl:{tmp_path / 'envs.py'}:Env"
    assert load_agent(config.env.agent).__name__ == f"trl_environment[{tmp_path / 'envs.py'}:Env]"


def test_env_fn_takes_the_trl_spec_too_and_a_class_without_get_reward_needs_a_reward_fn(tmp_path):
    from relayrl.config import load_config
    from relayrl.errors import ConfigError
    from relayrl.sources.multi_turn import agent_of, check_env

    config = load_config(None, [f"env.fn=trl:{HERE}:Calculator", "env.kwargs.bonus=0.5"])
    spec, kwargs = agent_of(config.env) or ("", {})
    assert spec.startswith("trl:") and spec.endswith("test_trl_env.py:Calculator") and kwargs == {"bonus": 0.5}
    check_env(source_settings(config), config.train.partial_rollouts)  # get_reward scores: no reward.fn needed
    quiet = load_config(None, [f"env.fn=trl:{HERE}:NoReward"])
    with pytest.raises(ConfigError, match=r"has no get_reward and no reward.fn is set, so every trajectory would"):
        check_env(source_settings(quiet), quiet.train.partial_rollouts)
    scored = load_config(None, [f"env.fn=trl:{HERE}:NoReward", "reward.fn=exact_match"])
    check_env(source_settings(scored), scored.train.partial_rollouts)
