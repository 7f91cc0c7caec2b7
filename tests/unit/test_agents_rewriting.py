"""Agents that rewrite their history through the endpoint, with a scripted engine: a call that does not extend the
trajectory's earlier calls starts a new sample per env.tito (fork, the default; strict refuses, naming the sample;
retokenize drops the earlier one), and smolagents' ToolCallingAgent and DSPy's ReAct, as they are, fork and train
under the default settings: each fork counted, with its trajectory's reward and advantage, packed by the learner."""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
import torch

from relayrl.agents.server import AgentServer
from relayrl.errors import ConfigWarning, EnvError
from relayrl.sources.trajectory import trajectory_rows
from tests.unit.agent_harness import drive, tool_tokenizer


# ---------------------------------------------------------------------------------------------- agents
async def edits_history(client, row):
    first = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": row["prompt"]}])
    rewritten = [{"role": "user", "content": "new question"}, {"role": "assistant", "content": "x"}]
    await client.chat.completions.create(model="m", messages=rewritten + [{"role": "user", "content": "go"}])
    return float(bool(first))


LUCK = itertools.cycle([1.0, 0.0])  # the trajectories' rewards, in the order they end


def smolagents_tool_calling(client, row):
    """smolagents' ToolCallingAgent, unchanged but for a short system prompt: its second call sends the tool call the
    model made back as the assistant's text ("Calling tools: [...]") and the result as a user "Observation:", so
    it does not extend the first call. Rewarded 1, 0, 1, ... in the order the trajectories end (when right)."""
    import importlib.resources

    import yaml
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    @tool
    def add(a: int, b: int) -> int:
        """Adds two numbers.

        Args:
            a: the first number
            b: the second number
        """
        return a + b

    templates = yaml.safe_load(
        importlib.resources.files("smolagents.prompts").joinpath("toolcalling_agent.yaml").read_text()
    )
    templates["system_prompt"] = "Answer with the tools."
    model = OpenAIServerModel("m", api_base=str(client.base_url), api_key="-", client_kwargs={"max_retries": 0})
    agent = ToolCallingAgent(tools=[add], model=model, prompt_templates=templates, max_steps=3, verbosity_level=0)
    right = str(agent.run(row["prompt"])) == "3"  # an agent whose calls were refused raises here, taking no luck
    return next(LUCK) * float(right)


def dspy_react(client, row):
    """DSPy's ReAct, as it is: every call renders the trajectory so far into a new user message (the earlier
    replies are not sent back as assistant messages), and the last call extracts the answer with another
    signature, so its second and third calls each rebuild the prompt."""
    import dspy

    def add(a: int, b: int) -> int:
        """Adds two numbers."""
        return a + b

    lm = dspy.LM("openai/m", api_base=str(client.base_url), api_key="-", cache=False, num_retries=0)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter(use_json_adapter_fallback=False)):
        prediction = dspy.ReAct("question -> answer", tools=[add], max_iters=3)(question=row["prompt"])
    return next(LUCK) * float(prediction.answer == "3")  # as smolagents_tool_calling


# ---------------------------------------------------------------------------------------------- harness
@pytest.fixture(scope="module")
def server():
    endpoint = AgentServer()
    yield endpoint
    endpoint.close()


# ---------------------------------------------------------------------------------------------- tests
def test_an_agent_that_edits_its_history_starts_a_new_sample_per_env_tito(server):
    with pytest.raises(EnvError, match=r"sample 0#0 turn 1: the agent's call does not extend its earlier calls"):
        drive(server, edits_history, ["4", "5"], max_turns=3, tito="strict")
    batch, turns, codec = drive(server, edits_history, ["4", "5"], max_turns=3)  # env.tito=fork, the default
    assert batch.metrics["tito/forks"] == 1 and len(batch.rollouts) == 2
    second, first = batch.rollouts  # the trajectory, then its fork (the sample before the rewrite)
    assert second.fork_of is None and first.fork_of == 0 and trajectory_rows(batch.rollouts) == [0, 0]
    # each sample's turns' rewards at their turns' ends: the first call's 0, the agent's return on the second
    assert first.turn_rewards == [(len(first.response_ids) - 1, 0.0)]
    assert second.turn_rewards == [(len(second.response_ids) - 1, 1.0)]
    assert codec.action_text(first.response_ids) == "4" and codec.action_text(second.response_ids) == "5"
    assert second.prompt.token_ids == turns.prompts[1][1]  # the new sample starts from the rewritten call
    assert "new question" in second.prompt.text and batch.rewards == [1.0, 1.0]
    dropped, _, _ = drive(server, edits_history, ["4", "5"], max_turns=3, tito="retokenize")
    assert len(dropped.rollouts) == 1 and dropped.metrics["tito/forks"] == 0


