"""docs/config.md is generated from the config tree and kept current by CI; `relayrl config` explains any key."""

import types
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from relayrl.cli import main
from relayrl.config import Config, load_config
from relayrl.config.docs import EXAMPLE_OVERRIDES, EXAMPLE_YAML, explain, render_reference
from relayrl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "config.md"


def leaf_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Written here, not imported from config_docs, so the check does not share the code it checks."""
    paths = []
    for name, field in model.model_fields.items():
        optional = typing.get_args(field.annotation) if isinstance(field.annotation, types.UnionType) else ()
        section = [a for a in (field.annotation, *optional) if isinstance(a, type) and issubclass(a, BaseModel)]
        if section:  # a section, or an optional one (`model.lora: LoraConfig | None`)
            paths += leaf_paths(section[0], f"{prefix}{name}.")
        else:
            paths.append(f"{prefix}{name}")
    return paths


def test_checked_in_docs_are_current():
    assert DOCS.is_file(), "docs/config.md is missing: run `relayrl config --write-docs`"
    assert DOCS.read_text() == render_reference(), (
        "docs/config.md is out of date with relayrl/config/: run `relayrl config --write-docs` and commit it"
    )


def test_every_leaf_field_has_a_row_with_its_full_path():
    page = render_reference()
    paths = leaf_paths(Config)
    assert "rollout.n" in paths and "algorithm.kl.coef" in paths
    missing = [path for path in paths if f"| `{path}` |" not in page]
    assert not missing, f"fields without a row in the reference: {missing}"


def test_rendering_is_deterministic():
    assert render_reference() == render_reference()


def test_the_header_example_is_a_valid_config(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(EXAMPLE_YAML)
    config = load_config(path, list(EXAMPLE_OVERRIDES))
    assert config.rollout.n == 16 and config.algorithm.kl.coef == 0.05 and config.rollout.stop == ["END"]
    assert yaml.safe_load(EXAMPLE_YAML)["rollout"]["n"] == 8  # the file's value, overridden above


def test_row_shows_type_default_and_constraints():
    page = render_reference()
    assert "| `rollout.n` | int | `8` | >= 1 | Responses sampled per prompt" in page
    assert "| `rollout.engine` | one of: auto, vllm, hf | `auto` |" in page
    assert "| `data.eval` | str or null | `null` |" in page
    assert "| `train.betas` | tuple[float, float] | `[0.9, 0.999]` |" in page
    assert "| `rollout.top_p` | float | `1.0` | > 0, <= 1 |" in page
    assert "abs = \\|logp - ref\\|" in page  # a pipe inside a description must not split the table row


def test_explain_a_key():
    text = explain("rollout.n")
    assert Config.model_fields["rollout"].annotation.model_fields["n"].description in text
    assert "type:        int" in text and "default:     8" in text and ">= 1" in text


def test_explain_a_literal_lists_its_allowed_values():
    assert "one of: auto, vllm, hf" in explain("rollout.engine")


def test_explain_a_section_lists_its_keys():
    text = explain("algorithm.kl")
    for key in ("coef", "estimator", "placement", "controller", "target", "horizon"):
        assert f"\n  {key} " in text
    assert "kl " in explain("algorithm") and "section: coef" in explain("algorithm")


@pytest.mark.parametrize(
    "key, suggestion",
    [
        ("rollout.temprature", "rollout.temperature"),
        ("temperature", "rollout.temperature"),
        ("algorithm.kl.coeff", "algorithm.kl.coef"),
    ],
)
def test_explain_an_unknown_key_suggests_the_nearest(key, suggestion):
    with pytest.raises(ConfigError, match=f"unknown config key '{key}'; did you mean '{suggestion}'"):
        explain(key)


def test_explain_below_a_value_names_the_value():
    with pytest.raises(ConfigError, match="'rollout.n' is a value, not a section"):
        explain("rollout.n.x")


def test_cli_explain(capsys):
    assert main(["config", "--explain", "rollout.n"]) == 0
    assert capsys.readouterr().out.strip() == explain("rollout.n")


def test_cli_explain_unknown_key_exits_2_with_one_line(capsys):
    assert main(["config", "--explain", "rollout.temprature"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "did you mean 'rollout.temperature'" in err


def test_cli_write_then_check_docs(tmp_path, capsys):
    path = tmp_path / "config.md"
    assert main(["config", "--write-docs", str(path)]) == 0
    assert path.read_text() == render_reference()
    assert main(["config", "--check-docs", str(path)]) == 0

    path.write_text(path.read_text().replace("Responses sampled per prompt", "Samples per prompt"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(["config", "--check-docs", str(path)])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert f"{path} is out of date" in err and "relayrl config --write-docs" in err


def test_cli_check_docs_of_a_missing_file_exits_1(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["config", "--check-docs", str(tmp_path / "none.md")])
    assert info.value.code == 1 and "does not exist" in capsys.readouterr().err
