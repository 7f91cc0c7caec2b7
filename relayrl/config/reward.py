"""The `reward` section: the reward function (or a weighted combination, `reward.components`), how it is called,
where it runs (reward workers) and what a failing one does."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from relayrl.config.section import Section
from relayrl.config.warn import warn


class RewardComponentConfig(Section):
    """One reward function of a weighted combination (`reward.components`)."""

    fn: str = Field(
        description="Built-in name, `module:function` or `path/file.py:function` (resolved as `reward.fn`)."
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments bound to the function.")
    weight: float = Field(default=1.0, description="Its weight in the reward: reward = sum of weight * component.")
    name: str = Field(
        default="",
        pattern=r"^[A-Za-z0-9_.-]*$",
        description="Logged as reward/<name>; empty = the function's name (`math`, `score` of `m:score`).",
    )
    style: Literal["auto", "relayrl", "trl", "verl"] = Field(
        default="auto",
        description="How the function is called: relayrl's fn(prompts, completions, **columns), TRL's (by "
        "keyword), verl's compute_score (per sample); auto = read from its signature.",
    )

    @property
    def label(self) -> str:
        return self.name or self.fn.rpartition(":")[2]


class RewardConfig(Section):
    fn: str = Field(
        default="exact_match",
        description="Built-in name (exact_match, math, regex, code, reward_model, judge, reasoning_gym) or "
        "`module:function` or "
        "`path/file.py:function`. The file, or a module's `module.py`, is looked for as data.train is "
        "(a module beside the config file imports); else the module must be importable.",
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments bound to the reward function "
        "(reward_model's `path`, judge's `model`: a "
        "relative directory is looked for as data.train).",
    )
    components: list[RewardComponentConfig] = Field(
        default_factory=list,
        description="Several reward functions, each `{fn, kwargs, weight, name}`: reward = sum of weight * component, "
        "each logged as reward/<name>. Set this or `fn`/`kwargs`, not both.",
    )
    style: Literal["auto", "relayrl", "trl", "verl"] = Field(
        default="auto",
        description="How reward.fn is called: relayrl's fn(prompts, completions, **columns), TRL's (by "
        "keyword), verl's compute_score (per sample); auto = read from its signature.",
    )
    on_error: Literal["error", "zero", "skip"] = Field(
        default="error",
        description="A reward that raises, times out or is not a finite number: fail naming the sample, "
        "score it 0, or drop the sample from the batch. Counted as reward/errors, reward/timeouts.",
    )
    workers: int = Field(
        default=0,
        ge=0,
        description="Reward worker processes scoring in parallel; 0 = score in the training process "
        "(no timeouts: a hanging reward hangs the run).",
    )
    timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="With workers: seconds one sample may take; a sample over it is killed with its "
        "worker (replaced) and handled per on_error. A batch gets timeout_s per sample.",
    )
    batch_size: int = Field(
        default=8, ge=1, description="With workers: samples per call of a reward function in a worker."
    )
    max_error_frac: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="Stop when a reward function fails (raises, times out, not a number) on this "
        "share or more of a scored batch (warned once past half); 1 = when all fail.",
    )

    @model_validator(mode="after")
    def _check_components(self) -> RewardConfig:
        if self.components and self.model_fields_set & {"fn", "kwargs", "style"}:
            raise ValueError(
                "reward.components replaces reward.fn and reward.kwargs: set one or the other "
                "(a single function is `components: [{fn: ..., kwargs: ...}]`)"
            )
        labels = [c.label for c in self.components]
        if duplicated := sorted({label for label in labels if labels.count(label) > 1}):
            raise ValueError(
                f"reward.components: the name {duplicated[0]!r} is used twice; give each component "
                "a distinct `name` (it is logged as reward/<name>)"
            )
        if self.workers == 0 and self.model_fields_set & {"timeout_s", "batch_size"}:
            warn("reward.timeout_s and reward.batch_size have no effect with reward.workers=0")
        return self

    def resolved_components(self) -> list[RewardComponentConfig]:
        """`components`, or the single `fn`/`kwargs` as one component of weight 1."""
        return list(self.components) or [RewardComponentConfig(fn=self.fn, kwargs=self.kwargs, style=self.style)]
