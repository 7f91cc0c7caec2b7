"""Test artefacts that cost minutes to make (the demo's warm start: a short SFT), built once per content hash and
kept outside the clone, so a second `make test` of the same tree (CI right after a session, a rerun) reuses them.

The key is everything that decides the artefact: every source file under relayrl/ (a change anywhere may change
training), the installed lock (requirements/cpu.lock, or the GPU one), torch's version and the recipe's own
arguments. A cached directory is used only if every file still matches the manifest written when it was built
(a test that wrote into it would otherwise poison every later run); otherwise it is built again. A build goes
to a temporary directory renamed into place, under a file lock, so two suites (or two workers of one) never see
half of one and never build it twice.

`RELAYRL_TEST_CACHE` moves the cache (default `~/.cache/relayrl-tests`); `RELAYRL_TEST_CACHE=off` builds every
artefact afresh in the session's temporary directory, as before the cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "artefact-manifest.json"


def cache_root() -> Path | None:
    """Where artefacts are kept, or None when the cache is off."""
    setting = os.environ.get("RELAYRL_TEST_CACHE", "")
    if setting == "off":
        return None
    return Path(setting) if setting else Path.home() / ".cache" / "relayrl-tests"


def content_key(recipe: dict) -> str:
    """A digest of the recipe, relayrl's sources, the locks and torch's version."""
    import torch

    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode())
    digest.update(torch.__version__.encode())
    sources = sorted((ROOT / "relayrl").rglob("*.py")) + sorted((ROOT / "requirements").glob("*.lock"))
    for path in sources:
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def _file_digests(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }


def _intact(directory: Path) -> bool:
    manifest = directory / MANIFEST
    return manifest.is_file() and json.loads(manifest.read_text()) == _file_digests(directory)


def cached(name: str, recipe: dict, build: Callable[[Path], None], fallback: Path) -> Path:
    """The directory `build(dir)` makes from `recipe`: from the cache when an intact copy of the same key is there,
    else built (into `fallback` when the cache is off)."""
    root = cache_root()
    if root is None:
        build(fallback)
        return fallback
    final = root / f"{name}-{content_key(recipe)}"
    root.mkdir(parents=True, exist_ok=True)
    # One builder at a time per artefact: parallel test workers (pytest -n) wait for the first one's build.
    with open(root / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _intact(final):
            _build_into(final, build)
    return final


def _build_into(final: Path, build: Callable[[Path], None]) -> None:
    staging = final.parent / f".{final.name}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    build(staging)
    (staging / MANIFEST).write_text(json.dumps(_file_digests(staging), indent=0))
    shutil.rmtree(final, ignore_errors=True)  # a copy that no longer matches its manifest
    staging.rename(final)
