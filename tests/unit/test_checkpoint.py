"""A checkpoint write that fails (disk full, a file-size limit) leaves the previous checkpoint intact, removes
its partial files, and stops the run with one message naming the path and the cause."""

import errno
import json
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml

from relayrl.cli import main
from relayrl.errors import RelayError
from relayrl.placement.sections import learner_settings
from relayrl.run.checkpoint import latest_checkpoint, save_checkpoint, verify


@pytest.fixture
def model(random_model_dir):
    from relayrl.models.loading import load_causal_lm

    return load_causal_lm(random_model_dir)


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_only_the_newest_keep_checkpoints_stay(tmp_path, model):
    """checkpoint.keep: the oldest go as newer ones land (the resume tests' runs keep every checkpoint they make)."""
    for step in (1, 3, 5):
        save_checkpoint(tmp_path, step, model, {"step": step}, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000003", "step_000005"]
    newest = latest_checkpoint(tmp_path)
    assert newest is not None and newest[0] == tmp_path / "checkpoints" / "step_000005" and newest[1] == {"step": 5}


def test_a_full_disk_leaves_the_previous_checkpoint_and_names_the_path(tmp_path, model, monkeypatch):
    first = save_checkpoint(tmp_path, 0, model, {"step": 0}, keep=2)
    monkeypatch.setattr(torch, "save", _disk_full)
    with pytest.raises(RelayError) as err:
        save_checkpoint(tmp_path, 1, model, {"step": 1}, keep=2)
    message = str(err.value)
    assert str(tmp_path / "checkpoints" / "step_000001") in message and "No space left on device" in message
    assert f"the previous checkpoint {first} is intact" in message
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000000"]  # no partial directory
    assert verify(first) is None and latest_checkpoint(tmp_path)[1] == {"step": 0}


def test_a_file_size_limit_during_the_model_write_is_reported_the_same_way(tmp_path, random_model_dir):
    """A real failed write: RLIMIT_FSIZE (SIGXFSZ ignored) makes the weights file fail with EFBIG."""
    script = textwrap.dedent(f"""
        import resource, signal
        from relayrl.run.checkpoint import save_checkpoint
        from relayrl.errors import RelayError
        from relayrl.models.loading import load_causal_lm

        model = load_causal_lm({str(random_model_dir)!r})
        save_checkpoint({str(tmp_path)!r}, 0, model, {{"step": 0}}, keep=2)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # config.json fits, the weights do not
        try:
            save_checkpoint({str(tmp_path)!r}, 1, model, {{"step": 1}}, keep=2)
        except RelayError as err:
            print("ERROR", err)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ERROR could not write checkpoint" in result.stdout and "step_000001" in result.stdout
    assert "File too large" in result.stdout or "EFBIG" in result.stdout or "27" in result.stdout, result.stdout
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000000"]
    assert verify(tmp_path / "checkpoints" / "step_000000") is None


def test_a_failed_checkpoint_stops_the_run_with_one_line(tmp_path, capsys, random_model_dir, toy_task, monkeypatch):
    saves = []

    def second_save_fails(obj, path, *args, **kwargs):
        saves.append(path)
        if len(saves) == 2:
            _disk_full()
        return real_save(obj, path, *args, **kwargs)

    real_save = torch.save
    monkeypatch.setattr(torch, "save", second_save_fails)
    run_dir = tmp_path / "run"
    config = tmp_path / "cfg.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"path": str(random_model_dir)},
                "data": {"train": str(toy_task["train"])},
                "rollout": {"engine": "hf", "n": 2, "prompts_per_step": 2, "max_tokens": 2},
                "train": {"steps": 3},
                "checkpoint": {"every": 1, "keep": 3},
                "log": {"dir": str(run_dir), "progress": False, "save_model": False},
            }
        )
    )
    code = main(["train", str(config)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"could not write checkpoint {run_dir / 'checkpoints' / 'step_000001'}" in err
    assert "No space left on device" in err
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_000000"]
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    assert not (run_dir / "eval.json").exists()


def test_a_full_disk_at_the_final_save_names_the_path_and_the_checkpoint_kept(tmp_path, random_model_dir, monkeypatch):
    from relayrl.config import load_config
    from relayrl.learner.role import LearnerRole

    role = LearnerRole(learner_settings(load_config(None, [f"model.path={random_model_dir}"])))
    kept = save_checkpoint(tmp_path, 4, role.policy.model, {"step": 4}, keep=2)
    monkeypatch.setattr(role.policy.model, "save_pretrained", _disk_full)
    with pytest.raises(RelayError) as err:
        role.save(tmp_path)
    assert str(err.value) == (
        f"could not save the final model to {tmp_path / 'model'} (OSError: [Errno 28] No space "
        f"left on device); the previous checkpoint {kept} is intact: free space under "
        f"{tmp_path} and --resume {tmp_path}"
    )
