"""Trackers write for real and the values read back: metrics.jsonl and TensorBoard event files."""

import json

import pytest

from relayrl.config import load_config
from relayrl.metrics.trackers import build_trackers

STEPS = [{"reward/mean": 0.25, "time/step": 0.5}, {"reward/mean": 0.75, "time/step": 0.4, "eval/greedy": 0.6}]


def _log_all(tmp_path, backends):
    config = load_config(None, [f"log.dir={tmp_path}", "log.progress=false", f"log.backends={backends}"])
    trackers = build_trackers(config, tmp_path)
    for step, metrics in enumerate(STEPS):
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
