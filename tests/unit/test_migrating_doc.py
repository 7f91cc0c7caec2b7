"""docs/migrating.md stays true: every relayrl key it names is a real config key, every YAML example loads
through relayrl's config loader (and does the arithmetic the page claims), the reward adapters it shows score
through relayrl's real call, and its foreign names agree with `relayrl/config/aliases.py`."""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
import types
import typing
import warnings
from pathlib import Path

import pytest
from pydantic import BaseModel

from relayrl.config import Config, load_config
from relayrl.config.aliases import FOREIGN_NAMES, foreign_name
from relayrl.rewards.base import load_reward, score_rollouts
from relayrl.types import Prompt, Rollout

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs/migrating.md").read_text()
KEY = re.compile(r"^[a-z_]+(\.[a-z_0-9]+)+$")  # a dotted `section.key`


def schema_paths(model: type[BaseModel] = Config, prefix: str = "") -> set[str]:
    """Every section and key of the config tree, nested sections included."""
    paths = set()
    for name, field in model.model_fields.items():
        paths.add(prefix + name)
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            paths |= schema_paths(sub, f"{prefix}{name}.")
    return paths


def tables() -> list[tuple[str, list[list[str]]]]:
    """(header's third column, rows) of every table whose second column is relayrl's."""
    found, lines = [], PAGE.splitlines()
    for i, line in enumerate(lines):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) > 2 and cells[1] == "relayrl" and lines[i + 1].startswith("|---"):
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("| "):
                    break
                rows.append([cell.strip() for cell in row.strip().strip("|").split(" | ")])
            found.append((cells[0], rows))
    return found


def spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", PAGE, re.S | re.M)


def yaml_leaves(tree: dict, prefix: str = "") -> set[str]:
    leaves = set()
    for key, value in tree.items():
        if isinstance(value, dict) and prefix + key != "reward.kwargs":  # kwargs' keys are the function's
            leaves |= yaml_leaves(value, f"{prefix}{key}.")
        else:
            leaves.add(prefix + key)
    return leaves


# ---------------------------------------------------------------------------- keys


def test_every_relayrl_key_in_the_tables_is_a_config_key():
    real = schema_paths()
    named = {span for _, rows in tables() for row in rows for span in spans(row[1]) if KEY.match(span)}
    assert len(tables()) == 4, "the batch-size table and one table per framework"
    assert len(named) >= 50, f"the tables should name most keys; found {len(named)}"
    assert sorted(named - real) == []


def test_every_key_of_the_yaml_examples_is_a_config_key():
    import yaml

    real = schema_paths()
    leaves = set().union(*(yaml_leaves(yaml.safe_load(block)) for block in blocks("yaml")))
    assert sorted(leaves - real) == []


# ---------------------------------------------------------------------------- the examples load

# The `# relayrl train NAME.yaml` line of each example, and the optimizer steps per step its prose claims.
UPDATES_PER_STEP = {"trl_gsm8k.yaml": 2, "verl_gsm8k.yaml": 4, "openrlhf_math.yaml": 2}


def _write_reward_stubs(block: str, directory: Path) -> None:
    """The examples name reward adapters the reader writes; a stub per `file.py:function` lets them load."""
    for file, function in re.findall(r"\b([\w/]+\.py):(\w+)", block):
        path = directory / file
        path.parent.mkdir(parents=True, exist_ok=True)
        existing = path.read_text() if path.exists() else ""
        stub = f"def {function}(prompts, completions, **columns):\n    return [0.0] * len(prompts)\n"
        path.write_text(existing + stub)


@pytest.mark.parametrize("block", blocks("yaml"), ids=lambda b: re.search(r"relayrl train (\S+)", b).group(1))
def test_every_yaml_example_loads_through_the_config_loader(block, tmp_path, monkeypatch):
    """Schema only: model and data files need not exist (the loader warns), reward files are stubbed."""
    name = re.search(r"relayrl train (\S+)", block).group(1)
    monkeypatch.chdir(tmp_path)
    _write_reward_stubs(block, tmp_path)
    (tmp_path / name).write_text(block)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "not found" warnings for model.path and data.train
        config = load_config(tmp_path / name)
    assert config.updates_per_step == UPDATES_PER_STEP[name]


def test_every_example_is_checked():
    names = {re.search(r"relayrl train (\S+)", block).group(1) for block in blocks("yaml")}
    assert names == set(UPDATES_PER_STEP)


# ---------------------------------------------------------------------------- Python blocks


