"""The typed config tree: YAML file + dotted `key=value` overrides, strict keys, a resolved dump.

Every section forbids unknown keys. A misspelt key fails with its full path and the nearest real key
(also when the key exists in another section); a wrong type fails naming the key. What cannot be
derived has a default here, documented by its field description; nothing downstream calls `.get()`.
The sections are in `relayrl/config_sections.py`; this module holds the root, the rules across sections,
loading, overrides and the messages.
"""

from __future__ import annotations

import copy
import difflib
import re
import warnings
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from relayrl.config_sections import (  # noqa: F401 - the sections, re-exported from here
    Section,
    ModelConfig,
    DataConfig,
    RewardComponentConfig,
    RewardConfig,
    RolloutConfig,
    KLConfig,
    CorrectionConfig,
    CriticConfig,
    DAPOConfig,
    AlgorithmConfig,
    TrainConfig,
    EvalConfig,
    LogConfig,
    CheckpointConfig,
    PlacementConfig,
    SyncConfig,
)
from relayrl.errors import ConfigError


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-5` as a float (YAML 1.1 insists on a dot: `1.0e-5`)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


class Config(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    sync: SyncConfig = Field(default_factory=SyncConfig)

    @property
    def rollout_batch(self) -> int:
        return self.rollout.prompts_per_step * self.rollout.n

    @property
    def mini_batch(self) -> int:
        return self.train.mini_batch or self.rollout_batch

    @model_validator(mode="after")
    def _check_batches(self) -> "Config":
        if self.rollout_batch % self.mini_batch:
            raise ValueError(
                f"train.mini_batch={self.mini_batch} must divide the rollout batch "
                f"(rollout.prompts_per_step * rollout.n = {self.rollout_batch})"
            )
        group_relative = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")
        if self.rollout.min_tokens > self.rollout.max_tokens:
            raise ValueError(f"rollout.min_tokens={self.rollout.min_tokens} exceeds rollout.max_tokens="
                             f"{self.rollout.max_tokens}")
        if self.algorithm.dapo.overlong_buffer > self.rollout.max_tokens:
            raise ValueError(f"algorithm.dapo.overlong_buffer={self.algorithm.dapo.overlong_buffer} must not exceed "
                             f"rollout.max_tokens={self.rollout.max_tokens}")
        transport = self.sync.transport
        if self.placement.mode == "local" and transport not in ("auto", "inprocess"):
            raise ValueError(f"sync.transport={transport} needs placement.mode=ray (under local, every role shares "
                             "one process and weights move in-process)")
        if self.placement.mode == "ray" and transport == "inprocess":
            raise ValueError("sync.transport=inprocess needs placement.mode=local; under ray use shm, broadcast, "
                             "disk or object_store")
        if self.train.schedule != "sync" and self.placement.mode != "ray":
            raise ValueError(f"train.schedule={self.train.schedule} overlaps generation with training, which needs "
                             "separate processes: set placement.mode=ray")
        if self.train.partial_rollouts and (self.train.schedule != "async" or self.train.on_stale != "drop"
                                            or self.train.partial_rollouts < 1):
            raise ValueError("train.partial_rollouts needs train.schedule=async with train.on_stale=drop and a factor "
                             ">= 1 (a carried response holds tokens of older versions, which wait's admission "
                             "control cannot account for)")
        if self.train.schedule != "sync" and self.algorithm.dapo.dynamic_sampling:
            raise ValueError(f"algorithm.dapo.dynamic_sampling works with train.schedule=sync only, "
                             f"not {self.train.schedule}")
        if self.placement.mode == "ray" and self.rollout.engine != "vllm":
            raise ValueError("placement.mode=ray runs vLLM engines; set rollout.engine=vllm")
        if self.algorithm.kl.controller == "adaptive" and self.algorithm.kl.coef == 0:
            raise ValueError("algorithm.kl.controller=adaptive needs an initial algorithm.kl.coef > 0")
        if self.algorithm.advantage in group_relative and self.rollout.n < 2:
            raise ValueError(f"rollout.n must be at least 2 for {self.algorithm.advantage} "
                             "(advantages are relative within a group)")
        return self


# ---------------------------------------------------------------------------- loading


def load_config(path: str | Path | None = None, overrides: list[str] = (), base: dict | None = None) -> Config:
    """Read YAML (or start from `base`), apply `key=value` overrides, validate strictly."""
    tree: dict[str, Any] = copy.deepcopy(base or {})  # overrides must not write into the caller's dict
    source = "defaults"
    if path is not None:
        source = str(path)
        tree = _deep_merge(tree, read_yaml(path))
    if overrides:
        source += " + overrides"
    for override in overrides:
        key, value = parse_override(override)
        _set_dotted(tree, key, value)
    _check_keys(tree, Config, prefix="")
    try:
        config = Config.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_describe(err, source)) from None
    warn_ineffective(config)
    return config


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        tree = yaml.load(path.read_text(), Loader=_Loader) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(tree).__name__}")
    return tree


def parse_override(text: str) -> tuple[str, Any]:
    """`train.lr=1e-5` -> ("train.lr", 1e-05); the value is parsed as YAML (so lists and nulls work)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not of the form section.key=value")
    try:
        value = yaml.load(raw, Loader=_Loader) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def dump_config(config: Config) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def warn_ineffective(config: Config) -> None:
    """Name settings that cannot take effect in the chosen mode."""
    if config.algorithm.kl.coef == 0 and "estimator" in config.algorithm.kl.model_fields_set:
        warnings.warn("algorithm.kl.estimator has no effect while algorithm.kl.coef is 0", stacklevel=3)
    if config.rollout.engine == "hf" and "kv_cache_gib" in config.rollout.model_fields_set:
        warnings.warn("rollout.kv_cache_gib has no effect with rollout.engine=hf", stacklevel=3)
    algo = config.algorithm
    if algo.kl.coef == 0 and algo.kl.model_fields_set - {"coef", "estimator"}:
        names = ", ".join(f"algorithm.kl.{k}" for k in sorted(algo.kl.model_fields_set - {"coef", "estimator"}))
        warnings.warn(f"{names} has no effect while algorithm.kl.coef is 0", stacklevel=3)
    if algo.correction.mode == "none" and algo.correction.model_fields_set - {"mode"}:
        warnings.warn("algorithm.correction settings have no effect while algorithm.correction.mode is none",
                      stacklevel=3)
    if not algo.dapo.dynamic_sampling and "max_rounds" in algo.dapo.model_fields_set:
        warnings.warn("algorithm.dapo.max_rounds has no effect without algorithm.dapo.dynamic_sampling",
                      stacklevel=3)
    if algo.advantage != "gae" and config.critic.model_fields_set:
        warnings.warn(f"critic.{', critic.'.join(sorted(config.critic.model_fields_set))} has no effect: a critic "
                      "is built only for algorithm.advantage=gae", stacklevel=3)
    if algo.policy_loss == "ppo_clip" and algo.clip_eps < 0.01:
        warnings.warn(f"algorithm.clip_eps={algo.clip_eps} is a GSPO-sized range; ppo_clip usually uses ~0.2",
                      stacklevel=3)
    if config.data.eval is None and config.eval.model_fields_set:
        warnings.warn(f"eval.{', eval.'.join(sorted(config.eval.model_fields_set))} has no effect without data.eval",
                      stacklevel=3)
    train = config.train
    if train.schedule != "async" and train.model_fields_set & {"max_staleness", "on_stale"}:
        names = ", ".join(f"train.{k}" for k in sorted(train.model_fields_set & {"max_staleness", "on_stale"}))
        warnings.warn(f"{names} has no effect under train.schedule={train.schedule}", stacklevel=3)
    if train.schedule != "sync" and config.checkpoint.every:
        warnings.warn(f"checkpoints under train.schedule={train.schedule} resume the learner exactly but not the "
                      "rollouts in flight: a resumed run is not a replay of an uninterrupted one", stacklevel=3)
    if train.schedule != "sync" and algo.correction.mode == "none":
        warnings.warn(f"train.schedule={train.schedule} trains on samples from older policies without correction; "
                      "consider algorithm.correction.mode=tis_token", stacklevel=3)
    placement = config.placement
    if placement.mode == "local" and placement.model_fields_set - {"mode"}:
        names = ", ".join(f"placement.{k}" for k in sorted(placement.model_fields_set - {"mode"}))
        warnings.warn(f"{names} has no effect under placement.mode=local", stacklevel=3)
    if effective_transport(config) == "inprocess" and config.sync.model_fields_set - {"transport"}:
        names = ", ".join(f"sync.{k}" for k in sorted(config.sync.model_fields_set - {"transport"}))
        warnings.warn(f"{names} has no effect with the inprocess transport", stacklevel=3)


def effective_transport(config: Config) -> str:
    """`sync.transport`, with `auto` resolved for the placement."""
    if config.sync.transport != "auto":
        return config.sync.transport
    return "inprocess" if config.placement.mode == "local" else "shm"


def _deep_merge(base: dict, update: dict) -> dict:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: {'.'.join(parts[: i + 1])} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _all_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    paths = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        paths.append(path)
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            paths.extend(_all_paths(sub, path + "."))
    return paths


def _check_keys(tree: dict, model: type[BaseModel], prefix: str) -> None:
    """Unknown keys fail with their full path and the closest known key."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        field = model.model_fields.get(key)
        if field is None:
            raise ConfigError(f"unknown config key '{path}'{_suggest(path, key, model)}")
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            if not isinstance(value, dict):
                raise ConfigError(f"'{path}' is a section; give it keys, e.g. {path}.{next(iter(sub.model_fields))}=...")
            _check_keys(value, sub, path + ".")


def _suggest(path: str, key: str, model: type[BaseModel]) -> str:
    local = difflib.get_close_matches(key, list(model.model_fields), n=1, cutoff=0.6)
    prefix = path[: -len(key)]
    if local:
        return f"; did you mean '{prefix}{local[0]}'?"
    everywhere = _all_paths(Config)
    leaf_matches = [p for p in everywhere if p.rsplit(".", 1)[-1] == key]
    if leaf_matches:
        return f"; did you mean '{leaf_matches[0]}'?"
    close = difflib.get_close_matches(path, everywhere, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else f"; known keys here: {', '.join(model.model_fields)}"


def _describe(err: ValidationError, source: str) -> str:
    lines = []
    for item in err.errors():
        if not item["loc"]:  # a cross-section check (model validator): its message names the keys
            lines.append(item["msg"].removeprefix("Value error, "))
            continue
        key = ".".join(str(part) for part in item["loc"])
        got = "" if item["type"] == "missing" or "input" not in item else f" (got {item['input']!r})"
        lines.append(f"{key}: {item['msg']}{got}")
    return f"invalid config ({source}):\n  " + "\n  ".join(lines)