def test_a_smolagents_agent_that_sends_its_tool_calls_back_as_text_trains_under_the_default_settings(server, tmp_path):
    """smolagents' (and DSPy's) agents rewrite earlier turns in their later calls. Under the defaults (env.tito=fork,
    train.packing=auto) each trajectory's first call is kept as a forked sample: counted in tito/forks, trained
    with its trajectory's advantage, the group's baseline over its two trajectories, and the learner packs the
    rows (the fork's prompt is not its trajectory's) without a crash. env.tito=strict refuses, naming the sample."""
    from relayrl.algorithms.stage import advantage_stage
    from relayrl.learner.batching import make_experience
    from relayrl.learner.policy import PolicyLearner
    from relayrl.models.tiny import build_tiny_model
    from relayrl.placement.sections import learner_settings
    from relayrl.types import Score
    from tests.unit.test_learner import _config

    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    answer = '<tool_call>{"name": "final_answer", "arguments": {"answer": "3"}}</tool_call>'
    script, agent = [call, answer], smolagents_tool_calling
    refused = r"sample 0#\d turn 1: the agent's call does not extend its earlier calls"
    overridden = "the agent's stop=.* is overridden"  # its stop strings and tool_choice: the run's sampling wins
    with pytest.warns(ConfigWarning, match=overridden), pytest.raises(EnvError, match=refused):
        drive(server, agent, script, tokenizer=tool_tokenizer(), parser="hermes", tito="strict", timeout_s=30)
    with warnings.catch_warnings():  # the same overrides; the quotes of its "Calling tools" text: not in the vocab
        warnings.simplefilter("ignore")
        batch, turns, codec = drive(
            server, agent, script, n=2, tokenizer=tool_tokenizer(), parser="hermes", timeout_s=30
        )
    assert "Calling tools:" in codec.tokenizer.decode(turns.prompts[-1][1])  # the call sent back as text
    assert batch.metrics["tito/forks"] == 2 and [r.fork_of for r in batch.rollouts] == [None, None, 0, 1]
    assert sorted(batch.rewards[:2]) == [0.0, 1.0] and batch.rewards[2:] == batch.rewards[:2]
    build_tiny_model(len(codec.tokenizer), hidden=64, layers=2, heads=2, intermediate=128).save_pretrained(tmp_path)
    codec.tokenizer.save_pretrained(tmp_path)
    config = _config(tmp_path, micro_batch=8)
    assert config.env.tito == "fork" and config.train.packing == "auto"
    exp = make_experience(batch.rollouts, [Score(r) for r in batch.rewards], codec.tokenizer.pad_token_id)
    exp = advantage_stage(config.algorithm)(exp, batch.rollouts)
    assert exp.advantages is not None
    for fork in (2, 3):  # each fork's tokens get its trajectory's advantage: +-1/sqrt(2) over two trajectories
        trajectory = fork - 2
        trained = exp.advantages[fork][exp.loss_mask[fork].bool()]
        expected = exp.advantages[trajectory][exp.loss_mask[trajectory].bool()][0]
        assert torch.all(trained == expected) and abs(float(expected)) == pytest.approx(2**-0.5, abs=1e-4)
    result = PolicyLearner(learner_settings(config)).update(exp)
    assert result.metrics["learner/packed_frac"] > 0 and math.isfinite(result.metrics["loss/policy"])


def test_dspy_react_forks_at_each_rebuilt_call_under_the_default_settings(server):
    """DSPy's ReAct makes three calls per trajectory and the second and third rebuild the prompt: under the default
    env.tito=fork each trajectory is three samples, the two forks after its group's members, with its reward and
    (not a group member) its advantage. The learner side is the smolagents test's."""
    from relayrl.algorithms.advantages import grpo
    from relayrl.algorithms.stage import estimate_advantages
    from relayrl.learner.batching import make_experience
    from relayrl.types import Score, filled

    fields = "[[ ## next_thought ## ]]\n{}\n\n[[ ## next_tool_name ## ]]\n{}\n\n[[ ## next_tool_args ## ]]\n{}\n\n"
    script = [
        fields.format("add them", "add", '{"a": 1, "b": 2}') + "[[ ## completed ## ]]",
        fields.format("done", "finish", "{}") + "[[ ## completed ## ]]",
        "[[ ## reasoning ## ]]\nok\n\n[[ ## answer ## ]]\n3\n\n[[ ## completed ## ]]",
    ]
    with warnings.catch_warnings():  # DSPy's prompts hold characters the tiny vocabulary lacks: counted, warned
        warnings.simplefilter("ignore")
        batch, turns, codec = drive(server, dspy_react, script, n=2, tokenizer=tool_tokenizer(extra="#"), max_turns=4)
    assert len(turns.prompts) == 6 and batch.metrics["tito/prefix_mismatch"] == 4 and batch.metrics["tito/forks"] == 4
    assert [r.fork_of for r in batch.rollouts] == [None, None, 0, 0, 1, 1] and sorted(batch.rewards[:2]) == [0, 1]
    assert batch.rewards[2:] == [batch.rewards[0]] * 2 + [batch.rewards[1]] * 2  # each fork: its trajectory's
    assert codec.action_text(batch.rollouts[0].response_ids).startswith("[[ ## reasoning ## ]]")  # the last call
    exp = make_experience(batch.rollouts, [Score(r) for r in batch.rewards], codec.tokenizer.pad_token_id)
    advantages = filled(estimate_advantages(grpo, False, exp, batch.rollouts).advantages, "advantages")
    first = [float(advantages[row][exp.loss_mask[row].bool()][0]) for row in range(6)]
    assert first == pytest.approx([first[0], -first[0], first[0], first[0], -first[0], -first[0]])
    assert abs(first[0]) == pytest.approx(2**-0.5, abs=1e-4)  # two trajectories in the baseline, not six samples
