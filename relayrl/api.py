"""The Python entry points for notebooks and scripts: `relayrl.train(...)` and `relayrl.load_config(...)`.

`train` takes what a notebook holds: a config (a YAML path, a dict or a `Config`), a reward as a function (or a
list of them, a weighted combination), and prompts as a list of dicts, a `datasets.Dataset` or a file path. It
turns them into the config a `relayrl train` run takes, so the saved `config.yaml` re-runs:
- in-memory prompts are written to `<log.dir>/data/train.jsonl` (and `eval.jsonl`), and those paths go in;
- a module-level function goes in as `module:function` (a script's `__main__` one as `path/file.py:function`
  when reward workers import it), which is how reward workers receive it: by reference, as pickle would;
- a lambda or a function defined inside another one cannot be imported by name: under `reward.workers > 0` it
  is refused; with `reward.workers=0` it is used in this process through a small registry (this module's
  `in_process_reward_<n>_<name>` attributes, which `load_reward` finds like any module attribute), and the
  run warns that its saved config names a function only this process has.
The run itself is `relayrl.build.train` (the step is relayrl/controller.py); the CLI's `train` command calls `train` here too.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relayrl.errors import ConfigError, DataError, RelayWarning

if TYPE_CHECKING:
    from relayrl.config import Config

_IN_PROCESS: dict[str, Callable] = {}  # spec attribute name -> reward function used in this process only


@dataclass
class TrainResult:
    """What a run leaves: its directory, held-out scores before and after (as in eval.json) and the last
    metrics row (metrics.jsonl)."""

    run_dir: Path
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def __getattr__(name: str) -> Callable:
    """`relayrl.api:in_process_reward_<n>_<name>`: how `load_reward` finds a function registered by `train`."""
    if name in _IN_PROCESS:
        return _IN_PROCESS[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_config(config: Any = None, overrides: list[str] | tuple[str, ...] = ()):
    """A `Config` from a YAML path, a dict of sections or a `Config`, with dotted `key=value` overrides applied
    and every key checked, as `relayrl train CONFIG key=value ...` does.

    It returns the validated tree, its `auto` settings (`rollout.engine`, `sync.lora`, `rollout.sleep`,
    `learner.offload`, `sync.wire_dtype`) still `auto`: loading imports no torch, vLLM or Ray, and the choices
    belong to the machine that runs the config. `train` makes them before it prints the config;
    `relayrl.build.resolve(config)` makes them in place (once) for a caller that reads them. A `Config` passed
    in without overrides comes back as a copy, resolved if it was."""
    from relayrl import config as config_module

    if config is None or isinstance(config, (str, Path)):
        return config_module.load_config(config, list(overrides), stacklevel=2)
    if isinstance(config, config_module.Config):
        return (
            config_module.load_config(None, list(overrides), base=_tree(config), stacklevel=2)
            if overrides
            else config.model_copy(deep=True)
        )
    if isinstance(config, dict):
        return config_module.load_config(None, list(overrides), base=config, stacklevel=2)
    raise ConfigError(
        f"config must be a YAML path, a dict of sections or a relayrl Config, got {type(config).__name__}"
    )


def train(
    config: Any,
    reward: Any = None,
    train_data: Any = None,
    eval_data: Any = None,
    agent: Any = None,
    tools: list[Any] | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    resume: str | None = None,
    overwrite: bool = False,
    show_config: bool = True,
) -> TrainResult:
    """Run RL training and return its `TrainResult`. `reward`: a function `fn(prompts, completions, **columns)`,
    a spec string, or a list of them (each also `{"fn": ..., "weight": w, "name": ..., "kwargs": {...}}`);
    `train_data`/`eval_data`: an iterable of row dicts (a list, a `datasets.Dataset`, ...) or a file path. None
    keeps the config's. `agent`: an agent function `fn(client, row)` (or a spec string) for `env.agent`
    (relayrl/agents/); a function is called in this process, so it may be a lambda or a notebook's. `tools`:
    `env.tools` (relayrl/envs/tools.py), each a module-level function, a spec string or an OpenAI schema; a tool
    runs in the environment workers, which import it by name, so a lambda or a notebook's function is refused."""
    from relayrl.build import resolve
    from relayrl.build import train as run_training
    from relayrl.config import dump_config

    loaded = load_config(config, overrides)
    tree = _tree(loaded)
    # reward specs as computed (a refused function fails before anything is written); not through load_config,
    # whose path rules would re-import `relayrl.api` as a file, without the functions registered in it
    section = None if reward is None else _reward_tree(tree.get("reward", {}), reward, loaded.reward.workers)
    if agent is not None:
        tree.setdefault("env", {})["agent"] = agent if isinstance(agent, str) else register_agent(agent)
    if tools is not None:
        tree.setdefault("env", {})["tools"] = [tool_spec(tool) for tool in tools]
    run_dir = Path(loaded.log.dir)
    for split, rows in (("train", train_data), ("eval", eval_data)):
        if rows is not None:
            tree.setdefault("data", {})[split] = _data_path(rows, split, run_dir, resume is not None or overwrite)
    final = load_config(tree) if tree != _tree(loaded) else loaded
    if section is not None:
        final.reward = type(final.reward).model_validate(section)
    resolve(final, stacklevel=2)  # the `auto` choices, so the printed config notes each with its reason
    if show_config:
        print(dump_config(final))
    result = run_training(final, resume=resume, overwrite=overwrite)
    return TrainResult(
        Path(final.log.dir),
        _short(result.get("before", {})),
        _short(result.get("after", {})),
        _last_metrics(Path(final.log.dir) / "metrics.jsonl"),
    )


