"""What the agent endpoint's unit tests share: an agent driven through the multi-turn driver with a scripted engine
(`drive`: relayrl/agents/ served to the real openai client, the replies scripted), a character tokenizer whose chat
template renders tools and tool results (`tool_tokenizer`), the `add` tool, and the warnings' reader (`said`)."""

from __future__ import annotations

from relayrl.agents.pool import AgentPool
from relayrl.agents.sampling import RunSampling
from relayrl.config.env import EnvConfig
from relayrl.data.chat import ChatCodec
from relayrl.sources.trajectories import MultiTurnDriver
from relayrl.types import Prompt, Sampling
from tests.unit.test_multiturn import ScriptedTurns
from tests.unit.test_tito import chat_tokenizer

ADD = {
    "type": "function",
    "function": {"name": "add", "description": "a + b", "parameters": {"type": "object", "properties": {}}},
}
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function.name }};{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}"
    "</tool_response><|im_end|>\n{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments}"
    " | tojson }}</tool_call>{% endfor %}<|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tool_tokenizer(thinking: bool = False, extra: str = ""):
    from tokenizers import Regex, pre_tokenizers

    from relayrl.models.tiny import train_char_tokenizer
    from tests.unit.test_tito import TEXT

    tokenizer = train_char_tokenizer([TEXT + '{}"[];' + extra])
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    specials = ["<|im_start|>", "<|im_end|>"] + (["<think>", "</think>"] if thinking else [])
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = TOOLS_TEMPLATE
    return tokenizer


def drive(
    server,
    agent,
    script,
    prompts=("2+3=",),
    n=1,
    tokenizer=None,
    parser="",
    timeout_s=10.0,
    context=None,
    reasoning="",
    **env,
):
    """One step of `agent` (a module-level function: loaded by its module and name, as env.agent is) on `prompts`,
    `n` trajectories each, the engine's replies `script` in order: (the batch, the scripted turns, the codec)."""
    codec = ChatCodec(tokenizer or chat_tokenizer("qwen"))
    turns = ScriptedTurns(codec, script)
    spec = f"{agent.__module__}:{agent.__name__}"
    sampling = RunSampling({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 128, "stop": []})
    pool = AgentPool(server, spec, {}, 8, timeout_s, codec.tokenizer, parser, sampling, reasoning)
    rows = [Prompt(id=str(i), text=p, token_ids=[], columns={"answer": "5"}) for i, p in enumerate(prompts)]
    try:
        driver = MultiTurnDriver(
            turns, pool, codec, EnvConfig(agent=spec, **env), Sampling(max_tokens=128), context=context
        )
        batch = driver.run(rows, n)
        pool.faults.notices.step_ended()  # as the source does after each step
    finally:
        pool.close()
    return batch, turns, codec


def said(caught, text: str) -> list[str]:
    """The caught warnings' messages that hold `text`."""
    return [str(w.message) for w in caught if text in str(w.message)]
