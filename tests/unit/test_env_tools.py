"""`env.tools` (relayrl/envs/tools.py): tools named in the config, rendered through the chat template's `tools=`,
the model's calls read by vLLM's hermes parser (the rollout endpoint's reading), run in the environment workers,
their results sent back as tool messages after the sampled tokens; every mistake of the model's is an error
observation, counted, and a config that cannot work is refused naming the tool."""

from __future__ import annotations

import json

import pytest

from relayrl.build import source_settings
from relayrl.config.env import EnvConfig
from relayrl.data.chat import ChatCodec
from relayrl.envs.builtins import AnswerEnv, CalculatorEnv
from relayrl.envs.pool import EnvPool
from relayrl.envs.tools import ToolTurn, parser_for, run_tool, tool_functions, tool_schemas, tool_step
from relayrl.errors import EnvError
from relayrl.rollout.tool_calls import TurnParser
from relayrl.sources.trajectories import EnvTools, MultiTurnDriver
from relayrl.types import Prompt, Sampling
from tests.unit.agent_harness import tool_tokenizer
from tests.unit.test_multiturn import ScriptedTurns

HERE = "tests.unit.test_env_tools"


def add(a: int, b: int) -> int:
    """The sum of two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def lookup(key: str) -> dict:
    """A record by key.

    Args:
        key: its key
    """
    if key == "boom":
        raise KeyError(key)
    return {"key": key, "found": True}


def undocumented(a, b):
    return a


MULTIPLY = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "the product of two integers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}


class Multiplier(AnswerEnv):
    """An environment that runs the `multiply` schema as its own method."""

    def multiply(self, a: int, b: int) -> int:
        return a * b


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_schemas_come_from_type_hints_and_docstrings_and_an_environment_runs_a_bare_schema():
    schemas = tool_schemas([f"{HERE}:add", "calculate", MULTIPLY], Multiplier)
    assert [s["function"]["name"] for s in schemas] == ["add", "calculate", "multiply"]
    assert schemas[0]["function"]["parameters"]["properties"]["a"] == {"type": "integer", "description": "the first"}
    functions = tool_functions([f"{HERE}:add", "calculate", MULTIPLY], Multiplier())
    assert functions["multiply"](a=6, b=7) == 42 and functions["calculate"](expression="(17 + 4) * 3") == "63"


def test_a_tool_that_cannot_work_is_refused_naming_it():
    with pytest.raises(EnvError, match=r"undocumented.*type hints and a Google-style docstring"):
        tool_schemas([f"{HERE}:undocumented"], AnswerEnv)
    with pytest.raises(EnvError, match=r"the schema of 'multiply' names no function, and AnswerEnv has no method"):
        tool_schemas([MULTIPLY], AnswerEnv)
    with pytest.raises(EnvError, match=r"two tools are named 'add'"):
        tool_schemas([f"{HERE}:add", f"{HERE}:add"], AnswerEnv)
    with pytest.raises(EnvError, match=r"'tests.unit.test_env_tools' has no function 'nope'"):
        tool_schemas([f"{HERE}:nope"], AnswerEnv)
    with pytest.raises(EnvError, match=r"'calc' is not a built-in tool \(calculate\)"):
        tool_schemas(["calc"], AnswerEnv)
    with pytest.raises(ValueError, match=r"env.tools.0: an OpenAI function schema is"):
        EnvConfig(tools=[{"name": "add"}])
    with pytest.raises(ValueError, match=r"env.agent='a.py:f' offers its own tools"):
        EnvConfig(agent="a.py:f", tools=["calculate"])


def test_every_mistake_of_the_model_is_an_error_the_model_reads():
    functions = tool_functions([f"{HERE}:add", f"{HERE}:lookup"], AnswerEnv())
    assert run_tool(functions, "add", '{"a": 2, "b": 3}') == ("5", False)
    assert run_tool(functions, "lookup", '{"key": "k"}') == ('{"key": "k", "found": true}', False)  # JSON, not repr
    for name, arguments, said in [
        ("sub", "{}", "unknown tool 'sub'; the tools are add, lookup"),
        ("add", "{a: 2", "the arguments of add are not JSON"),
        ("add", "[2, 3]", "the arguments of add must be a JSON object"),
        ("add", '{"a": 2}', "add: add() missing 1 required positional argument: 'b'"),
        ("lookup", '{"key": "boom"}', "lookup raised KeyError: 'boom'"),
    ]:
        content, failed = run_tool(functions, name, arguments)
        assert failed and said in json.loads(content)["error"], (name, content)


def test_a_turn_with_calls_gets_their_results_and_one_without_is_the_answer():
    env, functions = AnswerEnv(), tool_functions([f"{HERE}:add"], None)
    env.reset({"prompt": "2+3=", "answer": "5"})
    calls = [
        {"id": "c0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        {"id": "c1", "type": "function", "function": {"name": "mul", "arguments": "{}"}},
    ]
    step = tool_step(env, functions, ToolTurn("", calls), "sample 0")
    assert [m["content"] for m in step.observation] == ["5", '{"error": "unknown tool \'mul\'; the tools are add"}']  # type: ignore[union-attr]
    assert [m["tool_call_id"] for m in step.observation] == ["c0", "c1"]  # type: ignore[union-attr]
    assert step.info == {"tool_calls": 2, "tool_errors": 1} and not step.done
    unread = tool_step(env, functions, ToolTurn("<tool_call>{", [], 1), "sample 0")
    assert "could not be read" in unread.observation["content"] and unread.info == {"tool_errors": 1}  # type: ignore[index]
    answer = tool_step(env, functions, ToolTurn(" 5 "), "sample 0")
    assert answer.done and answer.reward == 1.0


def test_the_parser_is_the_templates_own_and_a_template_without_tools_is_refused():
    tokenizer = tool_tokenizer()
    schemas = tool_schemas(["calculate"], AnswerEnv)
    assert parser_for("", tokenizer, True, schemas) == "hermes"  # its template writes <tool_call>
    assert parser_for("llama3_json", tokenizer, True, schemas) == "llama3_json"
    with pytest.raises(EnvError, match=r"needs a chat template that renders tools="):
        parser_for("", tokenizer, False, schemas)
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(EnvError, match=r"renders tools= as nothing"):
        parser_for("", tokenizer, True, schemas)
    tokenizer.chat_template = "{% if tools %}TOOLS{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(EnvError, match=r"cannot tell the tool-call format .* set env.tool_parser"):
        parser_for("", tokenizer, True, schemas)


def run(script: list[str], tools: list, fn: str = "answer", prompt: str = "2+3=", **env):
    """One trajectory through the driver with the real environment workers and vLLM's hermes parser."""
    codec = ChatCodec(tool_tokenizer())
    turns = ScriptedTurns(codec, script)
    settings = EnvConfig(fn=fn, tools=tools, tool_parser="hermes", **env)
    from relayrl.envs.base import load_env_class

    offered = EnvTools(tool_schemas(tools, load_env_class(fn)), TurnParser(codec.tokenizer, "hermes"))
    pool = EnvPool(fn, {}, 2, 10.0, tools)
    try:
        driver = MultiTurnDriver(turns, pool, codec, settings, Sampling(max_tokens=128), tools=offered)
        batch = driver.run([Prompt(id="0", text=prompt, token_ids=[], columns={"answer": "5"})], 1)
    finally:
        pool.close()
    return batch, turns, codec


