"""Relative paths in a config: the directory each is taken against, and the absolute form a run saves.

The rule (the field descriptions and `docs/config.md` state it too):
- An input path (`model.path`, `critic.path`, `teacher.path`, `data.train`, `data.eval`, a reward's `file.py:function`, the
  environment's `env.fn` `file.py:Class`, a tool's `env.tools` `file.py:function`) written in a config file is taken against the config file's directory; when nothing of that name exists
  there, against the working directory (configs written for the directory they are run from keep working).
  So is the model directory of the `reward_model` and `judge` rewards (`kwargs.path`, `kwargs.model`), when
  it exists in one of them (else it is left as written: its reward reports it).
  One given as an override (or in a `base` tree) is taken against the working directory.
- A reward `module:function` (or `env.fn` `module:Class`) whose module is a file in one of those directories
  (`rewards.py`, or `pkg/mod.py` for `pkg.mod`) becomes that file's absolute `file.py:function` (imported as a
  file, so a package's relative imports need the package installed); otherwise the module must be importable.
  Built-in names (`exact_match`, `retry`) stay as written.
- Output paths (`log.dir`, `sync.directory`) are relative to the working directory, wherever they are written,
  and made absolute against it when set (log.dir's default, `runs/default`, stays as the default is), so the
  printed and saved config says where the run writes. A relative log.dir that leads outside the working directory (`../../runs/x`) draws a warning naming
  the key and the absolute path.
- A `data.train`/`data.eval` of the form `reasoning_gym:TASK...` or `verifiers:TASKSET...` names a generated dataset,
  an `env.fn` of the form `skyrl_gym:ID`, `gymnasium:ID` or `verifiers:TASKSET` an installed package's environment:
  each stays as written.
- Relative input paths are made absolute when the config is loaded, so the resolved config a run saves
  (`<log.dir>/config.yaml`) re-runs from any directory, writing where the run wrote. An input path found in none of its directories is
  taken against the working directory and draws a warning naming every directory looked in; a reward file
  or module found nowhere is an error, since no run can start without it.
"""

from __future__ import annotations

import copy
import importlib.util
import os
from pathlib import Path
from typing import Any

from relayrl.config.warn import warn
from relayrl.errors import ConfigError

INPUT_PATHS = ("model.path", "critic.path", "teacher.path", "data.train", "data.eval")
DATA_SPECS = (
    "reasoning_gym:",
    "verifiers:",
)  # data.train/eval values that name a generated dataset, not a file (never resolved)
# env.fn values naming an installed package's environment (relayrl/envs/ecosystem.py), never a module to resolve
ENV_SPECS = ("skyrl_gym:", "gymnasium:", "verifiers:")
TRL_SPEC = "trl:"  # trl:module:Class or trl:path/file.py:Class: the rest is resolved as any spec
PATH_KEYS = INPUT_PATHS + ("reward.fn", "reward.kwargs", "reward.components", "env.fn", "env.agent", "env.tools")
OUTPUT_PATHS = ("log.dir", "sync.directory")  # against the working directory, whoever sets them
MODEL_KWARGS = {"reward_model": "path", "judge": "model"}  # built-in rewards' model-directory keywords


class Bases:
    """The directories a relative path is tried against, in order, each with how messages name it."""

    def __init__(self, config_file: str | Path | None = None):
        cwd = Path.cwd()
        self.named = [(cwd, "the working directory")]
        if config_file is not None:
            here, name = Path(os.path.abspath(config_file)).parent, Path(config_file).name
            self.named = [(here, f"the directory of {name}")] + [(cwd, "the working directory")] * (here != cwd)

    @property
    def dirs(self) -> tuple[Path, ...]:
        return tuple(directory for directory, _ in self.named)

    def describe(self) -> str:
        return " or ".join(f"{directory} ({name})" for directory, name in self.named)

    def find(self, relative: str) -> Path | None:
        for base in self.dirs:
            if (base / relative).exists():
                return Path(os.path.normpath(base / relative))
        return None


def origins(tree: dict[str, Any], bases: Bases) -> dict[str, Bases]:
    """{key: bases} for each path-valued key that this layer (base, file or one override) sets."""
    found = {}
    for key in PATH_KEYS:
        section, name = key.split(".")
        if isinstance(tree.get(section), dict) and name in tree[section]:
            found[key] = bases
    return found


