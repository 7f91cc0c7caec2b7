"""relayrl.train / relayrl.load_config: configs from a path, dict or Config with overrides; reward functions as
specs (module-level by name, lambdas in-process only, refused under workers); in-memory data written into the
run directory so the saved config re-runs. The training loop is replaced by a stand-in that claims the run dir."""

from __future__ import annotations

import json

import pytest
import yaml

import relayrl
from relayrl.errors import ConfigError, DataError

ROWS = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "4+4=", "answer": "8"}]


def score(prompts, completions, answer, **columns):
    """A module-level reward: importable by name, so reward workers receive it."""
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


@pytest.fixture
def fake_loop(monkeypatch):
    """relayrl.build.train replaced by what it does first: claim log.dir and save the resolved config."""
    from relayrl.config import dump_config
    from relayrl.run.directory import claim

    seen = []

    def fake_train(config, resume=None, overwrite=False):
        seen.append(config)
        run_dir = claim(config.log.dir, dump_config(config), None, overwrite, log=lambda *_: None)
        (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward/mean": 0.5}) + "\n")
        return {"before": {"eval/greedy": 0.25}, "after": {"eval/greedy": 0.5}}

    monkeypatch.setattr("relayrl.build.train", fake_train)
    return seen


def base(tmp_path, model_dir, **reward):
    return {
        "model": {"path": str(model_dir)},
        "log": {"dir": str(tmp_path / "run"), "progress": False},
        "reward": reward or {"fn": "exact_match"},
    }


def test_load_config_from_a_path_a_dict_and_a_config_with_overrides(tmp_path, random_model_dir):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(base(tmp_path, random_model_dir)))
    from_path = relayrl.load_config(path, ["train.lr=1e-5", "rollout.n=4"])
    from_dict = relayrl.load_config(base(tmp_path, random_model_dir), ["train.lr=1e-5", "rollout.n=4"])
    from_config = relayrl.load_config(relayrl.load_config(path), ["train.lr=1e-5", "rollout.n=4"])
    for config in (from_path, from_dict, from_config):
        assert config.train.lr == 1e-5 and config.rollout.n == 4 and config.model.path == str(random_model_dir)
    with pytest.raises(ConfigError, match="train.temperature"):
        relayrl.load_config(path, ["train.temperature=0.5"])


@pytest.mark.parametrize(
    "make", [lambda: lambda prompts, completions, **c: [0.0] * len(prompts), lambda: _local_function()]
)
def test_a_lambda_or_local_function_under_reward_workers_is_refused(tmp_path, random_model_dir, fake_loop, make):
    config = {**base(tmp_path, random_model_dir), "reward": {"workers": 2}}
    with pytest.raises(ConfigError, match="define it at module level or use reward.workers=0"):
        relayrl.train(config, reward=make(), train_data=ROWS, show_config=False)
    assert not fake_loop and not (tmp_path / "run").exists()


def _local_function():
    def local(prompts, completions, **columns):
        return [0.0] * len(prompts)

    return local


def test_a_module_level_reward_goes_in_by_name_and_loads_in_workers_spec(tmp_path, random_model_dir, fake_loop):
    config = {**base(tmp_path, random_model_dir), "reward": {"workers": 2}}
    relayrl.train(config, reward=score, train_data=ROWS, show_config=False)
    assert fake_loop[0].reward.fn == f"{__name__}:score"
    from relayrl.rewards.base import load_reward

    assert load_reward(fake_loop[0].reward.fn) is score


def test_a_lambda_with_no_workers_is_scored_in_process(tmp_path, random_model_dir, fake_loop):
    from relayrl.rewards.base import load_reward

    def local(prompts, completions, **columns):
        return [1.0] * len(prompts)

    with pytest.warns(relayrl.errors.RelayWarning, match="used in this process only"):
        relayrl.train(
            base(tmp_path, random_model_dir),
            reward=[local, {"fn": "exact_match", "weight": 0.5}],
            train_data=ROWS,
            show_config=False,
        )
    first, second = fake_loop[0].reward.components
    assert load_reward(first.fn) is local and first.name == "local"
    assert second.fn == "exact_match" and second.weight == 0.5


