"""Unknown keys: every one reported at once, each with its source and suggestion; other frameworks' names
(TRL, verl, OpenRLHF) suggest the relayrl key they mean, from one table that the docs agree with."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from relayrl.config import Config, load_config
from relayrl.config.aliases import FOREIGN_NAMES, foreign_name
from relayrl.config.docs import render_reference
from relayrl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def config_error(*args, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(*args, **kwargs)
    return str(info.value)


@pytest.mark.parametrize(
    "key, meant, not_meant",
    [
        ("train.learning_rate", "train.lr", "train.min_lr_ratio"),
        ("train.max_steps", "train.steps", "train.max_staleness"),
        ("rollout.num_generations", "rollout.n", "rollout.engine"),
        ("algorithm.beta", "algorithm.kl.coef", "algorithm.lam"),
        ("data.train_batch_size", "rollout.prompts_per_step", "train.mini_batch"),  # verl: prompts
        ("train.train_batch_size", "train.mini_batch", "rollout.prompts_per_step"),  # OpenRLHF: samples
        ("algorithm.kl_loss_coef", "algorithm.kl.coef", "algorithm.lam"),
    ],
)
def test_other_frameworks_names_suggest_the_relayrl_key(key, meant, not_meant):
    message = config_error(None, [f"{key}=1"])
    assert f"did you mean '{meant}'?" in message
    assert not_meant not in message


def test_the_suggestion_names_the_framework():
    assert "num_generations is its name in TRL" in config_error(None, ["rollout.num_generations=4"])


def test_every_foreign_name_maps_to_a_real_key_once():
    real = set(_leaf_paths(Config))
    assert not [entry for entry in FOREIGN_NAMES if entry.key not in real]
    names = [entry.name for entry in FOREIGN_NAMES]
    assert len(names) == len(set(names))
    assert not [name for name in names if name.rsplit(".", 1)[-1] in {p.rsplit(".", 1)[-1] for p in real}], (
        "a relayrl leaf name needs no alias: the nearest-key search finds it"
    )


def test_the_longest_dotted_tail_wins():
    assert foreign_name("data.train_batch_size").frameworks == "verl"
    assert foreign_name("actor_rollout_ref.data.train_batch_size").frameworks == "verl"
    assert foreign_name("x.train_batch_size").frameworks == "OpenRLHF"
    assert foreign_name("train.lrr") is None


def test_the_table_agrees_with_the_mapping_in_docs_algorithms():
    """Every name that docs/algorithms.md's mapping table also lists sits in a row of its relayrl key."""
    page = (ROOT / "docs/algorithms.md").read_text()
    table = page[page.index("## Config mapping") :]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ")]
    disagree = []
    for entry in FOREIGN_NAMES:
        leaf = entry.name.rsplit(".", 1)[-1]
        listing = [row for row in rows if leaf in _names(" | ".join(row[1:]))]
        if listing and not any(_mentions(row[0], entry.key) for row in listing):
            disagree.append((entry.name, entry.key))
    assert not disagree, f"names whose relayrl key differs from docs/algorithms.md: {disagree}"


def test_the_reference_lists_the_table():
    page = render_reference()
    assert "| `num_generations` | `rollout.n` | TRL |" in page


# ---------------------------------------------------------------------------- all at once


def test_every_unknown_override_is_reported_at_once():
    message = config_error(None, ["train.lrr=1", "rolout.n=4"])
    assert "2 config keys are wrong" in message
    assert "'train.lrr' (in the overrides); did you mean 'train.lr'?" in message
    assert "'rolout' (in the overrides); did you mean 'rollout'?" in message


def test_unknown_keys_of_the_file_and_the_overrides_are_reported_together(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("train:\n  stpes: 3\nrollout:\n  temprature: 0.5\n  n: 4\n")
    message = config_error(path, ["algorithm.kl.coeff=0.1"])
    assert f"'train.stpes' (in {path}); did you mean 'train.steps'?" in message
    assert f"'rollout.temprature' (in {path}); did you mean 'rollout.temperature'?" in message
    assert "'algorithm.kl.coeff' (in the overrides); did you mean 'algorithm.kl.coef'?" in message
    assert message.count("\n") == 3  # a heading and one line per key


def test_a_section_given_a_value_is_reported_with_the_unknown_keys():
    message = config_error(None, ["train=3", "train.lrr=1"])
    assert "'train' is a section" in message and "'train.lrr'" in message


def test_unknown_keys_inside_reward_components_are_named_with_a_suggestion():
    message = config_error(None, ["reward.components=[{fn: math, wieght: 2}, {fn: regex, nmae: f}]"])
    assert "'reward.components.0.wieght' (in the overrides); did you mean 'reward.components.0.weight'?" in message
    assert "'reward.components.1.nmae'" in message


def _leaf_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    paths = []
    for name, field in model.model_fields.items():
        options = typing.get_args(field.annotation) if typing.get_origin(field.annotation) is not list else ()
        section = [t for t in options if isinstance(t, type) and issubclass(t, BaseModel)]
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            paths += _leaf_paths(field.annotation, f"{prefix}{name}.")
        elif section:  # an optional section (`model.lora: LoraConfig | None`)
            paths += _leaf_paths(section[0], f"{prefix}{name}.")
        else:
            paths.append(f"{prefix}{name}")
    return paths


def _names(cells: str) -> set[str]:
    """The identifiers inside backticks: `actor.optim.lr_warmup_steps` -> actor, optim, lr_warmup_steps."""
    return {word for code in re.findall(r"`([^`]*)`", cells) for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code)}


def _mentions(cell: str, key: str) -> bool:
    """The relayrl cell of a row names `key` (by any dotted tail: `kl.coef`, `coef`) or one of its allowed values
    (`tis_token` for correction.mode); a section's heading row (`**rollout correction**`) names its section."""
    parts = key.split(".")
    named = {".".join(parts[i:]) for i in range(len(parts))} | set(_allowed_values(key))
    if cell.lstrip("| ").startswith("**"):
        named |= set(parts[:-1])
    return bool(named & (set(re.findall(r"`([^`=]*)", cell)) | _names(cell)))


def _allowed_values(key: str) -> tuple:
    model = Config
    for part in key.split(".")[:-1]:
        model = model.model_fields[part].annotation
    annotation = model.model_fields[key.rsplit(".", 1)[-1]].annotation
    return typing.get_args(annotation) if typing.get_origin(annotation) is typing.Literal else ()
