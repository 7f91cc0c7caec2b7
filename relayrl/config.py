"""The typed config tree: YAML file + dotted `key=value` overrides, strict keys, a resolved dump.

Every section forbids unknown keys. Every unknown key of the file and the overrides is reported at once,
each with its full path and the nearest real key (also in another section, or the key another framework's
name means: `relayrl/config_aliases.py`); a wrong type fails naming the key. Relative input paths become
absolute as `relayrl/config_paths.py` rules, so a dumped config re-runs anywhere. What cannot be
derived has a default here, documented by its field description; nothing downstream calls `.get()`.
The sections are in `relayrl/config_sections.py`; this module holds the root, the rules across sections,
loading, overrides and the messages.
"""

from __future__ import annotations

import copy
import difflib
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, PrivateAttr, ValidationError, model_serializer, model_validator
from pydantic_core import to_jsonable_python

from relayrl.config_algorithm import AlgorithmConfig, CorrectionConfig, CriticConfig, DAPOConfig, KLConfig  # noqa: F401 - the sections, re-exported from here
from relayrl.config_aliases import foreign_name
from relayrl.config_paths import Bases, origins, resolve_tree, section_model, warn
from relayrl.config_sections import (  # noqa: F401 - the sections, re-exported from here
    CheckpointConfig,
    DataConfig,
    EvalConfig,
    LogConfig,
    ModelConfig,
    PlacementConfig,
    RewardComponentConfig,
    RewardConfig,
    RolloutConfig,
    Section,
    SyncConfig,
    TrainConfig,
    warn_lora,
)
from relayrl.envs.config import EnvConfig
from relayrl.errors import ConfigError
from relayrl.learner.memory_settings import LearnerSettings, check_learner


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-5` as a float (YAML 1.1 insists on a dot: `1.0e-5`)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


class Config(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    learner: LearnerSettings = Field(default_factory=LearnerSettings)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    sync: SyncConfig = Field(default_factory=SyncConfig)
    _engine_choice: Any = PrivateAttr(None)  # what `rollout.engine: auto` chose, and why (relayrl/rollout/choice.py)

    @model_validator(mode="after")
    def _resolve_engine(self) -> "Config":
        if self.rollout.engine == "auto":  # vllm or hf, decided here once; a dump writes `auto` back, and why
            from relayrl.rollout.choice import resolve_auto

            resolve_auto(self)
        if self.rollout.tensor_parallel > 1:  # vLLM ranks: auto's choice, heads and cores (relayrl/rollout/vllm_tp.py)
            from relayrl.rollout.vllm_tp import check_tensor_parallel

            check_tensor_parallel(self)
        if self.model.lora is not None and self.sync.lora == "auto":  # adapter or merged, decided here once
            from relayrl.sync.lora import resolve_lora_auto

            resolve_lora_auto(self)
        return self

    @model_serializer(mode="wrap")
    def _dump_engine_as_asked(self, handler) -> dict:
        """`auto` where auto chose: a reloaded dump (a resume, `relayrl.train`'s reload) chooses again, noted."""
        tree = handler(self)
        if self._engine_choice is not None and isinstance(tree, dict) and isinstance(tree.get("rollout"), dict):
            tree["rollout"]["engine"] = self._engine_choice.as_asked(tree["rollout"].get("engine"))
        return tree

    @property
    def rollout_batch(self) -> int:
        return self.rollout.prompts_per_step * self.rollout.n

    @property
    def mini_batch(self) -> int:
        return self.train.mini_batch or self.rollout_batch

    @property
    def updates_per_step(self) -> int:
        """Optimizer steps per training step: mini-batches per rollout batch x epochs."""
        return (self.rollout_batch // self.mini_batch) * self.train.epochs

    @model_validator(mode="after")
    def _check_batches(self) -> "Config":
        if self.rollout_batch % self.mini_batch:
            raise ValueError(
                f"train.mini_batch={self.mini_batch} must divide the rollout batch "
                f"(rollout.prompts_per_step * rollout.n = {self.rollout_batch})"
            )
        group_relative = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")
        if self.rollout.min_tokens > self.rollout.max_tokens:
            raise ValueError(
                f"rollout.min_tokens={self.rollout.min_tokens} exceeds rollout.max_tokens={self.rollout.max_tokens}"
            )
        if self.algorithm.dapo.overlong_buffer > self.rollout.max_tokens:
            raise ValueError(
                f"algorithm.dapo.overlong_buffer={self.algorithm.dapo.overlong_buffer} must not exceed "
                f"rollout.max_tokens={self.rollout.max_tokens}"
            )
        transport = self.sync.transport
        if self.placement.mode == "local" and transport not in ("auto", "inprocess"):
            raise ValueError(
                f"sync.transport={transport} needs placement.mode=ray (under local, every role shares "
                "one process and weights move in-process)"
            )
        if self.placement.mode == "ray" and transport == "inprocess":
            raise ValueError(
                "sync.transport=inprocess needs placement.mode=local; under ray use shm, broadcast, "
                "disk or object_store"
            )
        if self.train.schedule != "sync" and self.placement.mode != "ray":
            raise ValueError(
                f"train.schedule={self.train.schedule} overlaps generation with training, which needs "
                "separate processes: set placement.mode=ray"
            )
        if self.train.partial_rollouts and (
            self.train.schedule != "async" or self.train.on_stale != "drop" or self.train.partial_rollouts < 1
        ):
            raise ValueError(
                "train.partial_rollouts needs train.schedule=async with train.on_stale=drop and a factor "
                ">= 1 (a carried response holds tokens of older versions, which wait's admission "
                "control cannot account for)"
            )
        if self.train.schedule != "sync" and self.algorithm.dapo.dynamic_sampling:
            raise ValueError(
                f"algorithm.dapo.dynamic_sampling works with train.schedule=sync only, not {self.train.schedule}"
            )
        if self.placement.mode == "ray" and self.rollout.engine == "hf":
            raise ValueError("placement.mode=ray runs vLLM engines; set rollout.engine=vllm")
        if self.algorithm.kl.controller == "adaptive" and self.algorithm.kl.coef == 0:
            raise ValueError("algorithm.kl.controller=adaptive needs an initial algorithm.kl.coef > 0")
        if self.algorithm.advantage in group_relative and self.rollout.n < 2:
            raise ValueError(
                f"rollout.n must be at least 2 for {self.algorithm.advantage} (advantages are relative within a group)"
            )
        return self


# ---------------------------------------------------------------------------- loading


def load_config(path: str | Path | None = None, overrides: list[str] = (), base: dict | None = None) -> Config:
    """Read YAML (or start from `base`), apply `key=value` overrides, validate strictly.

    Every unknown key of `base`, the file and the overrides is reported at once. Relative input paths are
    made absolute: a file's against its directory (else the working directory), the rest against the
    working directory (`relayrl/config_paths.py` states the rule).
    """
    file_tree = read_yaml(path) if path is not None else {}
    if _is_resolved_dump(file_tree):  # a saved config.yaml: only what differs from a default was a choice
        file_tree = _without_defaults(file_tree)
    parsed = [parse_override(override) for override in overrides]
    unknown = _unknown_keys(base or {}, "base") + _unknown_keys(file_tree, str(path))
    for key, value in parsed:
        unknown += _unknown_keys(_one_key_tree(key, value), "the overrides")
    if unknown:
        raise ConfigError(_unknown_message(unknown))
    tree = _deep_merge(copy.deepcopy(base or {}), file_tree)  # overrides must not write into `base`
    origin = {**origins(base or {}, Bases()), **origins(file_tree, Bases(path))}
    for key, value in parsed:
        _set_dotted(tree, key, value)
        origin.update(origins(_one_key_tree(key, value), Bases()))
    tree = resolve_tree(tree, origin)
    source = " + ".join(filter(None, ["defaults" if path is None else str(path), "overrides" if parsed else ""]))
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
    """The resolved config as YAML: every key, so that loading it gives back an equal config.

    `reward.fn`/`kwargs` are left out beside `reward.components`, which replaces them (setting both fails).
    """
    tree = config.model_dump(mode="json")
    if config.reward.components:
        for key in ("fn", "kwargs"):
            del tree["reward"][key]
    text = yaml.safe_dump(tree, sort_keys=False)
    return text if config._engine_choice is None else config._engine_choice.noted(text)


def warn_ineffective(config: Config) -> None:
    """Name settings that cannot take effect in the chosen mode (a `ConfigWarning` each)."""
    _warn_algorithm(config)
    warn_lora(config)  # relayrl/config_sections.py: a LoRA run at a full fine-tuning learning rate
    check_learner(config)  # relayrl/learner/memory_settings.py: an offload that cannot take effect
    train = config.train
    if train.schedule != "async" and train.model_fields_set & {"max_staleness", "on_stale"}:
        names = ", ".join(f"train.{k}" for k in sorted(train.model_fields_set & {"max_staleness", "on_stale"}))
        warn(f"{names} has no effect under train.schedule={train.schedule}")
    if train.schedule != "sync" and config.checkpoint.every:
        lost = {"one_step_off": "the batch in flight is drawn again and generated with the checkpoint's weights"}
        warn(
            f"checkpoints under train.schedule={train.schedule} resume the learner exactly but not the rollouts in "
            f"flight ({lost.get(train.schedule, 'the groups in flight or buffered are dropped, not drawn again')}): "
            "a resumed run is not a replay of an uninterrupted one"
        )
    off_policy = train.schedule == "one_step_off" or (train.schedule == "async" and train.max_staleness > 0)
    if off_policy and config.algorithm.correction.mode == "none":
        warn(
            f"train.schedule={train.schedule} trains on samples from older policies without correction; "
            "consider algorithm.correction.mode=tis_token"
        )
    placement = config.placement
    if placement.mode == "local" and placement.model_fields_set - {"mode"}:
        names = ", ".join(f"placement.{k}" for k in sorted(placement.model_fields_set - {"mode"}))
        warn(f"{names} has no effect under placement.mode=local")
    transport = effective_transport(config)
    if idle := sorted(config.sync.model_fields_set - SYNC_KEYS[transport]):
        names = ", ".join(f"sync.{k}" for k in idle)
        warn(f"{names} has no effect with the {transport} transport")


def _warn_algorithm(config: Config) -> None:
    algo = config.algorithm
    if algo.kl.coef == 0 and "estimator" in algo.kl.model_fields_set:
        warn("algorithm.kl.estimator has no effect while algorithm.kl.coef is 0")
    if config.rollout.engine == "hf" and "kv_cache_gib" in config.rollout.model_fields_set:
        chosen = " (auto's choice)" if config._engine_choice is not None else ""
        warn(f"rollout.kv_cache_gib has no effect with rollout.engine=hf{chosen}")
    if algo.kl.coef == 0 and algo.kl.model_fields_set - {"coef", "estimator"}:
        names = ", ".join(f"algorithm.kl.{k}" for k in sorted(algo.kl.model_fields_set - {"coef", "estimator"}))
        warn(f"{names} has no effect while algorithm.kl.coef is 0")
    if algo.correction.mode == "none" and algo.correction.model_fields_set - {"mode"}:
        warn("algorithm.correction settings have no effect while algorithm.correction.mode is none")
    if not algo.dapo.dynamic_sampling and "max_rounds" in algo.dapo.model_fields_set:
        warn("algorithm.dapo.max_rounds has no effect without algorithm.dapo.dynamic_sampling")
    if algo.advantage != "gae" and config.critic.model_fields_set:
        warn(
            f"critic.{', critic.'.join(sorted(config.critic.model_fields_set))} has no effect: a critic "
            "is built only for algorithm.advantage=gae"
        )
    if algo.policy_loss == "ppo_clip" and algo.clip_eps < 0.01:
        warn(f"algorithm.clip_eps={algo.clip_eps} is a GSPO-sized range; ppo_clip usually uses ~0.2")
    if config.data.eval is None and config.eval.model_fields_set:
        warn(f"eval.{', eval.'.join(sorted(config.eval.model_fields_set))} has no effect without data.eval")


# The sync settings each transport reads: the in-process transport hands tensors over (no wire, no deadline) but
# still runs the parity probe; only the disk transport writes into a directory.
_WIRE = {"transport", "bucket_mb", "wire_dtype", "checksum", "parity_probe", "timeout_s", "lora"}
SYNC_KEYS = {
    "inprocess": {"transport", "parity_probe", "lora"},
    "shm": _WIRE,
    "broadcast": _WIRE,
    "object_store": _WIRE,
    "disk": _WIRE | {"directory"},
}


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
        if (sub := section_model(field.annotation)) is not None:
            paths.extend(_all_paths(sub, path + "."))
    return paths


def _leaf_paths(tree: dict, model: type[BaseModel] = Config, prefix: str = "") -> set[str]:
    paths = set()
    for key, value in tree.items():
        sub = model.model_fields[key].annotation if key in model.model_fields else None
        if isinstance(sub, type) and issubclass(sub, BaseModel) and isinstance(value, dict):
            paths |= _leaf_paths(value, sub, f"{prefix}{key}.")
        else:
            paths.add(f"{prefix}{key}")
    return paths


def _is_resolved_dump(tree: dict) -> bool:
    """Whether `tree` sets every key, as `dump_config` writes it (reward.fn/kwargs may give way to components)."""
    every = _leaf_paths(Config().model_dump()) - {"reward.fn", "reward.kwargs"}
    return every <= _leaf_paths(tree)


def _without_defaults(tree: dict, model: type[BaseModel] = Config) -> dict:
    """`tree` less the keys whose value is their default, so that settings-without-effect warnings name only
    what a resolved dump changed (its every key is set, which would otherwise warn about all of them)."""
    kept = {}
    for key, value in tree.items():
        field = model.model_fields.get(key)
        sub = field.annotation if field is not None else None
        if isinstance(sub, type) and issubclass(sub, BaseModel) and isinstance(value, dict):
            kept[key] = _without_defaults(value, sub)
        elif (
            field is None
            or field.is_required()
            or value != to_jsonable_python(field.get_default(call_default_factory=True))
        ):
            kept[key] = value
    return kept


def _one_key_tree(key: str, value: Any) -> dict:
    tree: dict[str, Any] = {}
    _set_dotted(tree, key, value)
    return tree


def _unknown_keys(tree: dict, source: str, model: type[BaseModel] = Config, prefix: str = "") -> list[str]:
    """Every unknown key in `tree` (and every section given a value), each with its nearest known key."""
    found = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        field = model.model_fields.get(key)
        if field is None:
            found.append(f"unknown config key '{path}' (in {source}){_suggest(path, key, model)}")
            continue
        sub, items = section_model(field.annotation), _section_items(field.annotation)
        if sub is not None and value is not None:  # an optional section may be given null
            if not isinstance(value, dict):
                found.append(
                    f"'{path}' is a section (in {source}); give it keys, e.g. {path}.{next(iter(sub.model_fields))}=..."
                )
                continue
            found += _unknown_keys(value, source, sub, path + ".")
        elif items is not None and isinstance(value, list):  # e.g. reward.components: a list of sections
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    found += _unknown_keys(item, source, items, f"{path}.{i}.")
    return found


def _section_items(annotation: Any) -> type[BaseModel] | None:
    """The item section of a `list[SomeSection]` field, else None."""
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item
    return None


def _unknown_message(found: list[str]) -> str:
    return found[0] if len(found) == 1 else f"{len(found)} config keys are wrong:\n  " + "\n  ".join(found)


def _suggest(path: str, key: str, model: type[BaseModel]) -> str:
    if (foreign := foreign_name(path)) is not None:
        note = f"; {foreign.note}" if foreign.note else ""
        return f"; did you mean '{foreign.key}'? ({foreign.name} is its name in {foreign.frameworks}{note})"
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
