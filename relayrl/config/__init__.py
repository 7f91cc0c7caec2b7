"""The typed config tree: one pydantic model per section, strict keys, loaded from YAML plus dotted overrides.

- root.py: `Config`, the sections it holds, the batch sizes derived from them, the rules across sections;
- section.py: the base of every section; the sections, each module one owner's settings, every key with its type,
  default, bounds and one-line description (`docs/config.md`: docs.py): model.py (`model`, `model.lora`), data.py
  (`data`, `eval`), reward.py, env.py, rollout.py, algorithm.py (`algorithm`, `critic`), train.py, learner.py,
  placement.py, sync.py, log.py (`log`, `checkpoint`), teacher.py (`teacher`, `algorithm.distill`);
- load.py: files, overrides, unknown keys with a "did you mean", messages naming the key, the dump;
- effects.py: settings that cannot take effect in the chosen mode, warned about by name;
- paths.py: which directory a relative path is taken against; aliases.py: other frameworks' key names.

A leaf: it imports nothing of relayrl but `errors` (and `types`), so importing it, loading a file and checking a
tree load no runtime code (no torch, no engine, no Ray). The `auto` choices (`rollout.engine`, `sync.lora`,
`rollout.sleep`, ...) are made afterwards, on the machine that runs the config, by `relayrl.build.resolve`.
"""

from relayrl.config.algorithm import AlgorithmConfig, CorrectionConfig, CriticConfig, DAPOConfig, KLConfig
from relayrl.config.data import DataConfig, EvalConfig
from relayrl.config.effects import warn_ineffective
from relayrl.config.env import EnvConfig
from relayrl.config.learner import LearnerConfig
from relayrl.config.load import dump_config, load_config, parse_override, read_yaml
from relayrl.config.log import CheckpointConfig, LogConfig, SamplesConfig
from relayrl.config.model import LoraConfig, ModelConfig
from relayrl.config.placement import PlacementConfig
from relayrl.config.reward import RewardComponentConfig, RewardConfig
from relayrl.config.rollout import RolloutConfig
from relayrl.config.root import Config
from relayrl.config.section import Section
from relayrl.config.sync import SYNC_KEYS, SyncConfig, effective_transport
from relayrl.config.teacher import DistillConfig, RoutedTeacher, TeacherConfig
from relayrl.config.train import TrainConfig

__all__ = [
    "SYNC_KEYS",
    "AlgorithmConfig",
    "CheckpointConfig",
    "Config",
    "CorrectionConfig",
    "CriticConfig",
    "DAPOConfig",
    "DataConfig",
    "DistillConfig",
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
    "SamplesConfig",
    "Section",
    "SyncConfig",
    "RoutedTeacher",
    "TeacherConfig",
    "TrainConfig",
    "dump_config",
    "effective_transport",
    "load_config",
    "parse_override",
    "read_yaml",
    "warn_ineffective",
]