@pytest.mark.filterwarnings("ignore:.*not in the tokenizer's vocabulary")  # the test tokenizer lacks some marks
def test_a_trajectory_calls_the_tool_reads_its_result_and_answers_with_every_sampled_token_kept():
    batch, turns, codec = run([call("add", a=2, b=3), "5"], [f"{HERE}:add"], max_turns=3)
    (rollout,) = batch.rollouts
    first, second = (codec.tokenizer.decode(ids) for _, ids in turns.prompts)
    assert first.startswith("<|im_start|>system\nadd;<|im_end|>")  # the tool, rendered by the template
    assert second.endswith("<tool_response>5</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert batch.rewards == [1.0] and batch.metrics["env/tool_calls"] == 1 and batch.metrics["env/tool_errors"] == 0
    sampled = [codec.encode(text) + [codec.tokenizer.eos_token_id] for text in (call("add", a=2, b=3), "5")]
    trained = [t for t, m in zip(rollout.response_ids, rollout.loss_mask or []) if m]
    assert trained == sampled[0] + sampled[1]  # exactly the engine's tokens, nothing re-rendered
    assert (
        turns.prompts[1][1]
        == turns.prompts[0][1] + rollout.response_ids[: len(turns.prompts[1][1]) - len(turns.prompts[0][1])]
    )


@pytest.mark.filterwarnings("ignore:.*not in the tokenizer's vocabulary")
def test_a_malformed_call_and_an_unknown_tool_are_error_observations_counted_not_crashes():
    script = ['<tool_call>{"name": "add", ', call("sub", a=1), call("add", a=2, b=3), "5"]
    batch, turns, codec = run(script, [f"{HERE}:add"], max_turns=5)
    prompts = [codec.tokenizer.decode(ids) for _, ids in turns.prompts]
    assert "could not be read" in prompts[1] and "unknown tool" in prompts[2]
    assert batch.rewards == [1.0] and batch.metrics["env/tool_errors"] == 2 and batch.metrics["env/tool_calls"] == 2


def test_the_builtin_calculator_answers_tool_calls_as_well_as_calc_tags():
    batch, _, _ = run([call("calculate", expression="2+3"), "5"], ["calculate"], fn="calculator", max_turns=3)
    assert batch.rewards == [1.0] and batch.metrics["env/tool_calls"] == 1
    assert CalculatorEnv().step("<calc>2+3</calc>").observation == {"role": "tool", "content": "5"}


def test_env_tools_files_are_resolved_against_the_config_and_check_env_refuses_what_cannot_work(tmp_path):
    from relayrl.config import load_config
    from relayrl.sources.multi_turn import check_env

    (tmp_path / "tools.py").write_text("def f(x: int) -> int:\n    return x\n")
    (tmp_path / "run.yaml").write_text("env: {tools: ['tools.py:f', calculate]}\n")
    config = load_config(tmp_path / "run.yaml", [])
    assert config.env.tools == [f"{tmp_path / 'tools.py'}:f", "calculate"]
    assert config.env.multi_turn and config.env.env_class == "answer"
    with pytest.raises(EnvError, match=r"tools.py:f.*docstring"):
        check_env(source_settings(config), config.train.partial_rollouts)
