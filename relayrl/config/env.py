"""The `env.*` config section (multi-turn rollouts: an environment class, or an agent program calling the
policy through an OpenAI-compatible endpoint). Its own module: relayrl/config/sections.py is at its line budget.
The root `Config` (relayrl/config/) holds it as `env`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from relayrl.config.sections import Section


class EnvConfig(Section):
    """Multi-turn rollouts: an environment answers each turn (relayrl/envs/), or an agent program makes the calls
    (relayrl/agents/). Off while `fn` and `agent` are empty."""

    fn: str = Field(
        default="",
        description="Environment class: a built-in (retry, calculator, code_feedback), `skyrl_gym:ENV_ID`, "
        "`gymnasium:ENV_ID` (a text game), `verifiers:TASKSET` (a verifiers environment, its episodes run on the "
        "run's endpoint; docs/ecosystem.md), `trl:module:Class` (a TRL environment_factory class, docs/agents.md), "
        "`module:Class` or `path/file.py:Class`, one instance per trajectory; "
        "'' = single-turn rollouts (unless env.agent is set). Resolved as reward.fn.",
    )
    agent: str = Field(
        default="",
        description="An agent program instead of an environment: `module:function` or `path/file.py:function`, "
        "called as agent(client, row, **env.kwargs) with an OpenAI client served by the run's engines, one call "
        "per trajectory; it returns the reward (or {reward, success}). relayrl/agents/. Resolved as reward.fn.",
    )
    tool_parser: str = Field(
        default="",
        description="vLLM tool parser for the agent's `tools=` calls (hermes, llama3_json, ...): the model's tool "
        "calls come back as OpenAI tool_calls; '' = none (tool calls stay in the text).",
    )
    reasoning_parser: str = Field(
        default="",
        description="vLLM reasoning parser for the agent's calls (deepseek_r1, qwen3, ...): the thinking comes back "
        "as message.reasoning, and a tool call written inside it is not parsed; '' = none.",
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the environment class (or of the agent function)."
    )
    max_turns: int = Field(default=4, ge=1, description="Model turns per trajectory at most; the trajectory then ends.")
    max_total_tokens: int = Field(
        default=512,
        ge=1,
        description="Tokens after the first prompt (model and observation turns) per trajectory at most; with "
        "the longest prompt it must fit the model's context (checked at start).",
    )
    max_tokens_per_turn: int = Field(
        default=0, ge=0, description="Tokens one model turn may generate; 0 = rollout.max_tokens."
    )
    on_overflow: Literal["truncate", "drop"] = Field(
        default="truncate",
        description="A trajectory over max_total_tokens: keep it cut at the limit and flagged "
        "(env/truncated_frac), or drop it from the batch.",
    )
    timeout_s: float = Field(
        default=30.0, gt=0, description="Seconds one environment step (or reset) may take; its worker is then killed."
    )
    on_error: Literal["error", "zero", "skip"] = Field(
        default="error",
        description="An environment that raises, times out or returns a malformed step: fail naming the "
        "trajectory, end it with reward 0, or drop it. Counted as env/errors, env/timeouts.",
    )
    reward: Literal["sum", "final", "discounted"] = Field(
        default="sum",
        description="A trajectory's reward from its turns' rewards for the group estimators: their sum, the last "
        "one, or sum of gamma^t * r_t (earlier success is worth more). A reward.fn set as well is added. gae and "
        "reinforce_pp(_baseline) put each turn's reward on the turn's last token instead (discounted by algorithm.gamma).",
    )
    gamma: float = Field(default=0.9, gt=0, le=1, description="Discount per turn of env.reward=discounted.")
    max_inflight: int = Field(
        default=16,
        ge=1,
        description="Trajectories in flight at once (one environment worker process each), per driver: under "
        "one_step_off and async the background trajectories (one set per async producer) have workers of their own.",
    )
    tito: Literal["strict", "fork", "retokenize"] = Field(
        default="strict",
        description="When the chat template would change earlier tokens: stop with an error naming the turn, "
        "start a new sample from that point, or re-render the history (earlier turns then not trained).",
    )

    @model_validator(mode="after")
    def _one_kind(self):
        if self.fn and self.agent:
            raise ValueError(
                f"env.fn={self.fn!r} and env.agent={self.agent!r} are both set: a trajectory is answered either by an "
                "environment class or by an agent program (set one of them)"
            )
        return self

    @property
    def multi_turn(self) -> bool:
        """Trajectories of several turns: an environment (fn) or an agent answers each turn."""
        return bool(self.fn or self.agent)
