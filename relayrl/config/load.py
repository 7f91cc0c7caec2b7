"""Loading the config tree: a YAML file (or a base tree) + dotted `key=value` overrides, strict keys, a resolved dump.

Every section forbids unknown keys. Every unknown key of the file and the overrides is reported at once, each with
its full path and the nearest real key (also in another section, or the key another framework's name means:
relayrl/config/aliases.py); a wrong type fails naming the key. Relative input paths become absolute as
relayrl/config/paths.py rules, so a dumped config re-runs anywhere. A loaded config is validated, then checked for
settings that cannot take effect (relayrl/config/effects.py). Its `auto` choices are left as `auto`: they are made on
the machine that runs it, by `relayrl.build.resolve`, which `dump_config` then notes beside each `auto` key.
"""

from __future__ import annotations

import copy
import difflib
import re
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python

from relayrl.config.aliases import foreign_name
from relayrl.config.effects import warn_ineffective
from relayrl.config.paths import Bases, origins, resolve_tree, section_model
from relayrl.config.root import Config
from relayrl.config.warn import gathered
from relayrl.errors import ConfigError


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-5` as a float (YAML 1.1 insists on a dot: `1.0e-5`)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def load_config(
    path: str | Path | None = None, overrides: Sequence[str] = (), base: dict | None = None, stacklevel: int = 1
) -> Config:
    """Read YAML (or start from `base`), apply `key=value` overrides, validate strictly, then warn about settings
    without effect (at the line `stacklevel` frames up: 1 = this caller's). The `auto` choices stay `auto` (the
    validated tree): `relayrl.build.resolve` makes them.

    Every unknown key of `base`, the file and the overrides is reported at once. Relative input paths are
    made absolute: a file's against its directory (else the working directory), the rest against the
    working directory (relayrl/config/paths.py states the rule).
    """
    with gathered(stacklevel):
        return _load(path, overrides, base)


def _load(path: str | Path | None, overrides: Sequence[str], base: dict | None) -> Config:
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


def load_command_section(model: type[BaseModel], name: str, overrides: Sequence[str]) -> Any:
    """A command's own keys (`name.key=value`, e.g. relayrl plan's `plan.*`), outside the run's Config: parsed as
    the run's overrides are, strict keys with did-you-mean, and a wrong value named by its key."""
    tree: dict[str, Any] = {}
    for key, value in map(parse_override, overrides):
        section, _, rest = key.partition(".")
        if section != name or not rest:
            raise ConfigError(
                f"'{key}' is not a {name} key; give {name}.KEY=value, e.g. {name}.{next(iter(model.model_fields))}=..."
            )
        unknown = _unknown_keys(_one_key_tree(rest, value), "the overrides", model, f"{name}.")
        if unknown:
            raise ConfigError(_unknown_message(unknown))
        _set_dotted(tree, rest, value)
    try:
        return model.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_describe(err, "the overrides", f"{name}.")) from None


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
    """The config as YAML: every key, so that loading it gives back an equal config; for a resolved config, what
    each `auto` chose and why beside it (the key itself stays `auto`, so a reload chooses again).

    `reward.fn`/`kwargs` are left out beside `reward.components`, which replaces them (setting both fails).
    """
    tree = config.model_dump(mode="json")
    if config.reward.components:
        for key in ("fn", "kwargs"):
            del tree["reward"][key]
    text = yaml.safe_dump(tree, sort_keys=False)
    text = text if config._engine_choice is None else config._engine_choice.noted(text)
    return _noted(text, config._auto)


def _noted(text: str, chosen: dict[str, tuple[Any, str]]) -> str:
    """Each `auto` line of the dump with what auto chose and why beside it (the first `name: auto` of its section)."""
    lines = text.split("\n")
    for key, (value, reason) in chosen.items():
        section, name = key.split(".")
        start = lines.index(f"{section}:") if f"{section}:" in lines else None
        for i in range(start + 1 if start is not None else len(lines), len(lines)):
            if not lines[i].startswith("  "):
                break
            if lines[i] == f"  {name}: auto":
                lines[i] += f"  # auto chose {value}: {reason}"
                break
    return "\n".join(lines)


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


# pydantic's tag for one member of a union (`float | Literal["auto"]`): the last part of each member's error location
_UNION_MEMBER = re.compile(r"^(bool|int|float|str|none|literal\[.*\])$")
_MEMBER_WORDS = {
    "bool": "a boolean (true/false)",
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "none": "null",
}


def _describe(err: ValidationError, source: str, prefix: str = "") -> str:
    lines: list[str] = []
    unions: dict[str, tuple[list[str], Any]] = {}  # key -> (what each member takes, the value given)
    for item in err.errors():
        if not item["loc"]:  # a cross-section check (model validator): its message names the keys
            lines.append(item["msg"].removeprefix("Value error, "))
            continue
        *parts, last = (str(part) for part in item["loc"])
        if parts and _UNION_MEMBER.match(last) and item["type"] != "value_error":
            # a value no member of the key's union takes: one line for the key, not one per member
            key = prefix + ".".join(parts)
            if key not in unions:
                unions[key] = ([], item.get("input"))
                lines.append(key)  # replaced below, keeping the order
            unions[key][0].append(_MEMBER_WORDS.get(last, last.removeprefix("literal[").removesuffix("]")))
            continue
        key = prefix + ".".join(str(part) for part in item["loc"])
        got = "" if item["type"] == "missing" or "input" not in item else f" (got {item['input']!r})"
        lines.append(f"{key}: {item['msg']}{got}")
    for key, (members, value) in unions.items():
        lines[lines.index(key)] = f"{key}: should be {' or '.join(members)} (got {value!r})"
    return f"invalid config ({source}):\n  " + "\n  ".join(lines)
