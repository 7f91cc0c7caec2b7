"""The config reference, generated from the pydantic tree in `relayrl/config/`: `docs/config.md` and `--explain`.

The tree is walked generically (any section or nested section added to `Config` shows up with no change
here); each field's type, default and constraints are read from its pydantic annotation and metadata, its
words from its `description`. Left out: cross-section rules (the `Config` validators), which only the
validator's error message states. Regenerate with `relayrl config --write-docs` or
`python -m relayrl.config.docs`.
"""

from __future__ import annotations

import re
import shlex
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from relayrl.config.aliases import FOREIGN_NAMES
from relayrl.config.load import _suggest
from relayrl.config.root import Config
from relayrl.errors import ConfigError

DOCS_PATH = "docs/config.md"
# The header's example; tests/unit/test_config_docs.py loads it, so it cannot drift from the schema.
EXAMPLE_YAML = """\
model:
  path: runs/sft/model
data:
  train: data/train.jsonl
rollout:
  n: 8
algorithm:
  kl:
    coef: 0.01
"""
EXAMPLE_OVERRIDES = ("rollout.n=16", "train.lr=3e-6", "algorithm.kl.coef=0.05", "rollout.stop=[END]")
_CONSTRAINTS = {
    "gt": ">",
    "ge": ">=",
    "lt": "<",
    "le": "<=",
    "multiple_of": "multiple of",
    "min_length": "length >=",
    "max_length": "length <=",
}


def sections(model: type[BaseModel] = Config, prefix: str = "") -> list[tuple[str, type[BaseModel]]]:
    """Every section of the tree as (dotted path, model), parents before their nested sections; root is ""."""
    found = [(prefix, model)]
    for name, field in model.model_fields.items():
        if (section := _model_of(field)) is not None:
            found.extend(sections(section, f"{prefix}{name}."))
    return [(path.rstrip("."), sub) for path, sub in found]


def render_reference() -> str:
    """The Markdown of docs/config.md: a header on how configs work, then one table per section."""
    tree = [(path, model) for path, model in sections() if _leaves(model)]
    lines = _header(path for path, _ in tree)
    for path, model in tree:
        lines += ["", f"## {path or 'top level'}", ""]
        if about := _section_about(path):
            lines += [about, ""]
        subsections = [f"`{path}.{name}`" for name, field in model.model_fields.items() if _is_section(field)]
        if subsections:
            lines += [f"Nested sections: {', '.join(subsections)}.", ""]
        lines += ["| key | type | default | constraints | description |", "|---|---|---|---|---|"]
        for name, field in _leaves(model):
            cells = [
                f"`{_join(path, name)}`",
                type_name(field.annotation),
                f"`{default_text(field)}`",
                constraints_text(field),
                _description(field),
            ]
            lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines + _foreign_names()) + "\n"


def explain(key: str) -> str:
    """One key's description, type, default and constraints; for a section, its keys. Unknown keys suggest one."""
    model, field, path = Config, None, ""
    for part in key.strip().split("."):
        if field is not None and not _is_section(field):
            raise ConfigError(f"'{path}' is a value, not a section; run `relayrl config --explain {path}`")
        path = _join(path, part)
        field = model.model_fields.get(part)
        if field is None:
            raise ConfigError(f"unknown config key '{path}'{_suggest(path, part, model)}")
        if (section := _model_of(field)) is not None:
            model = section
    assert field is not None  # split() yields at least one part, and an unknown one raised above
    if _is_section(field):
        return _explain_section(path, model)
    rows = [
        ("type", type_name(field.annotation)),
        ("default", default_text(field)),
        ("constraints", constraints_text(field)),
    ]
    lines = [path, f"  {_description(field)}"]
    lines += [f"  {label + ':':<13}{value}" for label, value in rows if value]
    lines.append(f"  {'override:':<13}{path}=VALUE (the value is read as YAML)")
    return "\n".join(lines)


def write_reference(path: str | Path = DOCS_PATH) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_reference())
    return path


def check_reference(path: str | Path = DOCS_PATH) -> str | None:
    """None when `path` holds exactly the generated reference, else what is wrong and how to fix it."""
    path = Path(path)
    fix = f"run `relayrl config --write-docs {path}` and commit the result"
    if not path.is_file():
        return f"{path} does not exist; {fix}"
    if path.read_text() != render_reference():
        return f"{path} is out of date with relayrl/config/; {fix}"
    return None


# ---------------------------------------------------------------------------- one field


def type_name(annotation: Any) -> str:
    """`int`, `float or null`, `one of: a, b`, `list[str]`, `tuple[float, float]`, `dict`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    if origin is Literal:
        return "one of: " + ", ".join(yaml_text(value) for value in args)
    if origin in (typing.Union, types.UnionType):
        named = [type_name(arg) for arg in args if arg is not type(None)]
        return " or ".join(named + ["null"] * (len(named) < len(args)))
    if origin is dict:
        return "dict"
    if origin in (list, tuple, set, frozenset):
        return f"{origin.__name__}[{', '.join('...' if a is Ellipsis else type_name(a) for a in args)}]"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "(required)"
    return yaml_text(to_jsonable_python(field.get_default(call_default_factory=True)))


def constraints_text(field: FieldInfo) -> str:
    """`>= 1`, `> 0, <= 1` from the field's annotated-types metadata (what `Field(ge=..., le=...)` records)."""
    found = []
    for meta in field.metadata:
        for attr, symbol in _CONSTRAINTS.items():
            if getattr(meta, attr, None) is not None:
                found.append(f"{symbol} {getattr(meta, attr)}")
    return ", ".join(found)


