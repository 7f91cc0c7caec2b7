"""`learner.return_freed_memory` (relayrl/learner/malloc.py): a CPU learner built with it fixes glibc's mmap
threshold, so a freed block of 64 KiB or more leaves the process's RSS at once; without it glibc's sliding
threshold keeps such blocks in the heap. Each case in a fresh interpreter (the setting is per process). The
memory it saves over a whole update, and its time cost, are measured by benchmarks/scaling.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# after one 1 MiB block is freed, glibc's threshold slides above 2 MiB: a 2 MiB block freed then stays resident
PROBE = """
import ctypes, resource
def rss_kb():
    return int(open('/proc/self/statm').read().split()[1]) * resource.getpagesize() // 1024
libc = ctypes.CDLL('libc.so.6'); libc.malloc.restype = ctypes.c_void_p; libc.free.argtypes = [ctypes.c_void_p]
libc.free(libc.malloc(4 << 20))  # a mapped block freed: the sliding threshold rises to 4 MiB
block = libc.malloc(2 << 20); ctypes.memset(block, 1, 2 << 20)
before = rss_kb(); libc.free(block); print(before - rss_kb())
"""


def freed_kb(model_dir=None) -> int:
    """KB of RSS a 2 MiB free gave back, after a learner with learner.return_freed_memory=true was built in the
    process (`model_dir`), or in a bare interpreter (glibc's default)."""
    learner = (
        "from relayrl.config import load_config; from relayrl.learner.policy import PolicyLearner; from relayrl.placement.sections import learner_settings; "
        f"PolicyLearner(learner_settings(load_config(None, ['model.path={model_dir}', 'learner.return_freed_memory=true'])))\n"
    )
    code = (learner if model_dir else "") + PROBE
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.strip().splitlines()[-1])


def test_a_learner_with_return_freed_memory_gives_a_freed_block_back(random_model_dir):
    assert freed_kb(random_model_dir) >= 1800  # the 2 MiB block's pages left RSS when it was freed
    assert freed_kb() < 200  # glibc's default kept them in the heap


def test_on_a_gpu_learner_the_key_is_named_as_having_no_effect():
    from relayrl.config import load_config
    from relayrl.errors import ConfigWarning
    from relayrl.learner import malloc

    config = load_config(None, ["learner.return_freed_memory=true"])
    with pytest.warns(ConfigWarning, match="learner.return_freed_memory has no effect on a cuda learner"):
        malloc.apply(config.learner, "cuda")


def test_without_glibc_the_key_is_refused_by_name(monkeypatch):
    import ctypes

    from relayrl.errors import ConfigError
    from relayrl.learner import malloc

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    with pytest.raises(ConfigError, match=r"learner.return_freed_memory=true needs glibc's mallopt: libc.so.6"):
        malloc.return_freed_memory()
