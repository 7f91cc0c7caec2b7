"""What `relayrl serve` reads from relayrl's config (`relayrl serve [CONFIG] [key=value ...]`, loaded as `relayrl
train` loads one): the `rollout` section builds each base model's sampling engine (`rollout.engine`: vllm, hf, or
auto as training chooses; its memory: `kv_cache_gib`, `gpu_memory_utilization`, `dtype`, ...), `train.seed` seeds
it, `model.path` is one more served base (named by its path), and `log.dir`, when the config sets it, is the
service's run directory (relayrl/service/run_log.py), with `log.backends` beside its metrics.jsonl. Sliced here into `ServiceSettings`, the service's own
settings object, as relayrl/placement/sections.py slices the config for a run's roles.

Leaves out: placement (one process; `placement.mode=ray` is refused), the learner's sections (each training client
sets its own LoRA rank and Adam parameters per call), the sync transport (weights go to the engine by reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from relayrl.errors import ConfigError

if TYPE_CHECKING:
    from relayrl.config import Config, ModelConfig, RolloutConfig
    from relayrl.rollout.build import EngineSettings


@dataclass(frozen=True)
class ServiceSettings:
    rollout: RolloutConfig  # the engine each base samples with, and its memory
    model: ModelConfig  # model.* an engine reads besides its path (its LoRA is never set: weights come merged)
    seed: int  # train.seed: the engine's own seed (each request's `seed` still picks its sample)
    run_dir: Path | None  # log.dir when the config sets it: metrics.jsonl, timeline.jsonl, config.yaml
    config_yaml: str = ""  # the config as loaded, written to run_dir
    backends: tuple[str, ...] = ()  # log.backends: trackers beside metrics.jsonl
    params: dict | None = None  # the config as a dict, which the backends record

    def engine_settings(self, base_path: str) -> EngineSettings:
        """The engine settings of one base: `rollout.engine: auto` resolved for its size, as training resolves it."""
        from relayrl.rollout.build import EngineSettings
        from relayrl.rollout.choice import choose_engine
        from relayrl.rollout.memory import resolve_engine_share

        engine, share = self.rollout.engine, self.rollout.gpu_memory_utilization
        if engine == "auto":
            engine = choose_engine(base_path, "local").engine
        if share == "auto":  # as for an engine with its GPU alone: the service places no learner rank beside it
            share = resolve_engine_share(colocated=False, judge=None)[0]
        rollout = self.rollout.model_copy(update={"engine": engine, "gpu_memory_utilization": share})
        model = self.model.model_copy(update={"path": base_path, "lora": None})
        return EngineSettings(rollout, model, self.seed, lora_sync="merged", kept_versions=1)


# The keys a service reads (a prefix ending in "." reads the whole section); any other key the config sets is named
# in one warning, since a config never silently drops a setting.
READ_KEYS = ("rollout.", "model.", "train.seed", "log.dir", "log.backends", "placement.mode")


def load_service_config(path: str | None, overrides: list[str]) -> Config:
    from relayrl.config import load_config
    from relayrl.config.warn import warn

    config = load_config(path, overrides, stacklevel=3)
    if config.placement.mode != "local":
        raise ConfigError(
            f"placement.mode={config.placement.mode}: relayrl serve runs in one process for now; use placement.mode=local"
        )
    if unread := unread_keys(config):
        warn(
            f"relayrl serve does not read {', '.join(unread)}: a service's losses, optimizer and data come with "
            "each request (it reads rollout.*, model.*, train.seed, log.dir and log.backends)",
            stacklevel=3,
        )
    return config


def unread_keys(section, prefix: str = "") -> list[str]:
    """The keys set in `section` (a config or one of its sections) that a service does not read, as dotted paths."""
    from pydantic import BaseModel

    keys = []
    for name in sorted(section.model_fields_set):
        path, value = f"{prefix}{name}", getattr(section, name)
        if any(path == read or path.startswith(read) for read in READ_KEYS):
            continue
        keys.extend(unread_keys(value, f"{path}.") if isinstance(value, BaseModel) else [path])
    return keys


def service_settings(config: Config | None = None) -> ServiceSettings:
    """The service's settings from `config` (None: relayrl's defaults, no run directory)."""
    from relayrl.config import dump_config, load_config

    config = config or load_config(None, [])
    run_dir = Path(config.log.dir) if "dir" in config.log.model_fields_set else None
    backends, params = tuple(config.log.backends), config.model_dump(mode="json")
    return ServiceSettings(
        config.rollout, config.model, config.train.seed, run_dir, dump_config(config), backends, params
    )


def served_bases(models: list[str], config: Config | None) -> list[str]:
    """`--model` items, then the config's `model.path` (named by its path) when it sets one."""
    if config is not None and config.model.path and config.model.path not in models:
        return [*models, config.model.path]
    return models