def yaml_text(value: Any) -> str:
    """A value as YAML writes it inline: `8`, `1.0e-05`, `null`, `''`, `[0.9, 0.999]`."""
    text = yaml.safe_dump(value, default_flow_style=True, width=sys.maxsize).strip()
    return text.removesuffix("...").strip()


# ---------------------------------------------------------------------------- helpers


def _is_section(field: FieldInfo) -> bool:
    return _model_of(field) is not None


def _model_of(field: FieldInfo) -> type[BaseModel] | None:
    """The section class of a field: `X`, or `X | None` for an optional section (`model.lora`)."""
    optional = typing.get_origin(field.annotation) in (typing.Union, types.UnionType)
    for candidate in (field.annotation, *(typing.get_args(field.annotation) if optional else ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _leaves(model: type[BaseModel]) -> list[tuple[str, FieldInfo]]:
    return [(name, field) for name, field in model.model_fields.items() if not _is_section(field)]


def _cell(text: str) -> str:
    """Escape a Markdown table cell: `|` always (GFM allows `\\|` in code spans); outside code spans, a `<` that
    would open an HTML tag (`<dir>` would vanish from the rendered page)."""
    parts = text.split("`")
    parts[::2] = [re.sub(r"<(?=[A-Za-z/!?])", r"\\<", part) for part in parts[::2]]
    return "`".join(parts).replace("|", "\\|")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _description(field: FieldInfo) -> str:
    return " ".join((field.description or "(no description)").split())


def _section_about(path: str) -> str:
    """The section field's description, else the section class's own docstring (first paragraph)."""
    if not path:
        return ""
    model: type[BaseModel] = Config
    field: FieldInfo | None = None
    for part in path.split("."):
        field = model.model_fields[part]
        section = _model_of(field)
        assert section is not None, f"'{path}' is not a section"  # callers pass section paths only
        model = section
    assert field is not None  # path is non-empty, so the loop ran
    text = field.description or model.__dict__.get("__doc__") or ""
    return " ".join(text.split("\n\n")[0].split())


def _explain_section(path: str, model: type[BaseModel]) -> str:
    lines = [f"{path} (section)"]
    if about := _section_about(path):
        lines.append(f"  {about}")
    width = max(len(name) for name in model.model_fields)
    for name, field in model.model_fields.items():
        if (section := _model_of(field)) is not None:
            lines.append(f"  {name:<{width}}  section: {', '.join(section.model_fields)}")
            continue
        facts = [type_name(field.annotation), f"default {default_text(field)}", constraints_text(field)]
        lines.append(f"  {name:<{width}}  {'; '.join(fact for fact in facts if fact)}")
        lines.append(f"  {'':<{width}}  {_description(field)}")
    lines.append(f"run `relayrl config --explain {path}.KEY` for one key")
    return "\n".join(lines)


def _foreign_names() -> list[str]:
    """The table behind the unknown-key message: other frameworks' names and the relayrl key each one means."""
    lines = [
        "",
        "## Names from other frameworks",
        "",
        "An unknown key whose name is TRL's, verl's or OpenRLHF's is answered with the relayrl key below "
        "(`relayrl/config/aliases.py`; docs/algorithms.md explains each pairing).",
        "",
        "| name | relayrl key | framework | note |",
        "|---|---|---|---|",
    ]
    for entry in FOREIGN_NAMES:
        cells = [f"`{entry.name}`", f"`{entry.key}`", entry.frameworks, entry.note]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return lines


def _header(paths) -> list[str]:
    overrides = " ".join(map(shlex.quote, EXAMPLE_OVERRIDES))  # `[END]` unquoted is a shell glob
    return [
        "# Config reference",
        "",
        "Generated from the pydantic tree in `relayrl/config/` by `relayrl config --write-docs` "
        "(or `python -m relayrl.config.docs`); `tests/unit/test_config_docs.py` fails when it is out of date.",
        "For one key on the command line: `relayrl config --explain rollout.n` (a section: `--explain algorithm.kl`).",
        "",
        "## How a config is put together",
        "",
        "A run's config is a YAML file of sections, then `key=value` overrides from the command line, applied in "
        "that order; every key left unset keeps the default below.",
        "",
        "```yaml",
        *EXAMPLE_YAML.splitlines(),
        "```",
        "",
        "```bash",
        f"relayrl train config.yaml {overrides}",
        "```",
        "",
        "- An override names a key by its full dotted path, as in the tables below (`algorithm.kl.coef`). "
        "Its value is read as YAML: `null`, `true`, `1e-5` and lists such as `[a, b]` all work.",
        "- Keys are strict: an unknown or misspelt key fails, naming its full path and the nearest real key; "
        "a value of the wrong type or out of range fails naming the key.",
        "- Every unknown key of the file and the overrides is reported at once; another framework's name "
        "(TRL's `num_generations`) is answered with the relayrl key it means (table at the end).",
        "- A relative input path (`model.path`, `critic.path`, `data.train`, `data.eval`, a reward's or `env.fn`'s "
        "`file.py` or `module`) in a config file is taken against the file's directory, else the working directory; "
        "in an override, against the working directory. Output paths (`log.dir`, `sync.directory`) are relative to "
        "the working directory (a `log.dir` leading outside it is warned about).",
        "- The resolved config (defaults filled in, input and set output paths absolute) is printed when a run starts "
        "and saved as `<log.dir>/config.yaml`; it re-runs from any directory.",
        "",
        "Sections: "
        + ", ".join(f"[{path or 'top level'}](#{path.replace('.', '') or 'top-level'})" for path in paths)
        + ".",
    ]


if __name__ == "__main__":
    print(f"wrote {write_reference(sys.argv[1] if len(sys.argv) > 1 else DOCS_PATH)}")
