"""Built-in environments: `answer`, `retry`, `calculator` and `code_feedback` (env.fn names them).

- `answer`: the row's question; the model's answer is checked against the row's `answer`, once. With env.tools
  (relayrl/envs/tools.py) the turns that call a tool are answered by the tools, and the first turn without a
  call is the answer: the environment of a tools-only config (env.fn empty).
- `retry`: the row's question; an answer that is not the row's `answer` gets `feedback` and another attempt.
- `calculator`: the model may write `<calc>expression</calc>`; the environment answers with the value (an
  arithmetic expression of numbers and + - * / // % ** and parentheses, nothing else is evaluated); any
  other turn is the final answer, checked against the row's `answer`.
- `code_feedback`: the completion's program runs in the sandbox (relayrl/rewards/sandbox.py) against the
  row's `tests`; the failing cases' output comes back for another attempt.
Each scores 1.0 on the turn that gets it right and 0 otherwise, and says `info["success"]`.
"""

from __future__ import annotations

import ast
import operator
from typing import TYPE_CHECKING, Any

from relayrl.envs.base import Step
from relayrl.errors import EnvError

if TYPE_CHECKING:
    from relayrl.rewards.sandbox import Isolation


def _normalise(text: str) -> str:
    return " ".join(str(text).strip().split())


def _first_prompt(row: dict[str, Any], env: str) -> str | list[dict[str, Any]]:
    if row.get("messages"):
        return row["messages"]
    if isinstance(row.get("prompt"), (str, list)):  # a list: a chat in `prompt` (TRL, verl)
        return row["prompt"]
    raise EnvError(f"env {env!r}: the row needs a 'prompt' or 'messages' column, got {sorted(row)}")


def _answer(row: dict[str, Any], env: str) -> str:
    if row.get("answer") is None:
        raise EnvError(f"env {env!r}: the row needs an 'answer' column, got {sorted(row)}")
    return _normalise(row["answer"])


class AnswerEnv:
    """One answer, right (1.0) or not; the trajectory ends with it."""

    def reset(self, row: dict[str, Any]):
        self.answer = _answer(row, "answer")
        return _first_prompt(row, "answer")

    def step(self, action: str) -> Step:
        success = _normalise(action) == self.answer
        return Step(None, float(success), True, {"success": success})


class RetryEnv:
    """Answer; a wrong answer hears `feedback` and tries again (the driver stops it at env.max_turns)."""

    def __init__(self, feedback: str = "wrong, again:"):
        self.feedback = feedback

    def reset(self, row: dict[str, Any]):
        self.answer = _answer(row, "retry")
        return _first_prompt(row, "retry")

    def step(self, action: str) -> Step:
        if _normalise(action) == self.answer:
            return Step(None, 1.0, True, {"success": True})
        return Step(self.feedback, 0.0, False, {"success": False})


_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def evaluate_arithmetic(expression: str) -> float | int:
    """The value of a plain arithmetic expression; anything else (names, calls, huge powers) raises ValueError."""

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPERATORS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)[:40]}")

    try:
        return value(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ZeroDivisionError, OverflowError, RecursionError) as err:
        raise ValueError(str(err)) from None


class CalculatorEnv:
    """`<calc>expr</calc>` gets the value as a `tool` turn (or a user turn, `role="user"`), written into `reply`;
    anything else is the answer. Tool calls are counted in info["tool_calls"]."""

    stop = ("</calc>",)

    def __init__(self, role: str = "tool", open_tag: str = "<calc>", close_tag: str = "</calc>", reply: str = "{}"):
        self.role, self.open_tag, self.close_tag, self.reply = role, open_tag, close_tag, reply
        self.stop = (close_tag,)

    def reset(self, row: dict[str, Any]):
        self.answer = _answer(row, "calculator")
        return _first_prompt(row, "calculator")

    def step(self, action: str) -> Step:
        start = action.rfind(self.open_tag)
        if start >= 0 and action.rstrip().endswith(self.close_tag):
            expression = action[start + len(self.open_tag) : action.rstrip().rfind(self.close_tag)]
            try:
                result = evaluate_arithmetic(expression)
                shown = str(int(result)) if float(result).is_integer() else f"{result:.6g}"
            except ValueError:
                shown = "error"
            return Step({"role": self.role, "content": self.reply.format(shown)}, 0.0, False, {"tool_calls": 1})
        success = _normalise(action) == self.answer
        return Step(None, float(success), True, {"success": success})


class CodeFeedbackEnv:
    """The program must pass the row's `tests`; failing output comes back (at most `feedback_chars` of it)."""

    def __init__(self, isolation: Isolation = "auto", feedback_chars: int = 400, **limits: Any):
        from relayrl.rewards.sandbox import SandboxLimits

        self.isolation: Isolation = isolation
        self.feedback_chars = feedback_chars
        self.limits = SandboxLimits(**limits)

    def reset(self, row: dict[str, Any]):
        if row.get("tests") is None:
            raise EnvError(f"env 'code_feedback': the row needs a 'tests' column, got {sorted(row)}")
        self.tests = row["tests"]
        return _first_prompt(row, "code_feedback")

    def step(self, action: str) -> Step:
        from relayrl.rewards.code import extract_program
        from relayrl.rewards.sandbox import run_tests

        report = run_tests(extract_program(action), self.tests, self.limits, self.isolation)
        if report.pass_fraction == 1.0:
            return Step(None, 1.0, True, {"success": True})
        failed = next(r for r in report.results if not r.passed)
        output = (failed.run.stdout + failed.run.stderr)[-self.feedback_chars :]
        message = (
            f"{sum(r.passed for r in report.results)}/{len(report.results)} tests pass; {failed.reason}:\n{output}"
        )
        return Step(message, 0.0, False, {"success": False, "pass_fraction": report.pass_fraction})


BUILTINS: dict[str, type] = {
    "answer": AnswerEnv,
    "retry": RetryEnv,
    "calculator": CalculatorEnv,
    "code_feedback": CodeFeedbackEnv,
}
