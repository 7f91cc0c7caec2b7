"""Kill a run with SIGKILL mid-training, resume it, and get the same metrics as a run never interrupted (sync);
under async, the resumed run trains every prompt the uninterrupted one would, none staler than the bound."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from benchmarks.learning_cases import AGENT_RETRY, run_cli, run_in_process, write_config
from tests.e2e.test_reproducible import without_gaps

pytestmark = pytest.mark.slow

VOLATILE = ("time/", "time_frac/", "throughput/", "sync/GBps")  # wall-clock figures differ run to run
# mismatch/* compares the engine's behaviour log-probs with the learner's: ~1e-6 float noise that depends on
# the engine's history (a resumed run's engine is a fresh one); measured 1.7e-6 apart on mismatch/logprob_abs_max
NOISE_TOLERANCE = {"mismatch/": 1e-5}


def metric_rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith(VOLATILE)} for row in rows]


def assert_same_metrics(expected, got):
    """Every numeric key of every step equal to 1e-6, absolute or relative (mismatch/* to its noise), no key missing
    or extra. Relative too: on a loaded machine fp32 reductions may run in another order (measured beside a busy
    core: actor/grad_norm 5.4242630 resumed vs 5.4242606 straight, 4.4e-7 apart relatively); a resume that got
    anything wrong (another batch, optimizer state, RNG) moves every metric far more."""
    assert [r["step"] for r in got] == [r["step"] for r in expected]
    for want, have in zip(expected, got):
        assert want.keys() == have.keys()
        for key, value in want.items():
            tolerance = next((t for prefix, t in NOISE_TOLERANCE.items() if key.startswith(prefix)), 1e-6)
            assert have[key] == pytest.approx(value, rel=1e-6, abs=tolerance), (want["step"], key)


def test_killed_run_resumes_to_the_same_metrics(tmp_path, warm_model_dir, toy_task, straight_sync_run):
    straight, settings = straight_sync_run.dir, straight_sync_run.settings
    killed = tmp_path / "killed"
    config = write_config(tmp_path / "b.yaml", warm_model_dir, toy_task, killed, "vllm")
    kill_after_checkpoint(config, settings, killed, "step_000001")  # somewhere in step 2 (or writing its metrics)

    resumed = run_in_process("train", str(config), *settings, "--resume", str(killed))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout and "step_000001" in resumed.stdout
    assert [r["step"] for r in metric_rows(killed)] == list(range(4))
    assert_same_metrics(metric_rows(straight), metric_rows(killed))
    assert json.loads((killed / "eval.json").read_text()) == json.loads((straight / "eval.json").read_text())
    assert sorted(p.name for p in (killed / "checkpoints").glob("step_*")) == ["step_000001", "step_000003"]


def kill_after_checkpoint(config, settings, run_dir, step_dir: str) -> None:
    """Start `relayrl train`, SIGKILL it once `checkpoints/<step_dir>` exists (somewhere in the next step)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "relayrl.cli", "train", str(config), *settings],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 600
    while not (run_dir / "checkpoints" / step_dir).is_dir() and process.poll() is None:
        assert time.time() < deadline
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (run_dir / "eval.json").exists()


def test_a_killed_async_run_resumed_trains_every_prompt_the_uninterrupted_run_would(
    tmp_path, warm_model_dir, toy_task, ray_address
):
    """One producer, on_stale=wait: the uninterrupted run trains the sampler's draws in order, G per step (step v
    takes tickets [vG, (v+1)G)), so the expected prompts are the sampler's first steps x G. The kill lands while
    the producers are a batch or two ahead; the resumed run must draw those prompts again, not skip them."""
    from relayrl.config import Config
    from relayrl.data.source import PromptSampler, load_prompts
    from relayrl.models.loading import load_tokenizer

    steps, groups, n = 4, 8, 4
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "e.yaml", warm_model_dir, toy_task, run_dir, "vllm")
    settings = [
        *(
            "placement.mode=ray",
            f"placement.address={ray_address}",
            "train.schedule=async",
            "train.on_stale=wait",
            "train.max_staleness=1",
        ),
        *(f"train.steps={steps}", f"rollout.prompts_per_step={groups}", f"rollout.n={n}"),
        *("checkpoint.every=1", "checkpoint.keep=2", "eval.max_prompts=8", "log.save_model=false"),
        *("log.samples.every=1", f"log.samples.max_per_step={groups * n}"),
    ]
    kill_after_checkpoint(config, settings, run_dir, "step_000001")
    resumed = run_in_process("train", str(config), *settings, "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout

    metrics = metric_rows(run_dir)
    assert [r["step"] for r in metrics] == list(range(steps))
    assert max(r["stale/version_max"] for r in metrics) <= 1  # the bound holds across the resume
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    trained = {step: sorted({s["sample"].split("#")[0] for s in samples if s["step"] == step}) for step in range(steps)}
    prompts, _ = load_prompts(toy_task["train"], load_tokenizer(str(warm_model_dir)), 16)
    sampler = PromptSampler(prompts, Config.model_validate({"model": {"path": "m"}}).train.seed, shuffle=True)
    draws = [p.id for p in sampler.next(steps * groups)]
    expected = {step: sorted(draws[step * groups : (step + 1) * groups]) for step in range(steps)}
    assert trained == expected


def test_a_corrupt_checkpoint_falls_back_to_the_previous_one(tmp_path, straight_sync_run):
    run_dir = tmp_path / "run"
    shutil.copytree(straight_sync_run.dir, run_dir)  # checkpoints after steps 1 and 3
    newest = run_dir / "checkpoints" / "step_000003" / "trainer_state.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # a torn write
    config, settings = straight_sync_run.config, straight_sync_run.settings
    resumed = run_in_process("train", str(config), *settings, "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "step_000003 is unusable (trainer_state.pt does not match its checksum)" in resumed.stdout
    assert "resuming from" in resumed.stdout and "step_000001" in resumed.stdout
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == list(range(4))
    assert_same_metrics(metric_rows(straight_sync_run.dir), metric_rows(run_dir))


def test_resume_without_checkpoints_is_a_clear_error(tmp_path, warm_model_dir, toy_task):
    config = write_config(tmp_path / "d.yaml", warm_model_dir, toy_task, tmp_path / "run", "vllm")
    result = run_in_process("train", str(config), "--resume", str(tmp_path / "nothing"))
    assert result.returncode == 2 and "no usable checkpoint" in result.stderr


def test_a_killed_agent_run_resumes_to_the_same_metrics_and_samples(tmp_path, warm_model_dir, toy_task):
    """env.agent (an OpenAI-client agent: examples/openai_agent) has nothing of its own to lose: a run killed
    mid-step and resumed gives the uninterrupted run's metrics and every one of its samples."""
    settings = [
        *AGENT_RETRY,
        *("train.steps=3", "checkpoint.every=2", "checkpoint.keep=2", "rollout.prompts_per_step=8"),
        *("eval.max_prompts=16", "log.save_model=false", "log.progress=false", "log.samples.every=1"),
    ]
    runs = {}
    for name in ("straight", "killed"):
        runs[name] = tmp_path / name
        config = write_config(tmp_path / f"{name}.yaml", warm_model_dir, toy_task, runs[name], "hf")
        # each run a process of its own: in the test's process the resumed run's grad norm differed from the
        # straight run's by 1.0e-6 relatively (5.1668229 vs 5.1668282), past this test's float-noise bound
        if name == "straight":
            done = run_cli("train", str(config), *settings)
        else:
            kill_after_checkpoint(config, settings, runs[name], "step_000001")  # somewhere in step 2
            done = run_cli("train", str(config), *settings, "--resume", str(runs[name]))
            assert "resuming from" in done.stdout and "step_000001" in done.stdout
        assert done.returncode == 0, done.stderr[-3000:]
    assert_same_metrics(metric_rows(runs["straight"]), metric_rows(runs["killed"]))
    samples = {name: (run / "samples.jsonl").read_text().splitlines() for name, run in runs.items()}
    straight = [json.loads(line) for line in samples["straight"]]
    killed = [json.loads(line) for line in samples["killed"]]
    assert [s["step"] for s in killed] == [s["step"] for s in straight]
    for want, have in zip(straight, killed):  # the per-token gaps are float noise of a fresh engine (as mismatch/*)
        assert without_gaps(have) == without_gaps(want)
    assert json.loads((runs["killed"] / "eval.json").read_text()) == json.loads(
        (runs["straight"] / "eval.json").read_text()
    )