def register_agent(function: Any) -> str:
    """The spec of an agent function given in Python: by name when its module holds it, else registered here
    (agents run in the driver's process, so no other process needs to import it)."""
    if not callable(function):
        raise ConfigError(
            f"agent must be a function agent(client, row) or a spec string, got {type(function).__name__}"
        )
    module, name = getattr(function, "__module__", ""), getattr(function, "__qualname__", "")
    by_name = module and module != "__main__" and "<" not in name and "." not in name
    if by_name and getattr(sys.modules.get(module), name, None) is function:
        return f"{module}:{name}"
    key = f"agent_{len(AGENTS)}"
    AGENTS[key] = function
    return f"relayrl.api:AGENTS.{key}"


def tool_spec(tool: Any) -> str | dict:
    """A tool given in Python as `env.tools` holds it: a function by its `module:name` (its module importable)."""
    if isinstance(tool, str | dict):
        return tool
    module, name = getattr(tool, "__module__", ""), getattr(tool, "__qualname__", "")
    if callable(tool) and module and module != "__main__" and getattr(sys.modules.get(module), name, None) is tool:
        return f"{module}:{name}"
    raise ConfigError(
        f"tools: {tool!r} is not a module-level function of an importable module, a spec string or an OpenAI "
        "schema: the environment workers import each tool by name (define it in a .py file and import it from there)"
    )


AGENTS: dict[str, Any] = {}  # agent functions given to `train` that no module holds by name (lambdas, notebooks)


def _tree(config: Config) -> dict:
    """A Config as the dict `load_config(base=...)` takes: what differs from a default (so that only those keys
    are warned about), with a set `reward.components` in place of fn/kwargs/style."""
    from relayrl.config.load import _without_defaults

    tree = _without_defaults(config.model_dump(mode="json"))
    if tree.get("reward", {}).get("components"):
        for key in ("fn", "kwargs", "style"):
            tree["reward"].pop(key, None)
    return tree


# ---------------------------------------------------------------------------- rewards


def _reward_tree(current: dict, reward: Any, workers: int) -> dict:
    """The `reward` section with `reward` in place of its fn (or components): specs, not functions."""
    kept = {k: v for k, v in current.items() if k not in ("fn", "kwargs", "style", "components")}
    if isinstance(reward, (list, tuple)):
        components = [_component(item, workers, f"reward[{i}]") for i, item in enumerate(reward)]
        return {**kept, "components": components}
    spec, kwargs = reward_spec(reward, workers, "reward")
    return {**kept, "fn": spec, "kwargs": kwargs}


def _component(item: Any, workers: int, where: str) -> dict:
    entry = dict(item) if isinstance(item, dict) else {"fn": item}
    function = entry.get("fn", None)
    if function is None:
        raise ConfigError(f"{where}: a reward component dict needs 'fn' (a function or spec), got {sorted(entry)}")
    spec, kwargs = reward_spec(function, workers, where)
    if not isinstance(function, str) and not entry.get("name"):
        entry["name"] = re.sub(r"[^A-Za-z0-9_.-]", "_", getattr(_unwrap(function)[0], "__name__", "reward"))
    return {**entry, "fn": spec, "kwargs": {**kwargs, **entry.get("kwargs", {})}}


def _unwrap(fn: Any) -> tuple[Any, dict]:
    """A `functools.partial` of keyword arguments is its function plus `reward.kwargs`."""
    if isinstance(fn, functools.partial) and not fn.args:
        return fn.func, dict(fn.keywords)
    return fn, {}


