"""A run directory is modified only by the run it belongs to: a new run into a directory holding a run stops
(naming --resume and --overwrite), a bad input stops before anything is written, and a resumed run keeps
its logs up to the checkpoint's step."""

import json

import pytest
import yaml

from relayrl.cli import main


def _finished_run(run_dir):
    """A directory as a finished run leaves it (the parts a new run could damage)."""
    run_dir.mkdir(parents=True)
    files = {
        "config.yaml": "train:\n  steps: 7\n",
        "metrics.jsonl": '{"step": 0, "reward/mean": 0.5}\n',
        "timeline.jsonl": '{"step": 0, "role": "learner", "phase": "update", "start": 1.0, "end": 2.0}\n',
        "eval.json": '{"before": {}, "after": {}}\n',
    }
    for name, text in files.items():
        (run_dir / name).write_text(text)
    return files


def _config(tmp_path, model_dir, train_file, run_dir, **extra):
    path = tmp_path / "cfg.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"path": str(model_dir)},
                "data": {"train": str(train_file)},
                "rollout": {"engine": "hf", "n": 2, "prompts_per_step": 2, "max_tokens": 2},
                "train": {"steps": 1},
                "log": {"dir": str(run_dir), "progress": False, "save_model": False},
                **extra,
            }
        )
    )
    return str(path)


def _unchanged(run_dir, files):
    return {name: (run_dir / name).read_text() for name in files} == files


def test_a_bad_data_file_leaves_the_previous_run_untouched(tmp_path, capsys, random_model_dir):
    run_dir = tmp_path / "run"
    files = _finished_run(run_dir)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": 3}\n')
    code = main(["train", _config(tmp_path, random_model_dir, bad, run_dir)])
    assert code == 2 and f"{bad}:1" in capsys.readouterr().err
    assert _unchanged(run_dir, files)


def test_a_bad_reward_spec_stops_before_the_run_directory_is_created(tmp_path, capsys, random_model_dir, toy_task):
    run_dir = tmp_path / "run"
    config = _config(tmp_path, random_model_dir, toy_task["train"], run_dir, reward={"fn": "no_such_module:score"})
    assert main(["train", config]) == 2 and "no_such_module" in capsys.readouterr().err
    assert not run_dir.exists()


def test_a_new_run_into_a_directory_holding_a_run_stops_naming_resume_and_overwrite(
    tmp_path, capsys, random_model_dir, toy_task
):
    run_dir = tmp_path / "run"
    files = _finished_run(run_dir)
    code = main(["train", _config(tmp_path, random_model_dir, toy_task["train"], run_dir)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"log.dir={run_dir} already holds a run" in err and f"--resume {run_dir}" in err and "--overwrite" in err
    assert _unchanged(run_dir, files)


def test_overwrite_replaces_the_run_and_keeps_other_files(tmp_path, capsys, random_model_dir, toy_task):
    run_dir = tmp_path / "run"
    _finished_run(run_dir)
    (run_dir / "checkpoints" / "step_000006").mkdir(parents=True)
    (run_dir / "warmstart").mkdir()  # e.g. the demo's cached warm start
    (run_dir / "warmstart" / "config.json").write_text("{}")
    code = main(["train", _config(tmp_path, random_model_dir, toy_task["train"], run_dir), "--overwrite"])
    out = capsys.readouterr().out
    assert code == 0 and "replacing the run there (--overwrite)" in out
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["steps"] == 1
    assert not (run_dir / "checkpoints").exists() and (run_dir / "warmstart" / "config.json").is_file()
    assert {json.loads(line)["step"] for line in (run_dir / "timeline.jsonl").read_text().splitlines()} == {0}


def test_resume_and_overwrite_together_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["train", "cfg.yaml", "--resume", str(tmp_path), "--overwrite"])
    assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_resume_keeps_the_logs_up_to_the_checkpoint_step(tmp_path):
    from relayrl.run.directory import claim

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    metrics = "".join(json.dumps({"step": s, "reward/mean": s / 10}) + "\n" for s in range(4))
    (run_dir / "metrics.jsonl").write_text(metrics + '{"step": 4, "rew')  # the last row torn by a kill
    timeline = "".join(
        json.dumps({"step": s, "role": "learner", "phase": "update", "start": s, "end": s + 1}) + "\n" for s in range(4)
    )
    (run_dir / "timeline.jsonl").write_text(timeline)
    claim(run_dir, "resolved: config\n", resume_step=1)
    assert [json.loads(r)["step"] for r in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    assert [json.loads(r)["step"] for r in (run_dir / "timeline.jsonl").read_text().splitlines()] == [0, 1]


def test_the_demo_replaces_its_previous_rl_run(tmp_path, monkeypatch, capsys):
    """`relayrl demo` twice into one directory: the second run passes overwrite (the warm start is cached)."""
    import relayrl.build
    from relayrl.commands.demo import run_demo

    calls = []
    monkeypatch.setattr(
        relayrl.build,
        "train",
        lambda config, **kwargs: (
            calls.append(kwargs)
            or {"before": {"eval/greedy": 0.5, "eval/sampled": 0.5}, "after": {"eval/greedy": 0.6, "eval/sampled": 0.6}}
        ),
    )
    warm = tmp_path / "warmstart"
    warm.mkdir()
    for name in ("config.json", "model.safetensors"):
        (warm / name).write_text("{}")
    run_demo(tmp_path)
    assert calls == [{"overwrite": True}] and "warm start: cached" in capsys.readouterr().out


def test_a_timeline_appends_to_the_rows_a_resumed_run_kept(tmp_path):
    from relayrl.metrics.timeline import Timeline

    path = tmp_path / "timeline.jsonl"
    path.write_text(json.dumps({"step": 0, "role": "learner", "phase": "update", "start": 0.0, "end": 1.0}) + "\n")
    timeline = Timeline(path)
    timeline.add(1, "learner", "update", 2.0, 3.0)
    timeline.flush()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1]
