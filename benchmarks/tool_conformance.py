"""Tool-call conformance of the agents' endpoint and of env.tools: chat template x vLLM tool parser -> what an
agent gets, and what an environment's trajectory gets.

For each pair: an agent calls with `tools=[add]`, the (scripted) model answers with a call in the parser's format,
the agent runs it and calls again with the tool result. A pair conforms when the call comes back parsed (name
and arguments), the second call's prompt is the first call's prompt plus the sampled tokens exactly (then the
result's tokens), and a call cut short (the turn's token budget) is not executed. The table is docs/agents.md's
("Conformance"); tests/unit/test_tool_conformance.py checks every pair and that the table there is current.

    python benchmarks/tool_conformance.py        # prints the markdown table
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "a + b",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}
QWEN25 = (  # the shape of Qwen2.5's template: tools as JSON in the system turn, results as <tool_response>
    "{% if tools %}<|im_start|>system\n<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>"
    "<|im_end|>\n{% endif %}{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ m.content }}\n</tool_response><|im_end|>\n{% elif m.role == 'assistant' %}<|im_start|>assistant\n"
    "{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>\n{{ {'name': c.function.name, 'arguments': "
    "c.function.arguments} | tojson }}\n</tool_call>{% endfor %}<|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA31 = (  # the shape of Llama 3.1's: tools as JSON in the first user turn, results in the ipython role
    "{{ bos_token }}{% for m in messages %}{% set role = 'ipython' if m.role == 'tool' else m.role %}"
    "<|start_header_id|>{{ role }}<|end_header_id|>\n\n{% if loop.first and tools %}{% for t in tools %}"
    "{{ t | tojson }}\n{% endfor %}{% endif %}{{ m.content }}{% for c in m.tool_calls or [] %}"
    "{{ {'name': c.function.name, 'parameters': c.function.arguments} | tojson }}{% endfor %}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def chatml() -> str:
    import vllm

    return (Path(vllm.__file__).parent / "transformers_utils/chat_templates/template_chatml.jinja").read_text()


TEMPLATES = {  # name -> (template, its end-of-turn token)
    "chatml (vLLM's)": (chatml, "<|im_end|>"),
    "Qwen2.5-style": (lambda: QWEN25, "<|im_end|>"),
    "Llama-3.1-style": (lambda: LLAMA31, "<|eot_id|>"),
}
PARSERS = {  # name -> the model's call of add(1, 2) in that family's format
    "hermes": '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
    "llama3_json": '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}',
    "pythonic": "[add(a=1, b=2)]",
    "qwen3_xml": "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>\n"
    "</function>\n</tool_call>",
}
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"]
SEEN: dict[str, list] = {}  # each trajectory's replies, by its base URL


async def conformance_agent(client, row):
    """Call with the tool; run what comes back; call again with the result."""
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(2):
        reply = await client.chat.completions.create(model="m", messages=messages, tools=[ADD])
        SEEN.setdefault(str(client.base_url), []).append(reply)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or ():
            arguments = json.loads(call.function.arguments)
            result = str(arguments["a"] + arguments["b"]) if {"a", "b"} <= arguments.keys() else "error: a, b"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        if not message.tool_calls:
            messages.append({"role": "user", "content": "no call"})
    return 1.0


class ScriptedTurns:
    """An engine whose turn i is `script[i]` then the end-of-turn token, cut at the sampling budget."""

    one_call_per_step = True

    def __init__(self, tokenizer, script: list[str], budget: int):
        self.tokenizer, self.script, self.budget = tokenizer, script, budget
        self.queued, self.prompts = [], []

    @property
    def pending(self):
        return len(self.queued)

    def submit(self, key, prompt_ids, sampling, shown=None):
        self.queued.append((key, list(prompt_ids)))

    def step(self):
        from relayrl.sources.turn_requests import TurnOutput

        out, queued, self.queued = [], self.queued, []
        for key, ids in queued:
            turn = sum(1 for k, _ in self.prompts if k == key)
            self.prompts.append((key, ids))
            text = self.script[min(turn, len(self.script) - 1)]
            tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            cut = tokens[: self.budget]
            out.append((key, TurnOutput(cut, [-0.5] * len(cut), [0] * len(cut), "length" if cut != tokens else "stop")))
        return out

    def abort(self):
        self.queued = []


def tokenizer_for(template: str, eos: str):
    from tokenizers import Regex, pre_tokenizers

    from relayrl.models.tiny import train_char_tokenizer

    text = "".join(PARSERS.values()) + template + json.dumps(ADD) + "abcdefghijklmnopqrstuvwxyz0123456789+=_ \n"
    tokenizer = train_char_tokenizer([text])
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS})
    tokenizer.eos_token = eos
    tokenizer.chat_template = template
    return tokenizer


def add(a: int, b: int) -> int:
    """a + b (the same tool, named in env.tools).

    Args:
        a: an integer
        b: an integer
    """
    return a + b


@dataclass
class Result:
    template: str
    parser: str
    parsed: str
    tokens: str
    truncated: str
    env_tools: str = ""  # the same call and cut call through env.tools' path (relayrl/envs/tools.py)

    @property
    def conforms(self) -> bool:
        agent = self.parsed == "yes" and self.tokens == "exact" and self.truncated.startswith("not executed")
        return agent and self.env_tools.startswith("run, exact, cut call not run")


def run_pair(server, template_name: str, parser: str) -> Result:
    from relayrl.agents.pool import AgentPool
    from relayrl.config.env import EnvConfig
    from relayrl.data.chat import ChatCodec
    from relayrl.sources.trajectories import MultiTurnDriver
    from relayrl.types import Prompt, Sampling

    make, eos = TEMPLATES[template_name]
    tokenizer = tokenizer_for(make(), eos)
    codec = ChatCodec(tokenizer)
    spec = "benchmarks.tool_conformance:conformance_agent"

    def drive(script: list[str], budget: int):
        SEEN.clear()
        turns = ScriptedTurns(tokenizer, script, budget)
        pool = AgentPool(server, spec, {}, 2, 10.0, tokenizer, parser)
        try:
            driver = MultiTurnDriver(
                turns, pool, codec, EnvConfig(agent=spec, max_turns=2), Sampling(max_tokens=budget)
            )
            batch = driver.run([Prompt("0", "1+2=", [])], 1)
        finally:
            pool.close()
        (replies,) = SEEN.values()
        return batch, turns, replies

    call = PARSERS[parser]
    batch, turns, replies = drive([call, "3"], 256)
    calls = replies[0].choices[0].message.tool_calls or []
    good = (
        len(calls) == 1
        and calls[0].function.name == "add"
        and json.loads(calls[0].function.arguments) == {"a": 1, "b": 2}
    )
    (_, first), (_, second) = turns.prompts[0], turns.prompts[1]
    sampled = replies[0].choices[0].model_extra["token_ids"]
    exact = second[: len(first) + len(sampled)] == first + sampled and batch.metrics["tito/forks"] == 0
    cut = len(tokenizer(call, add_special_tokens=False)["input_ids"]) // 2
    batch, _, replies = drive([call, "3"], cut)
    executed = bool(replies[0].choices[0].message.tool_calls)
    counted = batch.metrics["env/tool_errors"] > 0
    truncated = "EXECUTED" if executed else "not executed, " + ("counted" if counted else "not counted")
    result = Result(template_name, parser, "yes" if good else "no", "exact" if exact else "CHANGED", truncated)
    result.env_tools = run_env_tools(tokenizer, parser, call, cut)
    return result


def run_env_tools(tokenizer, parser: str, call: str, cut: int) -> str:
    """The call through env.tools: the worker runs `add` (its result, 3, in the next prompt), the next prompt
    extends the sampled tokens, and the call cut at the budget is an error observation, counted (a pythonic
    call has no start tag to tell a cut call by: it is read as text, the answer)."""
    from relayrl.config.env import EnvConfig
    from relayrl.data.chat import ChatCodec
    from relayrl.envs.builtins import AnswerEnv
    from relayrl.envs.pool import EnvPool
    from relayrl.envs.tools import tool_schemas
    from relayrl.rollout.tool_calls import TurnParser
    from relayrl.sources.trajectories import EnvTools, MultiTurnDriver
    from relayrl.types import Prompt, Sampling

    tools = ["benchmarks.tool_conformance:add"]
    codec = ChatCodec(tokenizer)
    offered = EnvTools(tool_schemas(tools, AnswerEnv), TurnParser(tokenizer, parser))

    def drive(budget: int):
        turns = ScriptedTurns(tokenizer, [call, "3"], budget)
        pool = EnvPool("answer", {}, 1, 10.0, tools)
        try:
            settings = EnvConfig(tools=tools, tool_parser=parser, max_turns=2)
            driver = MultiTurnDriver(turns, pool, codec, settings, Sampling(max_tokens=budget), tools=offered)
            batch = driver.run([Prompt("0", "1+2=", [], columns={"answer": "3"})], 1)
        finally:
            pool.close()
        return batch, turns

    batch, turns = drive(256)
    (_, first), (_, second) = turns.prompts
    sampled = tokenizer(call, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ran = batch.metrics["env/tool_calls"] == 1 and "3" in tokenizer.decode(second[len(first) :])
    exact = second[: len(first) + len(sampled)] == first + sampled and batch.metrics["tito/prefix_mismatch"] == 0
    batch, turns = drive(cut)
    cut_ran = batch.metrics["env/tool_calls"] > 0
    counted = "counted" if batch.metrics["env/tool_errors"] > 0 else "not counted"
    outcome = ["run" if ran else "NOT RUN", "exact" if exact else "CHANGED"]
    return ", ".join(outcome + ["cut call RUN" if cut_ran else f"cut call not run ({counted})"])


def run_all() -> list[Result]:
    from relayrl.agents.server import AgentServer

    server = AgentServer()
    try:
        return [run_pair(server, t, p) for t in TEMPLATES for p in PARSERS]
    finally:
        server.close()


def table(results: list[Result]) -> str:
    rows = [
        "| template | tool parser | call parsed | next prompt | truncated call | env.tools |",
        "|---|---|---|---|---|---|",
    ]
    rows += [
        f"| {r.template} | `{r.parser}` | {r.parsed} | {r.tokens} | {r.truncated} | {r.env_tools} |" for r in results
    ]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # through the module the agent's spec names (its SEEN, not __main__'s)
    from benchmarks import tool_conformance

    print(tool_conformance.table(tool_conformance.run_all()), end="")