def reward_spec(reward: Any, workers: int, where: str = "reward") -> tuple[str, dict]:
    """(spec, kwargs) for a reward given as a spec string or a function, as `reward.fn`/`kwargs` name it."""
    if isinstance(reward, str):
        return reward, {}
    fn, kwargs = _unwrap(reward)
    if not callable(fn):
        raise ConfigError(
            f"{where} must be a function fn(prompts, completions, **columns) or a spec string, got "
            f"{type(reward).__name__}"
        )
    module_name, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    module = sys.modules.get(module_name or "")
    by_name = (
        module is not None and "." not in qualname and "<" not in qualname and getattr(module, qualname, None) is fn
    )
    if by_name and module_name != "__main__":
        return f"{module_name}:{qualname}", kwargs
    main_file = getattr(module, "__file__", None) if by_name else None
    if workers > 0:
        if main_file:  # workers import the script as a file (it needs an `if __name__ == "__main__":` guard)
            return f"{Path(main_file).resolve()}:{qualname}", kwargs
        what = (
            f"{qualname!r} is defined in a notebook or interactive session"
            if by_name
            else f"{qualname or type(fn).__name__!r} is a lambda, a function defined inside another function, or an "
            "object"
        )
        raise ConfigError(
            f"{where}: {what}; reward workers (reward.workers={workers}) are separate processes that "
            "import the reward by name: define it at module level or use reward.workers=0"
        )
    return _register(fn, qualname or type(fn).__name__), kwargs


def _register(fn: Callable, label: str) -> str:
    """Register `fn` for this process; its spec names this module, where `load_reward` finds it."""
    name = f"in_process_reward_{len(_IN_PROCESS) + 1}_{re.sub(r'[^A-Za-z0-9_]', '_', label)}"
    _IN_PROCESS[name] = fn
    warnings.warn(
        f"reward {label!r} is used in this process only: the run's config.yaml names it "
        f"relayrl.api:{name}, which a new process cannot load; define it at module level in a .py file "
        "to make the saved config re-run",
        RelayWarning,
        stacklevel=4,
    )
    return f"relayrl.api:{name}"


# ---------------------------------------------------------------------------- data


def _data_path(rows: Any, split: str, run_dir: Path, replacing: bool) -> str:
    """A file path for `data.<split>`: a path as given, in-memory rows written to `<run_dir>/data/<split>.jsonl`."""
    if isinstance(rows, (str, Path)):
        return str(Path(rows).expanduser().resolve())
    if not replacing:
        from relayrl.run.directory import run_markers

        if found := run_markers(run_dir):  # as claim() says, before this run writes into someone's run
            raise ConfigError(
                f"log.dir={run_dir} already holds a run ({', '.join(found)}): pass "
                f"resume={str(run_dir)!r} to continue it, or overwrite=True to replace it (or choose "
                "another log.dir)"
            )
    lines = [_jsonl_line(row, f"{split}_data[{index}]") for index, row in enumerate(_rows(rows, split))]
    if not lines:
        raise DataError(f"{split}_data is empty: give at least one row such as {{'prompt': '1+1=', 'answer': '2'}}")
    path = run_dir.resolve() / "data" / f"{split}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(lines))
    tmp.replace(path)
    return str(path)


def _rows(rows: Any, split: str):
    """Any iterable of row dicts: a list, a `datasets.Dataset`, a reasoning-gym dataset, a generator."""
    if isinstance(rows, (list, tuple)):
        return rows
    if not isinstance(rows, (str, bytes, dict)) and isinstance(rows, Iterable):
        return iter(rows)
    raise DataError(
        f"{split}_data must be an iterable of row dicts (a list, a datasets.Dataset, ...) or a file path, got "
        f"{type(rows).__name__}"
    )


def _jsonl_line(row: Any, where: str) -> str:
    if not isinstance(row, dict):
        raise DataError(f"{where} is a {type(row).__name__}, not a row dict such as {{'prompt': ..., 'answer': ...}}")
    try:
        return json.dumps(row) + "\n"
    except (TypeError, ValueError) as err:
        raise DataError(f"{where}: cannot be written as JSON ({err}); give plain str/number/list/dict values") from None


def _short(scores: dict[str, float]) -> dict[str, float]:
    """`eval/greedy` -> `greedy`, as eval.json names them."""
    return {key.split("/")[-1]: value for key, value in scores.items()}


def _last_metrics(path: Path) -> dict[str, float]:
    lines = path.read_text().splitlines() if path.is_file() else []
    for line in reversed(lines):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line
    return {}
