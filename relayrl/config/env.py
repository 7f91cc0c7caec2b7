"""The `env.*` config section: multi-turn rollouts, each turn answered by an environment class (with tools or not)
or every call made by an agent program through an OpenAI-compatible endpoint. The root `Config` holds it as `env`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from relayrl.config.section import Section


class EnvConfig(Section):
    """Multi-turn rollouts: an environment answers each turn (relayrl/envs/), with tools or not, or an agent program
    makes the calls (relayrl/agents/). Off while `fn`, `agent` and `tools` are empty."""

    fn: str = Field(
        default="",
        description="Environment class: a built-in (answer, retry, calculator, code_feedback), `skyrl_gym:ENV_ID`, "
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
    tools: list[str | dict[str, Any]] = Field(
        default_factory=list,
        description="Tools for the environment's trajectories, offered through the chat template's tools=: a "
        "built-in (calculate), `module:function` or `path/file.py:function` (its schema from type hints and "
        "docstring), or an OpenAI function schema run by the environment's method of that name. A turn that "
        "calls tools gets their results; the first turn without a call goes to the environment's step (env.fn "
        "empty: the built-in `answer`, checked against the row's answer). relayrl/envs/tools.py.",
    )
    tool_parser: str = Field(
        default="",
        description="vLLM tool parser reading the model's tool calls (hermes, llama3_json, ...), for env.tools and "
        "for an agent's `tools=` calls; '' = the one the chat template's format names (hermes for <tool_call>, "
        "llama3_json for <|python_tag|>); with none, an agent's first call with tools= stops the run.",
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
        default=30.0,
        gt=0,
        description="Seconds one environment step (or reset) may take; its worker is then killed. An agent "
        "(env.agent): its own time before each model call and before it returns (not the time a call waits for the "
        "engine); then it is cancelled.",
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
        default="fork",
        description="When a turn's prompt cannot continue the trajectory's tokens (the chat template changes "
        "earlier turns, or an agent's call rewrites its history): keep the sample so far and start a new one "
        "there, both trained with the trajectory's reward and advantage (counted in tito/forks); stop with an "
        "error naming the sample (strict); or re-render the history, its earlier turns then not trained "
        "(retokenize).",
    )

    @model_validator(mode="after")
    def _one_kind(self):
        if self.fn and self.agent:
            raise ValueError(
                f"env.fn={self.fn!r} and env.agent={self.agent!r} are both set: a trajectory is answered either by an "
                "environment class or by an agent program (set one of them)"
            )
        offers_own = self.agent or self.fn.startswith(("trl:", "verifiers:"))
        if self.tools and offers_own:
            owner = f"env.agent={self.agent!r}" if self.agent else f"env.fn={self.fn!r}"
            raise ValueError(
                f"env.tools is for environment classes; {owner} offers its own tools (an agent passes tools= in "
                "its calls, a TRL class's methods and a verifiers environment's tools are its own)"
            )
        for i, tool in enumerate(self.tools):
            if isinstance(tool, dict) and not (
                tool.get("type") == "function" and isinstance(tool.get("function"), dict)
            ):
                raise ValueError(
                    f"env.tools.{i}: an OpenAI function schema is {{type: function, function: {{name, description, "
                    f"parameters}}}}, got {tool!r}"
                )
        return self

    @property
    def env_class(self) -> str:
        """The environment class's spec: env.fn, or the built-in `answer` for a tools-only config."""
        return self.fn or ("answer" if self.tools else "")

    @property
    def multi_turn(self) -> bool:
        """Trajectories of several turns: an environment (fn) or an agent answers each turn."""
        return bool(self.fn or self.agent or self.tools)
