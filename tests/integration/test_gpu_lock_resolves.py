"""The GPU lock resolves as a whole against the package index: uv's resolver (`uv pip compile`, the uv that
requirements/install.sh fetched into the environment, handed pip's indexes as install.sh hands them; ~3 s of CPU),
or where there is no uv, pip's dry run (~85 s, ~70 s of it CPU: pip reads every wheel's metadata, here from local
file indexes). Kept out of the unit tier (`make test-fast`). The lock's static checks are tests/unit/test_locks.py.

The resolution starts in the background when the suite collects this test (`start_in_background`, called from
tests/conftest.py), so it overlaps the suite's other tests instead of holding a worker; the test waits for its
result and asserts on it."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.unit.test_locks import GPU, pins

TIMEOUT_S = 600
# Pinned and installed without its requirements (`make setup` installs the lock with --no-deps): tinker-cookbook 0.6.1
# requires tml-renderers>=0.4.1, which the package index does not hold (the locks' header; only Inkling tokenizers
# import it). Resolved as a whole, the lock would fail on that one requirement, so the dry run leaves the cookbook
# out; tests/unit/test_ecosystem.py's `pip check` names the one line it leaves unmet.
UNRESOLVABLE = {"tinker-cookbook"}


def _paths(run_id: str) -> tuple[Path, Path, Path]:
    base = Path(tempfile.gettempdir()) / f"relayrl-gpu-lock-{run_id}"
    return base.with_suffix(".json"), base.with_suffix(".rc"), base.with_suffix(".log")


def start_in_background(run_id: str) -> None:
    """Start the dry run once per test run (the first pytest worker to collect the test claims it)."""
    report, rc, log = _paths(run_id)
    try:
        os.close(os.open(log, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    resolvable = log.with_suffix(".txt")
    lines = GPU.read_text().splitlines()
    resolvable.write_text("\n".join(li for li in lines if li.split("==")[0].strip().lower() not in UNRESOLVABLE))
    script = f'timeout {TIMEOUT_S} "$@" >{log} 2>&1; echo $? >{rc}.part && mv {rc}.part {rc}'
    command = resolver(resolvable, report)
    subprocess.Popen(["bash", "-c", script, "resolve", *command], start_new_session=True, stdin=subprocess.DEVNULL)


def resolver(requirements: Path, report: Path) -> list[str]:
    """uv's `pip compile` of `requirements` into `report` (pinned lines) where install.sh fetched uv, else pip's
    dry run with its JSON report."""
    uv = Path(sys.executable).parent.parent / "uv/bin/uv"
    if uv.is_file():
        command = [str(uv), "pip", "compile", "--quiet", "--no-header", "--no-annotate", "--python", sys.executable]
        return [*command, "--index-strategy", "unsafe-best-match", *pip_sources(), str(requirements), "-o", str(report)]
    pip = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    return [*pip, "--use-feature=fast-deps", "--report", str(report), "-r", str(requirements)]


def pip_sources() -> list[str]:
    """pip's index-url, extra-index-url and find-links (its config files and PIP_* variables) as uv's flags, as
    requirements/install.sh hands them to uv, which reads none of pip's configuration."""
    flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links"}
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    sources: list[str] = []
    for line in listed.splitlines():
        key, _, value = line.strip().partition("=")
        flag = flags.get(key.rsplit(".", 1)[-1])
        for source in ast.literal_eval(value).split() if flag and value else []:
            if [flag, source] not in [sources[i : i + 2] for i in range(0, len(sources), 2)]:
                sources += [flag, source]
    return sources


def resolved_pins(report: Path) -> dict[str, str]:
    """name -> version from pip's JSON report or uv's pinned lines."""
    text = report.read_text()
    if text.lstrip().startswith("{"):
        found = [(i["metadata"]["name"], i["metadata"]["version"]) for i in json.loads(text)["install"]]
    else:
        found = [tuple(line.split("==", 1)) for line in text.splitlines() if "==" in line]
    return {name.strip().lower().replace("_", "-"): version.strip() for name, version in found}


@pytest.mark.slow
def test_pip_resolves_the_gpu_lock_as_a_whole(request):
    """A dry run of the whole lock (full resolution: every requirement of every pin, CUDA torch's included). HTTP
    range requests read each wheel's metadata (fast-deps), so nothing of the ~4 GB is downloaded (~30-70 s)."""
    run_id = run_id_of(request.config)
    start_in_background(run_id)  # already started at collection, unless collection skipped the hook
    report, rc, log = _paths(run_id)
    deadline = time.monotonic() + TIMEOUT_S + 30
    while not rc.exists():
        assert time.monotonic() < deadline, f"the resolution of requirements/gpu.lock did not end; its log: {log}"
        time.sleep(1)
    assert rc.read_text().strip() == "0", f"requirements/gpu.lock does not resolve:\n{log.read_text()[-3000:]}"
    installed = resolved_pins(report)
    expected = {name: version for name, version in pins(GPU).items() if name not in UNRESOLVABLE}
    assert installed == expected  # nothing added, nothing moved
    for path in (report, rc, log, log.with_suffix(".txt")):
        path.unlink()


def run_id_of(config: pytest.Config) -> str:
    """One id per `pytest` invocation, the same in every xdist worker (xdist's own testrunuid)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return workerinput["testrunuid"]
    if not hasattr(config, "_relayrl_run_id"):
        config._relayrl_run_id = f"{os.getpid()}-{time.time_ns()}"  # type: ignore[attr-defined]
    return config._relayrl_run_id  # type: ignore[attr-defined]
