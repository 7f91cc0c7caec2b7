"""The code sandbox's filesystem view: a program sees the interpreter and its standard library (read-only),
the shared libraries they link, a minimal /dev, its own /proc and scratch tmpfs, and nothing else. A policy
that learns to read its test's expected output from the training data, a checkpoint or the source tree is
reward hacking the verifier cannot see, so each of those is a program here that must come back empty.

With `isolation=rlimits` (no namespaces) there is no private view: those tests are skipped, and the mode's
limits are in sandbox.py's docstring.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import sysconfig
import textwrap
import warnings
from pathlib import Path

import pytest

from relayrl.errors import RewardError
from relayrl.rewards import sandbox
from relayrl.rewards.sandbox import SandboxLimits, resolve_isolation, run_program, run_tests

ROOT = Path(__file__).resolve().parents[2]
LIMITS = SandboxLimits(timeout_s=10, cpu_s=5, memory_mb=512, file_mb=4, disk_mb=16, output_bytes=16384)
EXPECTED = "relayrl-expected-output-5d1e0b"  # a test's expected output, as the training data holds it


def namespaces_available() -> bool:
    """Whether this machine lets a process make user/mount/pid namespaces at all (`unshare`), asked apart from
    the sandbox: a view the sandbox fails to build where namespaces exist is a bug to see, not a skip."""
    import subprocess

    try:
        return (
            subprocess.run(
                ["unshare", "--user", "--map-root-user", "--mount", "--pid", "--fork", "true"],
                capture_output=True,
                timeout=30,
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def isolation():
    if not namespaces_available():
        pytest.skip("no namespaces here: the sandbox has no private filesystem view in rlimits mode")
    assert resolve_isolation("auto") == "namespaces", "namespaces exist here, yet the sandbox fell back to rlimits"
    return "namespaces"


@pytest.fixture
def run_dir():
    """A run directory as training writes it (under the gitignored runs/): data, a checkpoint, a model."""
    directory = ROOT / "runs" / f"sandbox-view-{id(object())}"
    (directory / "checkpoints" / "step_2").mkdir(parents=True)
    (directory / "train.jsonl").write_text(json.dumps({"prompt": "add", "tests": [{"stdin": "", "stdout": EXPECTED}]}))
    (directory / "checkpoints" / "step_2" / "model.safetensors").write_bytes(b"\0" * 64)
    yield directory
    for path in sorted(directory.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    directory.rmdir()


def run_ok(program: str, isolation: str, stdin: str = "") -> str:
    run = run_program(program, stdin=stdin, limits=LIMITS, isolation=isolation)
    assert run.exit_code == 0 and not run.timed_out, run
    return run.stdout


def test_root_holds_no_work_root_or_home(isolation):
    listing = json.loads(run_ok("import json, os\nprint(json.dumps(sorted(os.listdir('/'))))", isolation))
    assert not {"work", "root", "home", "etc", "mnt", "opt", "srv"} & set(listing), listing
    assert "tmp" in listing and "proc" in listing


def test_training_data_source_and_checkpoints_are_not_readable(tmp_path, run_dir, isolation):
    own_data = tmp_path / "train.jsonl"
    own_data.write_text(json.dumps({"tests": [{"stdin": "", "stdout": EXPECTED}]}))
    targets = [
        own_data,
        run_dir / "train.jsonl",
        ROOT / "examples" / "code_task" / "train.jsonl",
        Path(sandbox.__file__),
        run_dir / "checkpoints" / "step_2" / "model.safetensors",
        Path("/etc/passwd"),
        Path.home() / ".bashrc",
    ]
    program = textwrap.dedent(f"""\
        import json
        seen = {{}}
        for path in {[str(t) for t in targets]!r}:
            try:
                seen[path] = open(path, 'rb').read(200).decode('latin-1')
            except OSError as err:
                seen[path] = type(err).__name__
        print(json.dumps(seen))
        """)
    seen = json.loads(run_ok(program, isolation))
    readable = {path: text for path, text in seen.items() if text not in ("FileNotFoundError", "PermissionError")}
    assert readable == {}, f"the program read {sorted(readable)}"


def test_a_search_for_datasets_checkpoints_and_homes_finds_nothing(run_dir, isolation):
    program = textwrap.dedent(f"""\
        import json, os
        found = []
        for top, dirs, files in os.walk('/'):
            dirs[:] = [] if top in ('/proc', '/sys', '/dev') else dirs
            found += [os.path.join(top, d) for d in dirs if d in ('runs', 'checkpoints', 'home', '.cache')]
            found += [os.path.join(top, f) for f in files
                      if f.endswith(('.safetensors', '.jsonl', '.parquet', '.pt', '.ckpt')) or f == 'sandbox.py']
        found += [p for p in ({str(run_dir)!r}, {str(ROOT)!r}, '/work', '/root', '/home') if os.path.exists(p)]
        print(json.dumps(found))
        """)
    assert json.loads(run_ok(program, isolation)) == []


def test_the_interpreter_and_stdlib_are_read_only(isolation):
    program = textwrap.dedent("""\
        import os, sys, sysconfig
        for directory in (sys.prefix, os.path.dirname(os.__file__), sysconfig.get_path('platstdlib'), '/', '/usr/lib'):
            try:
                open(os.path.join(directory, 'hostile-planted'), 'w').write('x')
                print('wrote', directory)
            except OSError as err:
                print(type(err).__name__, err.strerror)
        try:
            os.chmod(os.__file__, 0o777)
            print('chmod', os.__file__)
        except OSError as err:
            print(type(err).__name__, err.strerror)
        """)
    lines = run_ok(program, isolation).splitlines()
    assert len(lines) == 6 and not any(line.startswith(("wrote", "chmod")) for line in lines), lines
    assert all("Read-only file system" in line for line in lines), lines


def test_site_packages_are_not_visible(isolation):
    """The code reward runs plain Python tests: no installed package (the venv's or the interpreter's)."""
    venv_site = sysconfig.get_paths()["purelib"]
    program = textwrap.dedent(f"""\
        import os, sysconfig
        for path in ({venv_site!r}, sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']):
            print(sorted(os.listdir(path)) if os.path.isdir(path) else [])
        for name in ('relayrl', 'numpy', 'torch', 'pytest'):
            try:
                __import__(name)
                print('imported', name)
            except ImportError:
                pass
        """)
    assert run_ok(program, isolation).splitlines() == ["[]", "[]", "[]"]


def test_ordinary_programs_still_work(isolation):
    program = textwrap.dedent("""\
        import collections, functools, itertools, json, math, re, sys, os, tempfile
        import bisect, datetime, decimal, fractions, hashlib, heapq, random, statistics, string
        import ctypes, sqlite3, ssl, zlib, bz2, lzma  # extension modules that link the system's libraries
        numbers = [int(x) for x in sys.stdin.read().split()]
        counts = collections.Counter(n % 3 for n in numbers)
        total = functools.reduce(lambda a, b: a + b, itertools.chain(numbers, [0]))
        words = re.findall(r'[a-z]+', 'abc 12 de')
        with open('scratch.txt', 'w') as f:  # the working directory is the program's scratch space
            f.write(json.dumps(numbers))
        with tempfile.NamedTemporaryFile('w+') as f:
            f.write('tmp ok')
            f.seek(0)
            tmp = f.read()
        db = sqlite3.connect(':memory:')
        db.execute('create table t (x)')
        db.execute('insert into t values (7)')
        print(total, math.isqrt(total), dict(sorted(counts.items())), words, open('scratch.txt').read(), tmp,
              db.execute('select x from t').fetchone()[0], len(os.urandom(4)), os.getcwd(), zlib.crc32(b'a'),
              str(decimal.Decimal(1) / 4), statistics.median(numbers))
        """)
    out = run_ok(program, isolation, stdin="3 4 5 6\n")
    assert out == "18 4 {0: 2, 1: 1, 2: 1} ['abc', 'de'] [3, 4, 5, 6] tmp ok 7 4 /tmp/work 3904355907 0.25 4.5\n"


def test_devices_scratch_and_a_child_interpreter_work(isolation):
    program = textwrap.dedent("""\
        import multiprocessing, os, subprocess, sys
        child = subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True)
        with multiprocessing.Pool(2) as pool:
            squares = pool.map(abs, [-1, -2])
        print(open('/dev/null', 'w').write('x'), len(open('/dev/urandom', 'rb').read(3)),
              open('/dev/zero', 'rb').read(2), child.stdout.strip(), squares, sorted(os.listdir('/dev')),
              os.access('/tmp', os.W_OK), os.access('/dev/shm', os.W_OK), os.environ['HOME'])
        """)
    assert run_ok(program, isolation) == (
        "1 3 b'\\x00\\x00' 42 [1, 2] ['fd', 'null', 'random', 'shm', 'stderr', "
        "'stdin', 'stdout', 'urandom', 'zero'] True True /tmp/work\n"
    )


def test_stdin_and_call_tests_pass_in_the_view(isolation):
    program = (
        "import sys\ndef add(a, b):\n    return a + b\nif __name__ == '__main__':\n"
        "    print(add(*map(int, sys.stdin.read().split())))\n"
    )
    report = run_tests(
        program, [{"stdin": "2 3\n", "stdout": "5"}, {"call": "add(2, 3)", "expected": 5}], LIMITS, isolation
    )
    assert report.pass_fraction == 1.0, report


def test_our_library_path_stays_out_of_the_view(monkeypatch, tmp_path, isolation):
    """Once torch or vLLM is imported, LD_LIBRARY_PATH names their lib/ (here: a directory under /tmp, which
    the view's staging hides). The view follows the program's scrubbed environment, not ours."""
    import shutil
    import subprocess

    base = os.path.realpath(sys.base_prefix)
    stdlib = sysconfig.get_paths(vars={"base": base, "platbase": base, "installed_base": base})["platstdlib"]
    zlib_ext = next(Path(stdlib, "lib-dynload").glob("zlib*.so"))
    listing = subprocess.run(["ldd", str(zlib_ext)], capture_output=True, text=True).stdout
    libz = next(line.split("=>")[1].split("(")[0].strip() for line in listing.splitlines() if "libz.so" in line)
    ours = tmp_path / "lib"
    ours.mkdir()
    shutil.copy(libz, ours)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(ours))
    sandbox.interpreter_view.cache_clear()
    try:
        assert run_ok("import zlib; print(zlib.crc32(b'a'))", isolation) == "3904355907\n"
        assert not any(d.startswith(str(tmp_path)) for d in sandbox.interpreter_view().library_dirs)
    finally:
        sandbox.interpreter_view.cache_clear()


def test_a_view_that_cannot_be_built_is_one_clear_error(monkeypatch, isolation):
    missing = "/nonexistent-python-prefix"
    view = dataclasses.replace(sandbox.interpreter_view(), prefix=missing)
    monkeypatch.setattr(sandbox, "interpreter_view", lambda: view)
    with pytest.raises(RewardError) as caught:
        run_program("print(1)", limits=LIMITS, isolation=isolation)
    message = str(caught.value)
    assert "could not start" in message and "filesystem view" in message and missing in message
    assert "Traceback" not in message and message.count("\n") == 0


def test_auto_falls_back_to_rlimits_with_one_warning_naming_the_reason(monkeypatch):
    def refuse(*args, **kwargs):
        raise RewardError("code sandbox (namespaces) could not start: sandbox setup failed: unshare: EPERM")

    monkeypatch.setattr(sandbox, "run_program", refuse)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sandbox.resolve_isolation.__wrapped__("auto") == "rlimits"
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "unshare: EPERM" in messages[0] and "rlimits" in messages[0], messages