def resolve_tree(tree: dict[str, Any], origin: dict[str, Bases]) -> dict[str, Any]:
    """A copy of the merged tree whose relative input paths and reward specs are absolute, each against the
    bases of the layer that set it last (`origin`, from `origins`)."""
    tree = copy.deepcopy(tree)
    for key in INPUT_PATHS:
        section, name = key.split(".")
        node = tree.get(section)
        if key not in origin or not isinstance(node, dict) or not isinstance(node.get(name), str) or not node[name]:
            continue
        if not (section == "data" and node[name].startswith(DATA_SPECS)):
            node[name] = resolve_path(key, node[name], origin[key])
    _resolve_outputs(tree)
    env = tree.get("env")
    for name in ("fn", "agent"):
        if isinstance(env, dict) and isinstance(env.get(name), str) and env[name] and f"env.{name}" in origin:
            if name == "fn" and env[name].startswith(ENV_SPECS):
                continue
            prefix = TRL_SPEC if env[name].startswith(TRL_SPEC) else ""  # trl:path/file.py:Class (agents/trl_env.py)
            spec = env[name].removeprefix(prefix)
            env[name] = prefix + resolve_reward_spec(f"env.{name}", spec, origin[f"env.{name}"])
    if isinstance(env, dict) and isinstance(env.get("tools"), list) and "env.tools" in origin:
        for i, tool in enumerate(env["tools"]):  # a function's spec as env.fn's; a schema and a built-in stay
            if isinstance(tool, str):
                env["tools"][i] = resolve_reward_spec(f"env.tools.{i}", tool, origin["env.tools"])
    reward = tree.get("reward")
    if not isinstance(reward, dict):
        return tree
    if isinstance(reward.get("fn"), str) and "reward.fn" in origin:
        reward["fn"] = resolve_reward_spec("reward.fn", reward["fn"], origin["reward.fn"])
    if "reward.kwargs" in origin:
        _resolve_model_kwarg("reward", reward, origin["reward.kwargs"])
    if isinstance(reward.get("components"), list) and "reward.components" in origin:
        for i, component in enumerate(reward["components"]):
            if isinstance(component, dict) and isinstance(component.get("fn"), str):
                bases = origin["reward.components"]
                component["fn"] = resolve_reward_spec(f"reward.components.{i}.fn", component["fn"], bases)
                _resolve_model_kwarg(f"reward.components.{i}", component, bases)
    return tree


def _resolve_outputs(tree: dict[str, Any]) -> None:
    """`log.dir` and `sync.directory` absolute, against the working directory, when set."""
    for key in OUTPUT_PATHS:
        section, name = key.split(".")
        node = tree.get(section)
        if isinstance(node, dict) and isinstance(node.get(name), str) and node[name]:
            node[name] = output_path(key, node[name])


def output_path(key: str, value: str) -> str:
    """`value` absolute against the working directory; a relative one leading out of it is warned about."""
    path = Path(value).expanduser()
    if path.is_absolute():
        return os.path.normpath(path)
    cwd = Path.cwd()
    found = Path(os.path.normpath(cwd / path))
    if key == "log.dir" and not found.is_relative_to(cwd):
        warn(f"{key}={value!r} leads outside the working directory {cwd}: the run writes to {found}")
    return str(found)


def _resolve_model_kwarg(prefix: str, spec: dict[str, Any], bases: Bases) -> None:
    """The model directory a built-in reward takes as a keyword (`reward_model`'s path, `judge`'s model), where
    it exists; otherwise it stays as written (the reward names it, and a judge's model may be a hub name)."""
    name = MODEL_KWARGS.get(spec.get("fn", "exact_match"))
    kwargs = spec.get("kwargs")
    if name and isinstance(kwargs, dict) and isinstance(kwargs.get(name), str) and kwargs[name]:
        kwargs[name] = str(bases.find(str(Path(kwargs[name]).expanduser())) or kwargs[name])


def resolve_path(key: str, value: str, bases: Bases) -> str:
    path = Path(value).expanduser()
    if path.is_absolute():
        return str(path)
    found = bases.find(str(path))
    if found is None:
        found = Path(os.path.normpath(bases.dirs[-1] / path))  # the working directory, as before this rule
        warn(f"{key} '{value}' does not exist relative to {bases.describe()}; it stands for {found}")
    return str(found)


def resolve_reward_spec(key: str, spec: str, bases: Bases) -> str:
    """`file.py:fn` and beside-the-config `module:fn` -> `/abs/file.py:fn`; built-ins and importable modules stay.
    The same for an environment class (`env.fn`)."""
    target, colon, function = spec.rpartition(":")
    if not colon or not target:
        return spec  # a built-in name (or a malformed spec, which loading the reward reports)
    if target.endswith(".py"):
        file = Path(target).expanduser()
        if file.is_absolute():
            return spec
        if (found := bases.find(str(file))) is None:
            raise ConfigError(f"{key}={spec!r}: {target} does not exist relative to {bases.describe()}")
        return f"{found}:{function}"
    relative = target.replace(".", "/")
    for candidate in (f"{relative}.py", f"{relative}/__init__.py"):
        if (found := bases.find(candidate)) is not None:
            return f"{found}:{function}"
    if _importable(target):
        return spec
    raise ConfigError(
        f"{key}={spec!r}: no module '{target}': neither {relative}.py relative to "
        f"{bases.describe()} nor an importable module of that name"
    )


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def section_model(annotation: Any) -> Any:
    """The section class of a field typed `Section` or `Section | None` (an optional section such as
    `model.lora`), else None: the unknown-key check and its suggestions walk both alike."""
    import typing

    from pydantic import BaseModel

    options = typing.get_args(annotation) if type(None) in typing.get_args(annotation) else (annotation,)
    sections = [t for t in options if isinstance(t, type) and issubclass(t, BaseModel)]
    return sections[0] if sections else None
