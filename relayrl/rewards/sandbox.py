"""Run an untrusted Python program against test cases; return the pass fraction and per-test results.

Test cases (a dataset column `tests`: a list, or its JSON text), one of two kinds each:
  {"stdin": "2 3\\n", "stdout": "5"}      the program runs as __main__ with that stdin; its stdout, with
                                          trailing whitespace of each line and the whole dropped, must equal
                                          `stdout` and it must exit 0.
  {"call": "add(2, 3)", "expected": 5}    the program is run as a module (its prints go to stderr), then
                                          `call` is evaluated in it; `repr` of the value, read back with
                                          `ast.literal_eval`, must equal `expected` (a JSON value; tuples
                                          compare as lists).
The verdict is made here, outside the sandbox, from the bytes the program printed; expected outputs never
enter the sandbox. So `sys.exit(0)`, `os._exit(0)`, patching builtins or killing the harness cannot fake
a pass: a program passes a test only by printing its answer.

Each test is one sandboxed process (see `_sandbox_launch.py` for the chain), started in a session of its
own and killed as a group (`killpg`, SIGKILL) at the wall-clock timeout; a run returns only once every process
it started is gone (the pid namespace torn down), so a scored sample leaves nothing running. The program runs
at the lowest CPU priority (SCHED_IDLE, nice 19) so that a spinning program or a fork bomb cannot starve the
process that must kill it on time. Limits: CPU seconds, address
space, file size (which also caps stdout/stderr), open files and processes (RLIMIT_*). The environment is
scrubbed to PATH/LANG/HOME.

Isolation (`isolation=`):
- `namespaces` (the default where the kernel allows it, probed once): new mount, pid and network
  namespaces (plus a user namespace when not root). No network: the namespace has only a down loopback.
  A private /proc shows only the sandbox's processes; the killpg reaches its pid 1, whose death kills
  everything left (double-fork daemons, `setsid` children). The program's filesystem is a minimal root
  (`_sandbox_launch.py` lists it): the interpreter's prefix and the shared libraries it links, read-only,
  with site-packages hidden (the code reward runs plain Python: standard library only); null/zero/random/
  urandom; fresh /tmp, /var/tmp and /dev/shm tmpfs (capped at `disk_mb`) that vanish with the namespace.
  The host's tree is detached: no /work, /root, /home, /etc, source tree, dataset, checkpoint or venv to
  read a test's expected output from. As root, the program also runs under an unused uid of its own (so
  RLIMIT_NPROC counts only its processes, and it cannot signal anything outside). If the view cannot be
  built, `namespaces` fails with one RewardError naming the step; `auto` then falls back to `rlimits`
  with one warning saying why.
- `rlimits` (when namespaces are unavailable): rlimits, the killpg, a scratch work dir, and a Python
  audit hook that refuses socket creation. RLIMIT_NPROC counts every process of the user, so it is set
  to the user's current count plus `processes`. Not contained: a program that calls `setsid` in a child
  escapes the process group; C extensions / ctypes can bypass the audit hook; files are the user's.
  Refused as root: root is exempt from RLIMIT_NPROC.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from relayrl.errors import RelayWarning, RewardError
from relayrl.rewards.sandbox_teardown import kill_group, wait_group_gone, wait_uid_gone

LAUNCHER = Path(__file__).with_name("_sandbox_launch.py")
EXIT_SETUP_FAILED = 125  # the launcher's own code for "the sandbox could not be set up"
MARKER_PREFIX = "relayrl-sandbox-"  # in every sandbox process's command line, so tests can look for leftovers
RUN_UID_BASE = 2_000_000  # as root, a run's program has uid RUN_UID_BASE + the launcher's pid (_sandbox_launch.py)
Isolation = Literal["auto", "namespaces", "rlimits"]  # `isolation=`, checked at run time (resolve_isolation)
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": "/tmp/work"}


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 2.0  # wall clock per test, for the whole process group
    cpu_s: int = 2
    memory_mb: int = 512  # address space (RLIMIT_AS)
    file_mb: int = 8  # largest file, stdout and stderr included (RLIMIT_FSIZE)
    disk_mb: int = 32  # size of each scratch tmpfs (/tmp, /var/tmp, /dev/shm)
    open_files: int = 64
    processes: int = 16
    output_bytes: int = 64 * 1024  # how much of stdout/stderr is read back


@dataclass(frozen=True)
class InterpreterView:
    """The host paths a sandboxed program sees (namespaces mode), all read-only; see _sandbox_launch.py."""

    prefix: str  # the interpreter's installation (sys.base_prefix, resolved); the program sees it at /python
    python: str  # the interpreter binary, relative to `prefix`
    hidden: tuple[str, ...]  # directories under `prefix` covered by an empty tmpfs (site-packages)
    library_dirs: tuple[str, ...]  # shared libraries it and its extension modules link, bound at their host paths
    prefix_library_dirs: tuple[str, ...]  # those inside `prefix` (e.g. libpython's lib/), relative to it


@dataclass
class ProgramRun:
    stdout: str
    stderr: str
    exit_code: int  # 128 + signal when killed by a signal
    timed_out: bool
    wall_s: float


@dataclass
class TestResult:
    passed: bool
    reason: str  # "passed", "timeout", "exit code 1", "wrong output", ...
    run: ProgramRun


@dataclass
class TestReport:
    results: list[TestResult] = field(default_factory=list)

    @property
    def pass_fraction(self) -> float:
        return sum(r.passed for r in self.results) / len(self.results) if self.results else 0.0


def run_tests(
    program: str, tests: list[dict] | str, limits: SandboxLimits = SandboxLimits(), isolation: Isolation = "auto"
) -> TestReport:
    """Run `program` once per test case, each in a fresh sandbox; a bad test list raises naming the case."""
    cases = parse_tests(tests)
    mode = resolve_isolation(isolation)
    report = TestReport()
    for case in cases:
        run = run_program(program, stdin=case.get("stdin", ""), call=case.get("call"), limits=limits, isolation=mode)
        report.results.append(_verdict(case, run))
    return report


def parse_tests(tests: list[dict] | str) -> list[dict]:
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError as err:
            raise RewardError(f"code reward: the `tests` column is a string but not JSON: {err}") from None
    if not isinstance(tests, (list, tuple)) or not tests:
        raise RewardError(f"code reward: `tests` must be a non-empty list of test cases, got {tests!r:.80}")
    for index, case in enumerate(tests):
        keys = set(case) if isinstance(case, dict) else None
        if keys not in ({"stdin", "stdout"}, {"call", "expected"}):
            raise RewardError(
                f"code reward: test {index} is {case!r:.80}; a test is "
                '{"stdin": ..., "stdout": ...} or {"call": ..., "expected": ...}'
            )
        if "call" in case and not isinstance(case["call"], str):
            raise RewardError(f"code reward: test {index}: `call` must be a string, got {case['call']!r:.80}")
    return list(tests)


def run_program(
    program: str,
    stdin: str = "",
    call: str | None = None,
    limits: SandboxLimits = SandboxLimits(),
    isolation: Isolation = "auto",
) -> ProgramRun:
    """Run one program in a fresh sandbox; never outlives `limits.timeout_s` by more than the kill."""
    mode = resolve_isolation(isolation)
    if mode == "rlimits" and os.geteuid() == 0:
        raise RewardError(
            "code sandbox: isolation=rlimits cannot run as root (root is exempt from RLIMIT_NPROC, "
            "so a fork bomb would not be stopped); allow namespaces or run as a normal user"
        )
    # Files without names (unlinked at creation): nothing is left on disk even if this process is SIGKILLed
    # mid-run (a reward worker past its deadline). Only the rlimits mode needs a work dir on the host.
    work_dir = Path(tempfile.mkdtemp(prefix="relayrl-sandbox-")) if mode == "rlimits" else None
    try:
        if work_dir:
            (work_dir / "main.py").write_text(program, encoding="utf-8")
        job = {
            "program": program,
            "call": call,
            "namespaces": mode == "namespaces",
            "uid": None,
            "view": dataclasses.asdict(interpreter_view()) if mode == "namespaces" else None,
            "python": os.path.realpath(sys.executable),
            "work_dir": str(work_dir),
            "parent_pid": os.getpid(),
            "cpu_s": limits.cpu_s,
            "memory_mb": limits.memory_mb,
            "file_mb": limits.file_mb,
            "disk_mb": limits.disk_mb,
            "open_files": limits.open_files,
            "processes": limits.processes if mode == "namespaces" else _user_processes() + limits.processes,
            "env": {**ENV, "HOME": str(work_dir) if work_dir else ENV["HOME"]},
        }
        marker = f"{MARKER_PREFIX}{uuid.uuid4().hex[:12]}"
        with (
            tempfile.TemporaryFile() as fjob,
            tempfile.TemporaryFile() as fin,
            tempfile.TemporaryFile() as fout,
            tempfile.TemporaryFile() as ferr,
        ):
            for file, text in ((fjob, json.dumps(job)), (fin, stdin)):
                file.write(text.encode("utf-8"))
                file.seek(0)
            start = time.monotonic()
            process = subprocess.Popen(
                [job["python"], "-I", "-S", "-B", str(LAUNCHER), str(fjob.fileno()), marker],
                pass_fds=(fjob.fileno(),),
                stdin=fin,
                stdout=fout,
                stderr=ferr,
                env=job["env"],
                cwd="/",
                start_new_session=True,
            )
            own_uid = RUN_UID_BASE + process.pid if mode == "namespaces" and os.geteuid() == 0 else None
            exit_code, timed_out = _wait_or_kill(process, limits.timeout_s, own_uid)
            wall_s = time.monotonic() - start
            stdout, stderr = (_read_capped(file, limits.output_bytes) for file in (fout, ferr))
    finally:
        if work_dir:  # files the program made are its own (not root's): the removal needs write access
            _make_writable(work_dir)
            shutil.rmtree(work_dir, ignore_errors=True)
    if exit_code == EXIT_SETUP_FAILED and stderr.startswith("sandbox setup failed"):
        raise RewardError(f"code sandbox ({mode}) could not start: {stderr.strip()[:500]}")
    return ProgramRun(stdout, stderr, exit_code, timed_out, wall_s)


@functools.cache
def resolve_isolation(isolation: str) -> Literal["namespaces", "rlimits"]:
    """`auto` -> `namespaces` if a trivial program runs in them here, else `rlimits` (probed once)."""
    if isolation not in ("auto", "namespaces", "rlimits"):
        raise RewardError(f"code sandbox: isolation={isolation!r} is not one of auto, namespaces, rlimits")
    if isolation != "auto":
        return isolation
    try:
        run = run_program("print('ok')", limits=SandboxLimits(timeout_s=10), isolation="namespaces")
    except RewardError as err:
        reason = str(err)
    else:
        if run.stdout == "ok\n":
            return "namespaces"
        reason = f"a trivial program ended with exit code {run.exit_code}: {run.stderr.strip()[-300:]}"
    warnings.warn(
        "code sandbox: namespaces are unavailable, so programs run with isolation=rlimits (no private "
        f"filesystem view, pid or network namespace; see relayrl/rewards/sandbox.py): {reason}",
        RelayWarning,
        stacklevel=2,
    )
    return "rlimits"


@functools.cache
def interpreter_view() -> InterpreterView:
    """This interpreter's prefix, its binary, its site-packages and the library directories it needs (once)."""
    prefix = os.path.realpath(sys.base_prefix)
    python = os.path.realpath(sys.executable)
    if not python.startswith(prefix + os.sep):  # a venv made with --copies: its binary is outside the prefix
        python = os.path.join(prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")
    if not os.path.isfile(python):
        raise RewardError(f"code sandbox: no interpreter found under sys.base_prefix {prefix} (looked for {python})")
    paths = sysconfig.get_paths(vars={"base": prefix, "platbase": prefix, "installed_base": prefix})
    site = {os.path.realpath(paths[key]) for key in ("purelib", "platlib")}
    hidden = sorted(
        os.path.relpath(path, prefix) for path in site if os.path.isdir(path) and path.startswith(prefix + os.sep)
    )
    extensions = glob.glob(os.path.join(paths["platstdlib"], "lib-dynload", "*.so"))
    return InterpreterView(
        prefix, os.path.relpath(python, prefix), tuple(hidden), *_library_dirs([python, *extensions], prefix)
    )


def _library_dirs(binaries: list[str], prefix: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Where the shared libraries `binaries` link live (ldd): (directories to bind at their host paths, as ldd
    names them and resolved; directories inside `prefix`, relative to it, which the view shows under /python).
    The loader is always bound at its host path: the kernel execs it by the path written in the binary."""
    try:
        # the program's own scrubbed environment: an LD_LIBRARY_PATH of ours (torch's lib/, set once vLLM or torch
        # is imported) would make ldd name libraries the program never loads, some under the /tmp the view hides
        listing = subprocess.run(["ldd", *binaries], capture_output=True, text=True, timeout=120, env=ENV).stdout
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RewardError(f"code sandbox: cannot list the interpreter's shared libraries with ldd: {err}") from None

    def directories(pattern: str) -> set[str]:
        return {
            os.path.dirname(path)
            for library in re.findall(pattern, listing, re.MULTILINE)
            for path in _link_chain(library)
        }

    def inside(directory: str) -> bool:
        return (os.path.realpath(directory) + os.sep).startswith(prefix + os.sep)

    linked, loaders = directories(r"=> (/\S+) \(0x"), directories(r"^\s+(/\S+) \(0x")
    bind = {d for d in linked if not inside(d)} | loaders
    real = {d: os.path.realpath(d) for d in bind}
    outermost = sorted(d for d in bind if not any(real[d].startswith(real[other] + os.sep) for other in bind))
    in_prefix = sorted({os.path.relpath(os.path.realpath(d), prefix) for d in linked if inside(d)})
    return tuple(outermost), tuple(in_prefix)


def _link_chain(path: str) -> list[str]:
    """`path`, each path its symlinks lead to (/lib64/ld-linux.so -> /lib/x86_64-linux-gnu/ld-linux.so), its
    real path: the view needs every directory on the way for the link to resolve inside it."""
    chain = [path]
    while os.path.islink(chain[-1]) and len(chain) < 40:
        chain.append(os.path.normpath(os.path.join(os.path.dirname(chain[-1]), os.readlink(chain[-1]))))
    return chain + [os.path.realpath(path)]


def _wait_or_kill(process: subprocess.Popen, timeout_s: float, own_uid: int | None) -> tuple[int, bool]:
    """(exit code, timed out) of the launcher, once nothing it started is left (`own_uid`: the program's uid of its
    own, as root)."""
    try:
        process.wait(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    kill_group(process.pid)  # the launcher's group: with namespaces this ends them, too
    code = process.wait()
    wait_group_gone(process.pid)
    if own_uid is not None:
        wait_uid_gone(own_uid)
    return (128 + signal.SIGKILL if timed_out else (code if code >= 0 else 128 - code)), timed_out


def _verdict(case: dict, run: ProgramRun) -> TestResult:
    if run.timed_out:
        return TestResult(False, "timeout", run)
    if run.exit_code != 0:
        return TestResult(False, f"exit code {run.exit_code}", run)
    if "stdout" in case:
        passed = _normalise(run.stdout) == _normalise(str(case["stdout"]))
    else:
        passed = _literal(run.stdout) == _as_lists(case["expected"])
    return TestResult(passed, "passed" if passed else "wrong output", run)


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


_NOT_A_LITERAL = object()


def _literal(text: str) -> Any:
    try:
        return _as_lists(ast.literal_eval(text))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _NOT_A_LITERAL


def _as_lists(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_as_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_lists(v) for k, v in value.items()}
    return value


def _read_capped(file, limit: int) -> str:
    file.seek(0)
    return file.read(limit).decode("utf-8", errors="replace")


def _user_processes() -> int:
    uid = os.getuid()
    count = 0
    for entry in os.scandir("/proc"):
        with contextlib.suppress(OSError):
            count += entry.name.isdigit() and entry.stat().st_uid == uid
    return count


def _make_writable(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        try:
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o700)
        except OSError:
            pass
