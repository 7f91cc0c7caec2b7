"""A verifiers (v1 API) environment, written only against `verifiers.v1`: the toy addition task, two attempts.

Installed verifiers environments are packages named by id (`arith-retry` imports `arith_retry`); this one is a
module on `sys.path` (PYTHONPATH=examples/verifiers_env). It exports, through `__all__`, what verifiers looks for:

- `ArithTaskset`, the dataset: one `ArithTask` per row of a jsonl file of `{prompt, answer}` rows
  (`path`, e.g. the demo's toy task), optionally only the first `limit` rows.
- `ArithTask`, the rubric: `correct` (weight 1) is 1 when the final reply is the answer, halved for each
  retry it took (`gamma`); `attempts` is a metric.
- `ArithRetryEnv`, the multi-turn hook: the agent answers; a wrong answer hears `feedback` and answers again,
  up to `attempts` in all (verifiers' `Interaction`: the env is the user).

Nothing in it knows about relayrl: `vf-eval arith-retry` would run it against any OpenAI-compatible model.

    relayrl train examples/verifiers_env/config.yaml    (see config.yaml: the demo's warm start and toy task)
"""

from __future__ import annotations

import json
from pathlib import Path

import verifiers.v1 as vf
from pydantic import Field

__all__ = ["ArithRetryEnv", "ArithTaskset"]


class ArithData(vf.TaskData):
    answer: str
    """The exact reply that is right."""


class ArithTaskConfig(vf.TaskConfig):
    gamma: float = Field(0.5, ge=0, le=1)
    """A right answer on retry k (0-based) scores gamma**k."""


class ArithTask(vf.Task[ArithData, vf.State, ArithTaskConfig]):
    @vf.reward
    async def correct(self, task: ArithData, trace: vf.Trace) -> float:
        reply = (trace.root_reply or _last_reply(trace)).strip()
        return self.config.gamma ** max(trace.num_turns - 1, 0) if reply == task.answer else 0.0

    @vf.metric
    async def attempts(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


def _last_reply(trace: vf.Trace) -> str:
    sampled = [node.message for node in trace.nodes if node.sampled]
    return str(sampled[-1].content or "") if sampled else ""


class ArithTasksetConfig(vf.TasksetConfig):
    task: ArithTaskConfig = ArithTaskConfig()
    path: Path | None = None
    """A jsonl file of {prompt, answer} rows."""
    limit: int | None = Field(None, ge=1)
    """Only the first `limit` rows."""


class ArithTaskset(vf.Taskset[ArithTask, ArithTasksetConfig]):
    def load(self):
        if self.config.path is None:
            raise ValueError("arith-retry needs taskset.path: a jsonl file of {prompt, answer} rows")
        with open(self.config.path) as rows:
            for number, line in enumerate(rows):
                if self.config.limit is not None and number >= self.config.limit:
                    return
                row = json.loads(line)
                yield ArithTask(ArithData(prompt=row["prompt"], answer=str(row["answer"])), self.config.task)


class ArithRetryEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()
    feedback: str = "+"
    """What a wrong answer hears."""
    attempts: int = Field(2, ge=1)
    """Answers per episode at most."""


class ArithRetryEnv(vf.Env[ArithRetryEnvConfig]):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as chat:
            segment = await chat.turn()
            for _ in range(self.config.attempts - 1):
                if segment.terminated or segment.last_reply == task.data.answer:
                    break
                segment = await chat.turn(self.config.feedback)
