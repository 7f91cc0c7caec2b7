"""Relative paths in a config: against the config file's directory (else the working directory), overrides
against the working directory, output directories made absolute against the working directory (a log.dir leading
out of it warned about), env.fn resolved as reward.fn, and messages that name the directories tried."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import yaml

from relayrl.config import dump_config, load_config
from relayrl.errors import ConfigError, ConfigWarning

ROOT = Path(__file__).resolve().parents[2]
REWARD = "def score(prompts, completions, **columns):\n    return [float(c == 'ok') for c in completions]\n"


@pytest.fixture
def task(tmp_path, monkeypatch):
    """A config directory holding its data, reward module and model, and a separate working directory."""
    here = tmp_path / "task"
    (here / "model").mkdir(parents=True)
    (here / "train.jsonl").write_text('{"prompt": "a"}\n')
    (here / "rewards.py").write_text(REWARD)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return here, elsewhere


def write_config(directory: Path, tree: dict) -> Path:
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_paths_in_a_config_file_resolve_beside_it(task):
    here, _ = task
    config = load_config(
        write_config(
            here, {"model": {"path": "model"}, "data": {"train": "train.jsonl"}, "reward": {"fn": "rewards:score"}}
        )
    )
    assert config.model.path == str(here / "model")
    assert config.data.train == str(here / "train.jsonl")
    assert config.reward.fn == f"{here / 'rewards.py'}:score"  # a module beside the config imports


def test_a_module_beside_the_config_loads_as_the_reward(task):
    from relayrl.rewards import load_reward

    here, _ = task
    config = load_config(write_config(here, {"reward": {"components": [{"fn": "rewards:score", "name": "ok"}]}}))
    fn = load_reward(config.reward.components[0].fn)
    assert fn(["p", "p"], ["ok", "no"]) == [1.0, 0.0]


def test_a_path_missing_beside_the_config_falls_back_to_the_working_directory(task):
    here, elsewhere = task
    (elsewhere / "data").mkdir()
    (elsewhere / "data" / "eval.jsonl").write_text('{"prompt": "b"}\n')
    config = load_config(write_config(here, {"data": {"train": "train.jsonl", "eval": "data/eval.jsonl"}}))
    assert config.data.eval == str(elsewhere / "data" / "eval.jsonl")


def test_overrides_resolve_against_the_working_directory(task):
    here, elsewhere = task
    (elsewhere / "train.jsonl").write_text('{"prompt": "c"}\n')  # same name as the file beside the config
    config = load_config(write_config(here, {"data": {"train": "train.jsonl"}}), ["data.train=train.jsonl"])
    assert config.data.train == str(elsewhere / "train.jsonl")


def test_a_path_that_exists_nowhere_warns_naming_both_directories(task):
    here, elsewhere = task
    with pytest.warns(ConfigWarning) as caught:
        config = load_config(write_config(here, {"model": {"path": "nope"}}))
    message = str(caught[0].message)
    assert "model.path 'nope' does not exist relative to" in message
    assert f"{here} (the directory of config.yaml)" in message and f"{elsewhere} (the working directory)" in message
    assert config.model.path == str(elsewhere / "nope")  # the working directory, as configs meant before the rule


def test_a_missing_reward_file_fails_naming_both_directories(task):
    here, elsewhere = task
    with pytest.raises(ConfigError) as info:
        load_config(write_config(here, {"reward": {"fn": "nope.py:score"}}))
    assert "reward.fn='nope.py:score'" in str(info.value)
    assert str(here) in str(info.value) and str(elsewhere) in str(info.value)


def test_a_missing_reward_module_fails_naming_where_it_was_looked_for(task):
    here, elsewhere = task
    with pytest.raises(ConfigError) as info:
        load_config(write_config(here, {"reward": {"fn": "rewardz:score"}}))
    message = str(info.value)
    assert "no module 'rewardz'" in message and "rewardz.py" in message and str(here) in message


def test_installed_modules_and_builtins_stay_as_written(task):
    here, _ = task
    config = load_config(
        write_config(
            here,
            {
                "reward": {
                    "components": [{"fn": "math"}, {"fn": "relayrl.rewards.verifiers:exact_match", "name": "exact"}]
                }
            },
        )
    )
    assert [c.fn for c in config.reward.components] == ["math", "relayrl.rewards.verifiers:exact_match"]


ENV = "from relayrl.envs import Step\n\nclass Echo:\n    def reset(self, row):\n        return row['prompt']\n\n" + (
    "    def step(self, action):\n        return Step(None, 1.0, True)\n"
)


def test_output_directories_are_absolute_against_the_working_directory_wherever_they_are_set(task):
    here, elsewhere = task
    config = load_config(write_config(here, {"log": {"dir": "runs/x"}}), ["sync.directory=weights"])
    assert config.log.dir == str(elsewhere / "runs" / "x") and config.sync.directory == str(elsewhere / "weights")
    saved = yaml.safe_load(dump_config(config))
    assert saved["log"]["dir"] == str(elsewhere / "runs" / "x")  # the saved (and printed) config says where
    assert load_config(None, ["log.dir=/abs/run"]).log.dir == "/abs/run"


def test_a_log_dir_leading_outside_the_working_directory_warns_naming_the_key_and_the_path(task):
    here, elsewhere = task
    with pytest.warns(ConfigWarning) as caught:
        config = load_config(write_config(here, {"log": {"dir": "../../runs/x"}}))
    outside = str(elsewhere.parent.parent / "runs" / "x")
    assert config.log.dir == outside
    assert [str(w.message) for w in caught] == [
        f"log.dir='../../runs/x' leads outside the working directory {elsewhere}: the run writes to {outside}"
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(write_config(here, {"log": {"dir": "runs/../runs/y"}}))  # inside: no warning


def test_env_fn_resolves_beside_the_config_as_reward_fn_does(task):
    from relayrl.envs import load_env_class

    here, elsewhere = task
    (here / "envs.py").write_text(ENV)
    by_path = load_config(write_config(here, {"env": {"fn": "envs.py:Echo"}}))
    assert by_path.env.fn == f"{here / 'envs.py'}:Echo" and load_env_class(by_path.env.fn).__name__ == "Echo"
    assert load_config(write_config(here, {"env": {"fn": "envs:Echo"}})).env.fn == f"{here / 'envs.py'}:Echo"
    assert load_config(write_config(here, {"env": {"fn": "retry"}})).env.fn == "retry"  # a built-in
    with pytest.raises(ConfigError) as info:
        load_config(write_config(here, {"env": {"fn": "nope.py:Echo"}}))
    assert (
        "env.fn='nope.py:Echo'" in str(info.value)
        and str(here) in str(info.value)
        and str(elsewhere) in str(info.value)
    )


def test_the_saved_config_holds_absolute_input_paths(task):
    here, _ = task
    config = load_config(write_config(here, {"data": {"train": "train.jsonl"}, "reward": {"fn": "rewards.py:score"}}))
    saved = yaml.safe_load(dump_config(config))
    assert Path(saved["data"]["train"]).is_absolute() and Path(saved["reward"]["fn"].rpartition(":")[0]).is_absolute()


def test_the_shipped_examples_still_load_from_the_repository_root(monkeypatch):
    monkeypatch.chdir(ROOT)
    config = load_config("examples/own_task/config.yaml")
    assert config.data.train == str(ROOT / "examples/own_task/train.jsonl")
    assert config.reward.fn == f"{ROOT / 'examples/own_task/reward.py'}:score"


def test_an_example_written_beside_its_config_runs_from_any_directory(tmp_path, monkeypatch):
    from relayrl.data.source import read_rows
    from relayrl.rewards import load_reward

    copy = tmp_path / "own_task"
    shutil.copytree(ROOT / "examples/own_task", copy)
    tree = yaml.safe_load((copy / "config.yaml").read_text())
    tree["data"].update(train="train.jsonl", eval="eval.jsonl")
    tree["reward"]["fn"] = "reward.py:score"
    tree.pop("model")
    (copy / "config.yaml").write_text(yaml.safe_dump(tree))
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every path is found
        config = load_config("own_task/config.yaml")
    rows = [row for _, row in read_rows(config.data.train)][:2]
    scores = load_reward(config.reward.fn)(
        [r["prompt"] for r in rows], [r["answer"] for r in rows], answer=[r["answer"] for r in rows]
    )
    assert scores == [{"correct": 1.0, "format": 0.1}] * 2


def test_a_base_tree_resolves_against_the_working_directory(task):
    _, elsewhere = task
    (elsewhere / "t.jsonl").write_text('{"prompt": "d"}\n')
    base = {"data": {"train": "t.jsonl"}}
    assert load_config(None, base=base).data.train == str(elsewhere / "t.jsonl")
    assert base == {"data": {"train": "t.jsonl"}}


def test_the_model_directories_of_built_in_rewards_resolve_beside_the_config(task):
    here, elsewhere = task
    (here / "rm").mkdir()
    config = load_config(
        write_config(
            here,
            {
                "reward": {
                    "components": [
                        {"fn": "reward_model", "kwargs": {"path": "rm"}},
                        {"fn": "judge", "kwargs": {"model": "rm"}},
                        {"fn": "regex", "kwargs": {"pattern": "rm"}},
                    ]
                }
            },
        )
    )
    kwargs = [c.kwargs for c in config.reward.components]
    assert kwargs == [{"path": str(here / "rm")}, {"model": str(here / "rm")}, {"pattern": "rm"}]
    (elsewhere / "rm2").mkdir()
    config = load_config(write_config(here, {"reward": {"fn": "reward_model"}}), ["reward.kwargs={path: rm2}"])
    assert config.reward.kwargs == {"path": str(elsewhere / "rm2")}


def test_a_built_in_rewards_model_found_nowhere_stays_as_written(task):
    here, _ = task
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = load_config(write_config(here, {"reward": {"fn": "judge", "kwargs": {"model": "org/judge-7b"}}}))
    assert config.reward.kwargs == {"model": "org/judge-7b"}