def test_python_blocks_parse():
    for block in blocks("python"):
        ast.parse(block)


def test_the_trl_example_uses_real_grpo_config_fields():
    trl = pytest.importorskip("trl")
    fields = {field.name for field in dataclasses.fields(trl.GRPOConfig)}
    (example,) = [block for block in blocks("python") if "GRPOConfig(" in block]
    calls = [
        node
        for node in ast.walk(ast.parse(example))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "GRPOConfig"
    ]
    used = {keyword.arg for call in calls for keyword in call.keywords}
    assert len(used) > 20 and sorted(used - fields) == []


def _rollouts(columns: list[dict], completions: list[str]) -> list[Rollout]:
    return [
        Rollout(Prompt(str(i), f"Q{i}: ", [1], row), 0, [2], text, [0.0], "stop", [0])
        for i, (row, text) in enumerate(zip(columns, completions))
    ]


def _adapter(marker: str, foreign_module: str, **foreign) -> typing.Callable:
    """Run the page's adapter block that imports from `foreign_module`, with a stand-in for that module."""
    (block,) = [block for block in blocks("python") if f"from {foreign_module} import" in block and "def " in block]
    module = types.ModuleType(foreign_module)
    module.__dict__.update(foreign)
    sys.modules[foreign_module] = module
    try:
        namespace: dict = {}
        exec(compile(block, f"docs/migrating.md ({foreign_module} adapter)", "exec"), namespace)
    finally:
        del sys.modules[foreign_module]
    return namespace[marker]


def _load(tmp_path, source: str, name: str):
    """A user's reward file, loaded as `reward.fn: file.py:name` is (the convention read from its signature)."""
    path = tmp_path / "user_reward.py"
    path.write_text(source)
    return load_reward(f"{path}:{name}")


def test_a_trl_function_scores_unchanged_as_the_page_says(tmp_path):
    fn = _load(
        tmp_path,
        "def accuracy_reward(completions, solution, **kwargs):\n"
        "    return [float(c.strip() == s) for c, s in zip(completions, solution)]\n",
        "accuracy_reward",
    )
    rollouts = _rollouts([{"solution": "4"}, {"solution": "5"}], ["4", "6"])
    scores, errors = score_rollouts(fn, rollouts)
    assert [s.reward for s in scores] == [1.0, 0.0] and errors == []


def test_a_verl_compute_score_keeps_score_instead_of_summing_the_dict(tmp_path):
    fn = _load(
        tmp_path,
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': float(solution_str == ground_truth), 'acc': solution_str == ground_truth}\n",
        "compute_score",
    )
    rows = [
        {"data_source": "gsm8k", "reward_model": {"ground_truth": "4"}, "extra_info": {"index": i}} for i in range(2)
    ]
    scores, _ = score_rollouts(fn, _rollouts(rows, ["4", "5"]))
    assert [s.reward for s in scores] == [1.0, 0.0]  # a summed dict would have scored the first 2.0


def test_the_openrlhf_adapter_takes_the_rewards_tensor():
    torch = pytest.importorskip("torch")

    def reward_func(queries, prompts, labels, **kwargs):
        responses = [q[len(p) :] for q, p in zip(queries, prompts)]
        rewards = torch.tensor([float(r == a) for r, a in zip(responses, labels)])
        return {"rewards": rewards, "scores": rewards, "extra_logs": {}}

    rollouts = _rollouts([{"answer": "4"}, {"answer": "5"}], ["4", "6"])
    scores, _ = score_rollouts(_adapter("score", "math_reward_func", reward_func=reward_func), rollouts)
    assert [s.reward for s in scores] == [1.0, 0.0]


# ---------------------------------------------------------------------------- agreement with the alias table


def test_foreign_names_in_the_tables_map_to_the_key_config_aliases_gives():
    """A TRL/verl/OpenRLHF name that FOREIGN_NAMES also lists sits in a row naming the same relayrl key."""
    checked, disagree = 0, []
    for _, rows in tables()[1:]:  # the three framework tables (the first is the batch-size overview)
        for row in rows:
            keys = {span for span in spans(row[1]) if KEY.match(span)}
            for name in spans(row[0]):
                entry = foreign_name(name.split()[0].removeprefix("--"))
                if entry is None:
                    continue
                checked += 1
                if entry.key not in keys:
                    disagree.append((name, entry.key, sorted(keys)))
    assert checked > 40 and len(FOREIGN_NAMES) > 0
    assert disagree == []
