"""Shared fixtures: tiny models and tokenizers built locally (nothing is downloaded), once per session."""

from __future__ import annotations

import os

# vLLM reads these at import time: a small KV cache, both cores (one per worker under xdist), the engine in this
# process.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
if "PYTEST_XDIST_WORKER" in os.environ:
    # One core per pytest-xdist worker (make test runs two): torch at one thread, an in-process engine on the
    # worker's own core. Two workers' OpenMP teams of two on two cores spin against each other: the warm start's
    # SFT took 278 s at two threads beside another job, 106 s at one.
    worker = int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(worker % (os.cpu_count() or 1))  # over the Makefile's 0-1
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# The tests' own Ray clusters (ray.init, simulated nodes) start no idle workers either, as a run's head does not
# (relayrl/placement/ray_head.py NO_PRESTART: each would cost ~0.7 s of CPU and be left unused).
for key, value in {"RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0"}.items():
    os.environ.setdefault(key, value)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

# Session fixtures that cost a run to make: the tests using one share a pytest-xdist group, so one worker makes it.
COSTLY_SESSION_FIXTURES = ("straight_sync_run",)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Under `pytest -n N --dist loadgroup` (make test), keep on one worker the tests that share a costly fixture:
    every test of a module with a module-scoped fixture (a sharded learner's ranks, a trained model), and the users
    of each costly session fixture. Without xdist the marks do nothing. A collected GPU-lock check starts its
    network-bound dry run now, in the background (tests/integration/test_gpu_lock_resolves.py)."""
    if any(item.name == "test_pip_resolves_the_gpu_lock_as_a_whole" for item in items):
        from tests.integration.test_gpu_lock_resolves import run_id_of, start_in_background

        start_in_background(run_id_of(config))
    for item in items:
        defs = getattr(item, "_fixtureinfo", None)
        for name, fixturedefs in defs.name2fixturedefs.items() if defs else ():
            if name in COSTLY_SESSION_FIXTURES:
                item.add_marker(pytest.mark.xdist_group(name))
            elif any(d.scope == "module" for d in fixturedefs):
                item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    if getattr(config.option, "loadgroup", False):  # set on each worker by xdist under --dist loadgroup
        put_groups_in_node_ids(items)


def put_groups_in_node_ids(items):
    """Put each item's group in its node id, which is what xdist's `loadgroup` schedules by. xdist 3.8 sets
    `item._nodeid`, which pytest 9.2 no longer reads (`nodeid` comes from `item._id`): without this no group is
    in effect and a group's tests land on both workers."""
    from _pytest.nodeid import NodeId

    for item in items:
        names = sorted(
            {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
        )
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix):  # xdist's own hook, after this one, adds nothing then
            item._id = NodeId.parse(item.nodeid + suffix)


@pytest.fixture(scope="session")
def toy_task(tmp_path_factory):
    from relayrl.data.toy import write_toy_task

    return write_toy_task(tmp_path_factory.mktemp("toy"), seed=0)


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory, toy_task):
    """A randomly initialised tiny Llama (head_dim 32) with a character tokenizer for the toy task."""
    from relayrl.models.tiny import build_tiny

    texts = [f"{a}+{b}={a + b}" for a in range(10) for b in range(10)] + [" "]
    out = tmp_path_factory.mktemp("random_model")
    build_tiny(texts, out, seed=0, hidden=64, layers=2, heads=2, intermediate=128)
    return out


@pytest.fixture(scope="session")
def warm_model_dir(tmp_path_factory, toy_task):
    """The demo's sloppy-teacher warm start, trained briefly (a few epochs of the toy SFT set): built once per
    content hash of relayrl's sources and kept across suites (tests/artifact_cache.py). Read it; never write into it."""
    from relayrl.learner.sft import SFTSettings, run_sft
    from tests.artifact_cache import cached

    settings = SFTSettings(epochs=4.0, batch_size=128)
    recipe = {"toy_seed": 0, "init": "tiny", "settings": repr(settings)}

    def build(out):
        assert run_sft(toy_task["sft"], out, init="tiny", settings=settings, log=lambda *_: None) == out

    return cached("warm_model", recipe, build, tmp_path_factory.mktemp("warm_model"))


@pytest.fixture(scope="module")  # module scope: its users' module stays on one xdist worker, as with a run fixture
def teacher_dir(tmp_path_factory, warm_model_dir, toy_task):
    """The distillation teacher: the warm start after two epochs of SFT on the true sums of its own problems
    (benchmarks/distill_gap.py `build_teacher`, ~40 s; kept across suites)."""
    from benchmarks.distill_gap import build_teacher
    from tests.artifact_cache import cached

    def build(out):
        build_teacher(warm_model_dir, toy_task["sft"], out)

    recipe = {"warm": str(warm_model_dir), "teacher": "true sums, 2 epochs"}
    return cached("distill_teacher", recipe, build, tmp_path_factory.mktemp("teacher") / "model")


@pytest.fixture(scope="module")
def dropcarry_teacher_dir(tmp_path_factory, warm_model_dir, toy_task):
    """The second routed teacher: the warm start after two epochs of SFT on its own problems answered without the
    carry into the tens (benchmarks/distill_routes.py `build_dropcarry_teacher`, ~40 s; kept across suites)."""
    from benchmarks.distill_routes import build_dropcarry_teacher
    from tests.artifact_cache import cached

    def build(out):
        build_dropcarry_teacher(warm_model_dir, toy_task["sft"], out)

    recipe = {"warm": str(warm_model_dir), "teacher": "dropped-carry sums, 2 epochs"}
    return cached("dropcarry_teacher", recipe, build, tmp_path_factory.mktemp("dropcarry_teacher") / "model")


@pytest.fixture(scope="session")
def ray_address():
    """One Ray head for the e2e runs that only need a cluster to place on, joined with `placement.address` (the
    path a user's own cluster takes): a run that starts its own head spends ~15 s starting and stopping it. The
    tests of a run's own head (its start, its end with the driver, signals, its processes) and runs whose workers
    need an environment set by the test keep their own. 8 logical CPUs, so that a run's actors still ending never
    leave the next run short."""
    from relayrl.placement.ray_head import start_head

    head = start_head(8)
    yield head.address
    head.stop()


@pytest.fixture(scope="session")
def straight_sync_run(tmp_path_factory, warm_model_dir, toy_task):
    """A 4-step sync run through vLLM, never interrupted, with checkpoints after steps 1 and 3 (both kept; the
    pruning of older ones is tests/unit/test_checkpoint.py's): what the kill, signal and corrupt-checkpoint resume
    tests compare with (`settings` is how each of them runs; read the run, copy it before changing it)."""
    from types import SimpleNamespace

    from benchmarks.learning_cases import run_in_process, write_config

    settings = [
        "train.steps=4",
        "checkpoint.every=2",
        "checkpoint.keep=2",
        "eval.max_prompts=16",
        "rollout.prompts_per_step=16",
        "log.save_model=false",
        "log.progress=false",
    ]
    root = tmp_path_factory.mktemp("straight")
    config = write_config(root / "straight.yaml", warm_model_dir, toy_task, root / "run", "vllm")
    result = run_in_process("train", str(config), *settings)
    assert result.returncode == 0, result.stderr[-3000:]
    return SimpleNamespace(dir=root / "run", config=config, settings=settings)