def test_rows_in_memory_are_written_to_the_run_dir_and_the_saved_config_re_runs(
    tmp_path, random_model_dir, fake_loop, monkeypatch
):
    result = relayrl.train(
        base(tmp_path, random_model_dir), reward=score, train_data=ROWS, eval_data=ROWS[:1], show_config=False
    )
    run_dir = tmp_path / "run"
    assert result.run_dir == run_dir and result.after == {"greedy": 0.5} and result.metrics["reward/mean"] == 0.5
    written = [json.loads(line) for line in (run_dir / "data" / "train.jsonl").read_text().splitlines()]
    assert written == ROWS
    monkeypatch.chdir(tmp_path)  # the saved config names absolute paths: it re-runs from anywhere
    again = relayrl.load_config(run_dir / "config.yaml", [f"log.dir={tmp_path / 'rerun'}"])
    assert again.data.train == str(run_dir / "data" / "train.jsonl")
    assert again.data.eval == str(run_dir / "data" / "eval.jsonl")
    relayrl.train(again, show_config=False)
    assert fake_loop[1].data.train == again.data.train


def test_a_datasets_dataset_is_written_like_rows(tmp_path, random_model_dir, fake_loop):
    datasets = pytest.importorskip("datasets")
    relayrl.train(base(tmp_path, random_model_dir), train_data=datasets.Dataset.from_list(ROWS), show_config=False)
    written = [json.loads(line) for line in (tmp_path / "run" / "data" / "train.jsonl").read_text().splitlines()]
    assert written == ROWS


def test_a_row_that_is_not_a_dict_is_named(tmp_path, random_model_dir, fake_loop):
    with pytest.raises(DataError, match=r"train_data\[1\] is a str"):
        relayrl.train(base(tmp_path, random_model_dir), train_data=[ROWS[0], "2+2="], show_config=False)


def test_rows_are_not_written_into_a_directory_holding_a_run(tmp_path, random_model_dir, fake_loop):
    relayrl.train(base(tmp_path, random_model_dir), train_data=ROWS, show_config=False)
    with pytest.raises(ConfigError, match="already holds a run"):
        relayrl.train(base(tmp_path, random_model_dir), train_data=ROWS[:1], show_config=False)
    assert len((tmp_path / "run" / "data" / "train.jsonl").read_text().splitlines()) == 2


def test_the_cli_train_command_calls_the_api(tmp_path, random_model_dir, fake_loop, capsys, monkeypatch):
    from relayrl import api
    from relayrl.cli import main

    calls = []
    monkeypatch.setattr(api, "train", lambda *a, **k: calls.append(a) or relayrl.train(*a, **k))
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**base(tmp_path, random_model_dir), "data": {"train": "rows.jsonl"}}))
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert main(["train", str(path), "train.lr=2e-5"]) == 0
    assert calls == [(str(path),)] and fake_loop[0].train.lr == 2e-5
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["after"] == {"eval/greedy": 0.5}


def test_any_iterable_of_rows_is_written_like_a_list(tmp_path, random_model_dir, fake_loop):
    relayrl.train(base(tmp_path, random_model_dir), train_data=(row for row in ROWS), show_config=False)
    written = [json.loads(line) for line in (tmp_path / "run" / "data" / "train.jsonl").read_text().splitlines()]
    assert written == ROWS
    with pytest.raises(DataError, match="train_data must be an iterable of row dicts"):
        relayrl.train(
            base(tmp_path, random_model_dir), train_data={"prompt": "1+1="}, show_config=False, overwrite=True
        )


async def module_agent(client, row):
    return 1.0


def test_an_agent_function_goes_in_by_name_or_registered_and_loads(tmp_path, random_model_dir, fake_loop):
    from relayrl.agents.loading import load_agent

    relayrl.train(base(tmp_path, random_model_dir), agent=module_agent, show_config=False)
    assert fake_loop[-1].env.agent.endswith(":module_agent") and load_agent(fake_loop[-1].env.agent) is module_agent
    local = lambda client, row: 0.5  # noqa: E731 - a lambda: no module holds it by name
    relayrl.train(base(tmp_path, random_model_dir), agent=local, show_config=False, overwrite=True)
    spec = fake_loop[-1].env.agent
    assert ":AGENTS.agent_" in spec and load_agent(spec) is local  # the module already imported, not a copy
    with pytest.raises(ConfigError, match="agent must be a function agent"):
        relayrl.train(base(tmp_path, random_model_dir), agent=3, show_config=False, overwrite=True)


def test_tools_go_in_by_name_and_a_function_the_workers_cannot_import_is_refused(tmp_path, random_model_dir, fake_loop):
    from tests.unit.test_env_tools import add

    relayrl.train(base(tmp_path, random_model_dir), tools=[add, "calculate"], show_config=False)
    function, builtin = fake_loop[-1].env.tools
    assert function.endswith("tests/unit/test_env_tools.py:add") and builtin == "calculate"  # as the path rules say
    with pytest.raises(ConfigError, match=r"tools: <function .*<lambda>.* the environment workers import each tool"):
        relayrl.train(base(tmp_path, random_model_dir), tools=[lambda a: a], show_config=False, overwrite=True)
