"""A warm start that writes DSPy's format, for the DSPy recipe (dspy_agent.py) on the calculator task.

DSPy reads a model's reply by its own field markers (ChatAdapter: `[[ ## next_thought ## ]]`, ..., then
`[[ ## completed ## ]]`), which the calculator's warm start (examples/agent_calculator/prepare.py, trained on the
hand-written agent's conversations) never writes. Here the SFT rows are DSPy's own calls: `dspy_agent.calculator` run
on each problem with DSPy's DummyLM answering, every call's messages recorded, the reply rendered by DSPy's ChatAdapter
(so each row is, token for token, what DSPy sends and what it parses). As prepare.py's, the tool is called on half of
the problems (then `finish`, and the tool's result as the answer); on the rest `finish` at once and a guess, usually
wrong: RL with the agent must learn to call `add`.

The tokenizer is prepare.py's (characters, its chat markers) plus DSPy's fixed text as whole tokens: its field markers
and every line of its system messages and of the instruction that ends its user messages. A character each, a ReAct
prompt would be ~2,200 positions and a reply ~130 tokens, too long for the tiny model to learn to read in a short SFT
pass; so a prompt is 120-180 tokens, a reply 20-40, and the format a few tokens to learn.

  python examples/agent_calculator/prepare.py              # the calculator's problems (config.yaml reads them)
  python examples/agent_libraries/dspy_prepare.py          # data/dspy_sft.jsonl and runs/dspy_calculator_init
  relayrl sft --model runs/dspy_calculator_init --data examples/agent_libraries/data/dspy_sft.jsonl \\
      --out runs/dspy_calculator_sft --epochs 4 --batch-size 32 --lr 3e-3
  relayrl train examples/agent_libraries/config.yaml model.path=runs/dspy_calculator_sft \\
      env.agent=examples/agent_libraries/dspy_agent.py:agent
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "agent_calculator")]
import dspy_agent  # noqa: E402
import prepare  # noqa: E402  (the calculator's: its tokenizer's markers and chat template, its guesses)

MARKER = re.compile(r"\[\[ ## \w+ ## \]\]")  # DSPy's field markers: `[[ ## answer ## ]]`


def calls(question: str, replies: list[dict]) -> list[dict]:
    """The calls `dspy_agent.calculator` makes on `question` when the model gives `replies` (each call's output fields
    in order, the last the extract step's `reasoning` and `answer`): one `messages` row per call, DSPy's messages
    and then the reply as DSPy's ChatAdapter renders it."""
    import dspy
    from dspy.utils.dummies import DummyLM

    lm = DummyLM(replies)  # answers each call with the next reply: the calls' messages are recorded in lm.history
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        dspy_agent.calculator(question=question)
    react = dspy_agent.calculator
    signatures = [react.react.signature] * (len(replies) - 1) + [react.extract.predict.signature]
    adapter = dspy.ChatAdapter()
    return [
        {
            "messages": [
                *call["messages"],
                {"role": "assistant", "content": adapter.format_assistant_message_content(signature, reply)},
            ]
        }
        for call, signature, reply in zip(lm.history, signatures, replies, strict=True)
    ]


def conversations(a: int, b: int, rng: random.Random) -> list[dict]:
    """DSPy's calls on one sum: `add` with the question's numbers, then `finish` thinking "the sum is" its result,
    which the answer repeats (TOOL_SHARE of the problems); else `finish` at once and a guess."""
    total = a + b
    if rng.random() < prepare.TOOL_SHARE:
        replies = [
            {"next_thought": "add", "next_tool_name": "add", "next_tool_args": {"a": a, "b": b}},
            {"next_thought": f"the sum is {total}", "next_tool_name": "finish", "next_tool_args": {}},
            {"reasoning": f"the sum is {total}", "answer": str(total)},
        ]
    else:
        replies = [
            {"next_thought": "a guess", "next_tool_name": "finish", "next_tool_args": {}},
            {"reasoning": "a guess", "answer": str(prepare.guess(total, rng))},
        ]
    return calls(f"{a}+{b}=", replies)


def fixed_pieces(rows: list[dict]) -> list[str]:
    """DSPy's fixed text: the field markers in `rows`, and every line of the system messages and the instruction that
    ends the user messages of both its adapters (ChatAdapter's; JSONAdapter's, which DSPy sends when it cannot parse
    a reply). Questions, trajectories and replies stay characters, the markers aside."""
    import dspy

    react = dspy_agent.calculator
    pieces = {marker for row in rows for m in row["messages"] for marker in MARKER.findall(m["content"])}
    for adapter in (dspy.ChatAdapter(), dspy.JSONAdapter()):
        for signature in (react.react.signature, react.extract.predict.signature):
            system, user = adapter.format(signature, [], {"question": "", "trajectory": ""})
            lines = system["content"].splitlines() + user["content"].splitlines()[-1:]
            pieces |= {line for line in lines if len(line.strip()) > 1}
    return sorted(pieces)


def build_model(out: Path, rows: list[dict]) -> None:
    """prepare.py's tokenizer and tiny model (prepare.save_tiny_model) over the rows' text, with DSPy's fixed text
    (fixed_pieces) one token each."""
    texts = [m["content"] for r in rows for m in r["messages"]] + [prepare.TEMPLATE]
    prepare.save_tiny_model(out, texts, whole_tokens=fixed_pieces(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "data"))
    parser.add_argument("--model-out", default="runs/dspy_calculator_init")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--problems", type=int, default=600)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = [
        row for _ in range(args.problems) for row in conversations(rng.randint(100, 999), rng.randint(100, 999), rng)
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dspy_sft.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    build_model(Path(args.model_out), rows)
    print(f"wrote {out}/dspy_sft.jsonl and the initial model {args.model_out}")


if __name__ == "__main__":
    main()
