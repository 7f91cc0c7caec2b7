"""Trackers write for real and the values read back: metrics.jsonl, TensorBoard event files, the MLflow
sqlite store and the W&B offline run file; a backend whose package is missing fails at config time."""

import importlib.util
import json
import time

import pytest

from relayrl.config import load_config
from relayrl.errors import ConfigError
from relayrl.metrics.trackers import build_trackers
from tests.unit.wandb_records import history_rows

STEPS = [{"reward/mean": 0.25, "time/step": 0.5}, {"reward/mean": 0.75, "time/step": 0.4, "eval/greedy": 0.6}]


def _log_all(tmp_path, backends, steps=STEPS, first_step=0):
    config = load_config(None, [f"log.dir={tmp_path}", "log.progress=false", f"log.backends={backends}", "rollout.n=4"])
    trackers = build_trackers(config.log, config.train.steps, config.model_dump(), tmp_path)
    for step, metrics in enumerate(steps, start=first_step):
        trackers.log(step, metrics)
    trackers.close()
    return config


def test_jsonl_is_always_written(tmp_path):
    _log_all(tmp_path, "[]")
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": i, **m} for i, m in enumerate(STEPS)]


def test_tensorboard_scalars_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _log_all(tmp_path, "[tensorboard]")
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    rewards = [(e.step, e.value) for e in events.Scalars("reward/mean")]
    assert rewards == [(0, pytest.approx(0.25)), (1, pytest.approx(0.75))]
    assert [(e.step, e.value) for e in events.Scalars("eval/greedy")] == [(1, pytest.approx(0.6))]


def _mlflow_run(tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    return client, client.get_run((tmp_path / "mlflow" / "run_id").read_text().strip())


def test_mlflow_metrics_and_config_read_back(tmp_path):
    _log_all(tmp_path, "[mlflow]")
    client, run = _mlflow_run(tmp_path)
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert [(m.step, m.value) for m in history] == [(0, 0.25), (1, 0.75)]
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval/greedy")] == [(1, 0.6)]
    assert run.data.params["rollout.n"] == "4"
    assert run.info.status == "FINISHED"


def test_mlflow_resume_continues_the_same_run(tmp_path):
    _log_all(tmp_path, "[mlflow]", STEPS[:1])
    _log_all(tmp_path, "[mlflow]", STEPS[1:], first_step=1)
    client, run = _mlflow_run(tmp_path)
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "reward/mean")] == [
        (0, 0.25),
        (1, 0.75),
    ]


def test_wandb_offline_history_reads_back(tmp_path):
    _log_all(tmp_path, "[wandb]")
    [run_file] = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    rows, deadline = history_rows(run_file), time.monotonic() + 30
    while len(rows) < len(STEPS) and time.monotonic() < deadline:  # wandb-core, a separate process, may
        time.sleep(0.5)  # still be writing the file when finish() returns on a loaded machine
        rows = history_rows(run_file)
    logged = [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows]
    assert logged == STEPS
    assert [row["_step"] for row in rows] == [0, 1]
    assert run_file.name == f"run-{(tmp_path / 'wandb' / 'run_id').read_text().strip()}.wandb"


@pytest.mark.parametrize(
    "backend, module", [("mlflow", "sqlalchemy"), ("wandb", "wandb"), ("tensorboard", "tensorboard")]
)
def test_missing_backend_package_fails_at_config_time(monkeypatch, backend, module):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == module else real_find_spec(name, *a)
    )
    with pytest.raises(ConfigError, match=rf"log.backends={backend} needs {module}.*pip install"):
        load_config(None, [f"log.backends=[{backend}]"])
