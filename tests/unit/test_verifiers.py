"""`env.fn: verifiers:TASKSET` and `data.train: verifiers:TASKSET?...` (relayrl/envs/verifiers_env.py) with the real
verifiers package (its v1 API) and the real HF engine on the tiny random model: a taskset's tasks are rows, its
episodes run on the run's endpoint with its rubric as the reward, and each bad input has one message naming it.
The learning run is in docs/ecosystem.md (the example examples/verifiers_env/arith_retry.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from relayrl.errors import DataError, EnvError

# The lock installs verifiers; find_spec imports nothing, where importorskip cost each worker seconds at collection.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("verifiers") is None, reason="verifiers is not installed")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/verifiers_env"

PROBE = """
import verifiers.v1 as vf

__all__ = ["ProbeTaskset"]

class ProbeData(vf.TaskData):
    answer: str

class ProbeTask(vf.Task[ProbeData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def scored(self, task: ProbeData, trace: vf.Trace) -> float:
{body}

class ProbeTaskset(vf.Taskset[ProbeTask, vf.TasksetConfig]):
    def load(self):
        for a in range(4):
            yield ProbeTask(ProbeData(prompt=f"{{a}}+1=", answer=str(a + 1)), self.config.task)
"""


def probe(tmp_path, monkeypatch, name: str, body: str) -> str:
    """A taskset module `name` on sys.path whose one reward runs `body` (indented into the method)."""
    (tmp_path / f"{name}.py").write_text(PROBE.format(body=textwrap.indent(textwrap.dedent(body), " " * 8)))
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"verifiers:{name.replace('_', '-')}"


def run(tmp_path, model_dir, spec: str, data: str, **env) -> list[dict]:
    import relayrl

    config = {
        "model": {"path": str(model_dir)},
        "data": {"train": data, "max_prompt_tokens": 16},
        "rollout": {"engine": "hf", "n": 2, "prompts_per_step": 2, "max_tokens": 4},
        "train": {"steps": 1, "micro_batch": 64, "threads": 1},
        "env": {"fn": spec, "max_turns": 2, "max_total_tokens": 12, **env},
        "log": {"dir": str(tmp_path / "run"), "progress": False, "save_model": False},
    }
    relayrl.train(config, overwrite=True, show_config=False)
    return [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]


def test_a_taskset_is_rows_with_its_tasks_data(toy_task, monkeypatch):
    from relayrl.data.rows import open_rows
    from relayrl.data.source import check_row

    monkeypatch.syspath_prepend(str(EXAMPLE))
    rows = open_rows(f"verifiers:arith-retry?path={toy_task['train']}&limit=3", check_row)
    first = json.loads(Path(toy_task["train"]).read_text().splitlines()[0])
    where, row = rows.read(0)
    assert len(rows) == 3 and where.endswith(":row 0")
    assert row["prompt"] == first["prompt"] and row["answer"] == first["answer"]
    assert row["verifiers_task"]["answer"] == first["answer"] and row["verifiers_task"]["idx"] == 0


def test_a_multi_turn_env_trains_through_its_spec_with_no_glue_file(tmp_path, random_model_dir, toy_task, monkeypatch):
    """arith-retry's Env (a wrong answer hears feedback) on the random model: both attempts are taken, every call
    continues the trajectory's tokens (no fork) and the trainer's log-probs are the engine's."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    data = f"verifiers:arith-retry?path={toy_task['train']}&limit=8"
    (row,) = run(tmp_path, random_model_dir, "verifiers:arith-retry", data, kwargs={"feedback": "+"})
    assert row["env/trajectories"] == 4 and row["env/errors"] == 0
    assert row["env/turns_mean"] == 2  # the random model answers wrong: the env's hook asks again
    assert row["tito/forks"] == 0 and row["mismatch/logprob_abs_max"] < 1e-4
    assert 0 < row["response/obs_token_frac"] < 1  # the feedback's tokens are observations


def test_the_reward_is_the_rubrics(tmp_path, random_model_dir, monkeypatch):
    spec = probe(tmp_path, monkeypatch, "vf_probe_constant", "return 0.25 if trace.num_turns == 1 else 0.0")
    (row,) = run(tmp_path, random_model_dir, spec, spec)  # SingleAgentEnv: one turn
    assert row["reward/mean"] == 0.25 and row["env/turns_mean"] == 1 and row["env/success"] == 1


def test_a_rubric_that_raises_stops_the_run_naming_it(tmp_path, random_model_dir, monkeypatch):
    spec = probe(tmp_path, monkeypatch, "vf_probe_raises", "raise ValueError('the rubric broke')")
    with pytest.raises(EnvError, match="the episode failed: .*the rubric broke"):
        run(tmp_path, random_model_dir, spec, spec)


def test_a_rubric_that_raises_is_counted_as_an_error_never_a_silent_zero(tmp_path, random_model_dir, monkeypatch):
    spec = probe(tmp_path, monkeypatch, "vf_probe_raises_zero", "raise ValueError('the rubric broke')")
    (row,) = run(tmp_path, random_model_dir, spec, spec, on_error="zero")  # zero: the user's choice, counted
    assert row["env/errors"] == row["env/trajectories"] == 4


def test_a_task_without_a_reward_is_an_error_not_a_zero(tmp_path, random_model_dir, monkeypatch):
    spec = probe(tmp_path, monkeypatch, "vf_probe_unrewarded", "return 1.0")
    module = tmp_path / "vf_probe_unrewarded.py"
    module.write_text(module.read_text().replace("@vf.reward", "@vf.metric"))  # a metric only: no reward
    with pytest.raises(EnvError, match="records no reward"):
        run(tmp_path, random_model_dir, spec, spec)


def test_an_unknown_taskset_is_named(tmp_path):
    from relayrl.data.rows import open_rows
    from relayrl.data.source import check_row
    from relayrl.envs.verifiers_env import check

    with pytest.raises(EnvError, match=r"env.fn='verifiers:no-such-taskset'.*not found.*no_such_taskset"):
        check("verifiers:no-such-taskset", {})
    with pytest.raises(DataError, match=r"'verifiers:no-such-taskset'.*not found"):
        open_rows("verifiers:no-such-taskset", check_row)
    with pytest.raises(EnvError, match="name an installed verifiers taskset"):
        check("verifiers:", {})


def test_a_module_without_a_dataset_is_named(tmp_path, monkeypatch):
    from relayrl.data.rows import open_rows
    from relayrl.data.source import check_row
    from relayrl.envs.verifiers_env import check

    (tmp_path / "vf_probe_nodata.py").write_text("__all__ = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EnvError, match="exports no Taskset subclass"):
        check("verifiers:vf-probe-nodata", {})
    with pytest.raises(DataError, match="exports no Taskset subclass"):
        open_rows("verifiers:vf-probe-nodata", check_row)


def test_env_kwargs_and_data_options_are_checked_by_the_envs_own_config(tmp_path, toy_task, monkeypatch):
    from relayrl.data.rows import open_rows
    from relayrl.data.source import check_row
    from relayrl.envs.verifiers_env import check

    monkeypatch.syspath_prepend(str(EXAMPLE))
    with pytest.raises(EnvError, match="feedbak"):
        check("verifiers:arith-retry", {"feedbak": "+"})
    with pytest.raises(DataError, match="limt"):
        open_rows(f"verifiers:arith-retry?path={toy_task['train']}&limt=3", check_row)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="the taskset has no tasks"):
        open_rows(f"verifiers:arith-retry?path={tmp_path / 'empty.jsonl'}", check_row)


def test_a_row_that_is_not_the_tasks_data_is_named(monkeypatch):
    from relayrl.envs.verifiers_env import build, load, row_task

    monkeypatch.syspath_prepend(str(EXAMPLE))
    env = build("verifiers:arith-retry", load("verifiers:arith-retry"))
    task = row_task(env, {"prompt": "1+2=", "answer": "3", "other": 1}, "verifiers:arith-retry")  # a jsonl row
    assert (task.data.prompt, task.data.answer) == ("1+2=", "3")
    with pytest.raises(EnvError, match=r"row id 7 does not validate as ArithData.*answer"):
        row_task(env, {"id": 7, "prompt": "1+2="}, "verifiers:arith-retry")


def test_without_verifiers_installed_each_spec_says_how_to_install_it(monkeypatch):
    from relayrl.data.rows import open_rows
    from relayrl.data.source import check_row
    from relayrl.envs import verifiers_env

    for name in [m for m in sys.modules if m == "verifiers" or m.startswith("verifiers.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "verifiers", None)  # an import of it raises ImportError, as when absent
    verifiers_env.load.cache_clear()
    with pytest.raises(EnvError, match=r"needs the verifiers package, which is not installed: pip install"):
        verifiers_env.check("verifiers:arith-retry", {})
    with pytest.raises(DataError, match=r"needs the verifiers package"):
        open_rows("verifiers:arith-retry", check_row)


def test_the_examples_env_config_loads(monkeypatch):
    from relayrl.config import load_config
    from relayrl.envs.verifiers_env import check

    monkeypatch.syspath_prepend(str(EXAMPLE))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # model.path: the demo's warm start is not there in CI
        config = load_config(str(EXAMPLE / "config.yaml"))
    check(config.env.fn, config.env.kwargs)
    assert config.data.train.startswith("verifiers:arith-retry?")
