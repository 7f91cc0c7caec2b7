"""The typed config tree: one pydantic model per section, strict keys, loaded from YAML plus dotted overrides.

- root.py: `Config`, the sections it holds, the batch sizes derived from them, the rules across sections;
- section.py: the base of every section; sections.py, rollout.py, algorithm.py, env.py, lora.py, learner.py: the
  sections, every key with its type, default, bounds and one-line description (`docs/config.md`: docs.py);
- load.py: files, overrides, unknown keys with a "did you mean", messages naming the key, the resolved dump;
- resolve.py: the `auto` choices, each made by the package that owns it;
- effects.py: settings that cannot take effect in the chosen mode, warned about by name;
- paths.py: which directory a relative path is taken against; aliases.py: other frameworks' key names.

Importing this package or validating a tree loads no runtime code (no torch, no engine): the sections are data.
"""

from relayrl.config.algorithm import AlgorithmConfig, CorrectionConfig, CriticConfig, DAPOConfig, KLConfig
from relayrl.config.effects import SYNC_KEYS, effective_transport, warn_ineffective
from relayrl.config.env import EnvConfig
from relayrl.config.learner import LearnerConfig
from relayrl.config.load import dump_config, load_config, parse_override, read_yaml
from relayrl.config.lora import LoraConfig
from relayrl.config.resolve import resolve
from relayrl.config.root import Config
from relayrl.config.sections import (
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
)

__all__ = [
    "SYNC_KEYS",
    "AlgorithmConfig",
    "CheckpointConfig",
    "Config",
    "CorrectionConfig",
    "CriticConfig",
    "DAPOConfig",
    "DataConfig",
    "EnvConfig",
    "EvalConfig",
    "KLConfig",
    "LearnerConfig",
    "LogConfig",
    "LoraConfig",
    "ModelConfig",
    "PlacementConfig",
    "RewardComponentConfig",
    "RewardConfig",
    "RolloutConfig",
    "Section",
    "SyncConfig",
    "TrainConfig",
    "dump_config",
    "effective_transport",
    "load_config",
    "parse_override",
    "read_yaml",
    "resolve",
    "warn_ineffective",
]
