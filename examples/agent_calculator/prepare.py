"""Data, tokenizer and initial model for the tool-using calculator agent (agent.py): sums of two 3-digit numbers.

The tokenizer is character-level with the chat markers and the hermes tool-call tags as special tokens, and a
chat template that renders `tools=` (a system line naming each tool and its parameters) and tool results. The
warm start (sft.jsonl: `messages` rows with a `tools` column) calls the tool on half of the problems (then
answers with its result) and answers directly, usually wrong, on the rest; RL with the agent rewards the right
final answer, so it must learn to call the tool, every time, with the right arguments.

  python examples/agent_calculator/prepare.py            # data/ and runs/agent_calculator_init
  relayrl sft --model runs/agent_calculator_init --data examples/agent_calculator/data/sft.jsonl \\
      --out runs/agent_calculator_sft --epochs 8 --batch-size 64
  relayrl sft --model runs/agent_calculator_sft --data examples/agent_calculator/data/sft.jsonl \\
      --out runs/agent_calculator_sft2 --epochs 8 --batch-size 64 --lr 5e-4
  relayrl train examples/agent_calculator/config.yaml
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from agent import ADD  # noqa: E402

SPECIAL = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function.name }}("
    "{{ t.function.parameters.properties | list | join(',') }}) {% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments}"
    " | tojson }}</tool_call>{% endfor %}<|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOL_SHARE = 0.5
# Positions, not parameters (rotary embeddings): room for the agent libraries' own prompts (examples/agents/: smolagents'
# default system prompt alone is thousands of tokens), at no cost to the model's size.
MAX_POSITIONS = 4096


def call(a: int, b: int) -> str:
    return (
        "<tool_call>"
        + json.dumps({"name": "add", "arguments": {"a": a, "b": b}}, separators=(",", ":"))
        + "</tool_call>"
    )


def guess(total: int, rng: random.Random) -> int:
    return total if rng.random() < 0.2 else total + rng.choice([-100, -10, -1, 1, 10, 100])


def conversation(a: int, b: int, rng: random.Random) -> dict:
    turns = [{"role": "user", "content": f"{a}+{b}="}]
    if rng.random() >= TOOL_SHARE:
        turns.append({"role": "assistant", "content": str(guess(a + b, rng))})
    else:
        turns += [
            {"role": "assistant", "content": call(a, b)},
            {"role": "tool", "content": str(a + b)},
            {"role": "assistant", "content": str(a + b)},
        ]
    return {"messages": turns, "tools": [ADD]}


def build_model(out: Path, rows: list[dict]) -> None:
    """The calculator's tokenizer and tiny model (save_tiny_model) over the rows' text, the template and the tool."""
    texts = [m["content"] for r in rows for m in r["messages"]] + [TEMPLATE, json.dumps(ADD)]
    save_tiny_model(out, texts)


def save_tiny_model(out: Path, texts: list[str], whole_tokens: list[str] | None = None) -> None:
    """A character tokenizer over `texts` (which should hold TEMPLATE), SPECIAL as special tokens, `whole_tokens`
    (e.g. dspy_prepare.py's fixed text) one token each, TEMPLATE as its chat template, and a tiny model sized for it
    (MAX_POSITIONS positions), both saved to `out`. Shared with examples/agent_libraries/dspy_prepare.py."""
    from tokenizers import Regex, pre_tokenizers

    from relayrl.models.tiny import build_tiny_model, train_char_tokenizer

    tokenizer = train_char_tokenizer(texts)
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL})
    if whole_tokens:
        tokenizer.add_tokens(whole_tokens)
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = TEMPLATE
    model = build_tiny_model(
        vocab_size=len(tokenizer),
        max_positions=MAX_POSITIONS,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "data"))
    parser.add_argument("--model-out", default="runs/agent_calculator_init")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sft-size", type=int, default=3000)
    parser.add_argument("--train-size", type=int, default=4000)
    parser.add_argument("--eval-size", type=int, default=200)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    total = args.sft_size + args.train_size + args.eval_size
    problems = [(rng.randint(100, 999), rng.randint(100, 999)) for _ in range(total)]
    sft = problems[: args.sft_size]
    train = problems[args.sft_size : args.sft_size + args.train_size]
    held_out = problems[args.sft_size + args.train_size :]
    rows = {
        "sft": [conversation(a, b, rng) for a, b in sft],
        "train": [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in train],
        "eval": [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in held_out],
    }
    for name, items in rows.items():
        (out / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in items))
    build_model(Path(args.model_out), rows["sft"])
    print(f"wrote {out}/sft.jsonl, train.jsonl, eval.jsonl and the initial model {args.model_out}")


if __name__ == "__main__":
    main()
