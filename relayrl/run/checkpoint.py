"""Atomic checkpoints of a training run, and finding the newest intact one to resume from.

A checkpoint is a directory `<run>/checkpoints/step_NNNNNN/` holding the policy (`model/`, save_pretrained),
everything else the loop needs to continue exactly (`trainer_state.pt`: optimizer, schedule, sampler
position, RNG states, policy version, critic) and `manifest.json` with a sha256 per file. It is written
under a temporary name and renamed into place, so a crash leaves either the whole checkpoint or none; a
checkpoint whose files do not match its manifest is reported and skipped in favour of the previous one.
A write that fails (disk full, a file-size limit) removes its temporary directory, leaves the previous
checkpoints as they were and raises `CheckpointError` naming the path and the cause.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError

from relayrl.errors import RelayError

WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)  # how a failed write surfaces (torch.save: RuntimeError)
STATE_FILE = "trainer_state.pt"
MANIFEST_FILE = "manifest.json"


class CheckpointError(RelayError):
    """A checkpoint could not be written (the previous ones are left intact)."""


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: str | Path, step: int, model, state: dict, keep: int) -> Path:
    """Write `model` (save_pretrained) and `state` (torch.save) atomically; keep the newest `keep`."""
    root = checkpoint_root(run_dir)
    final, tmp = root / f"step_{step:06d}", root / f".tmp_step_{step:06d}"
    try:
        _write(tmp, step, model, state)
    except WRITE_ERRORS as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(
            f"could not write checkpoint {final} ({write_cause(err)}); {newest_kept(run_dir)}"
        ) from err
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in sorted(root.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def write_cause(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())[:300]


def newest_kept(run_dir: str | Path) -> str:
    """What a failed write leaves to resume from, for its message."""
    previous = sorted(checkpoint_root(run_dir).glob("step_*"))
    if not previous:
        return "there is no earlier checkpoint"
    return f"the previous checkpoint {previous[-1]} is intact: free space under {run_dir} and --resume {run_dir}"


def _write(tmp: Path, step: int, model, state: dict) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp / "model")
    torch.save(state, tmp / STATE_FILE)
    files = {str(p.relative_to(tmp)): _sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
    (tmp / MANIFEST_FILE).write_text(json.dumps({"step": step, "files": files}, indent=1))
    _fsync_tree(tmp)


def latest_checkpoint(run_dir: str | Path, log=print) -> tuple[Path, dict] | None:
    """The newest checkpoint whose files match its manifest, with its state; None if there is none."""
    for path in sorted(checkpoint_root(run_dir).glob("step_*"), reverse=True):
        problem = verify(path)
        if problem is None:
            return path, torch.load(path / STATE_FILE, weights_only=False)
        log(f"checkpoint {path} is unusable ({problem}); trying the previous one")
    return None


def verify(path: Path) -> str | None:
    """None if every file listed in the manifest exists with its recorded hash, else what is wrong."""
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text())
    except (OSError, json.JSONDecodeError) as err:
        return f"no readable manifest: {err}"
    for name, digest in manifest.get("files", {}).items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if _sha256(file) != digest:
            return f"{name} does not match its checksum"
    return None if STATE_FILE in manifest.get("files", {}) else f"{STATE_FILE} is not in the manifest"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint directory itself, or a run directory's newest intact checkpoint."""
    path = Path(path)  # a finished run also holds a model/: a checkpoint is what has a manifest
    is_checkpoint = (path / MANIFEST_FILE).is_file()
    candidates = [path] if is_checkpoint else sorted(checkpoint_root(path).glob("step_*"), reverse=True)
    for candidate in candidates:
        problem = verify(candidate)
        if problem is None and not any((candidate / d).is_dir() for d in ("model", "sharded")):
            problem = "it has neither model/ nor sharded/"
        if problem is None:
            return candidate
        print(f"checkpoint {candidate} is unusable ({problem})")
    raise RelayError(f"{path}: no intact checkpoint there (expected <run>/checkpoints/step_N or a run directory)")


def run_config(checkpoint: Path):
    """The config of the run a checkpoint belongs to (<run>/config.yaml, two levels up)."""
    from relayrl.config import load_config  # the config package imports no runtime code: no cycle

    config_file = checkpoint.parent.parent / "config.yaml"
    if not config_file.is_file():
        raise RelayError(f"{checkpoint}: no {config_file} beside it, so the base model is unknown")
    return load_config(str(config_file), [])
