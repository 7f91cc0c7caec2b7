"""Fault-injection soak: a long Ray run (2 engines, reward workers, async) that survives what clusters do to it.

On a fixed schedule (steps, in the order below, repeated) the soak kills an engine replica (SIGKILL), kills a
reward worker, makes one reward hang past its deadline, SIGTERMs the whole run and resumes it with `--resume`,
kills one of the two learner ranks (SIGKILL: the run restores the learner group from its newest checkpoint), and
SIGKILLs the whole run and resumes it. It watches `metrics.jsonl` and samples the RSS of the driver and of every Ray actor of the run
every few seconds. At the end it prints one table:

  steps completed | faults injected / survived | samples lost outside documented drops | hangs |
  engine and learner restarts | RSS per run segment

A hang is `--hang-s` seconds with no new metrics row. Not part of `make test` (minutes of wall clock):

    python benchmarks/soak.py [--steps 300] [--every 40] [--out runs/soak]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.learning_spread import fixtures  # noqa: E402

FAULTS = ("kill_engine", "kill_reward_worker", "hang_reward", "sigterm_resume", "kill_learner_rank", "sigkill_resume")
DOCUMENTED_DROPS = ("buffer/dropped", "reward/skipped", "partial/discarded")  # counted, not lost


def write_config(work: Path, task: dict, model: Path, run_dir: Path, steps: int) -> Path:
    config = {
        "model": {"path": str(model)},
        "data": {"train": str(task["train"]), "eval": str(task["eval"]), "max_prompt_tokens": 16},
        "rollout": {"engine": "vllm", "n": 8, "prompts_per_step": 16, "max_tokens": 6},
        "reward": {
            "fn": f"{ROOT}/benchmarks/soak_reward.py:score",
            "kwargs": {"flag_dir": str(work)},
            "workers": 2,
            "timeout_s": 5,
            "on_error": "zero",
        },
        "train": {"steps": steps, "lr": 5e-5, "schedule": "async", "max_staleness": 2, "on_stale": "wait"},
        "algorithm": {"correction": {"mode": "tis_token"}},
        "placement": {"mode": "ray", "engines": 2, "learner_cpus": 0.5, "engine_cpus": 0.75, "learner_ranks": 2},
        "checkpoint": {"every": 10},
        "eval": {"max_prompts": 100},
        "log": {"dir": str(run_dir), "progress": False, "save_model": False},
    }
    path = work / "soak.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        with contextlib.suppress(json.JSONDecodeError):  # a row being written
            out.append(json.loads(line))
    return out


def ray_actors(name: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if any(name in part for part in (p.info["cmdline"] or []))]


def wait_gone(name: str, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while ray_actors(name):
        if time.time() > deadline:
            raise RuntimeError(f"{len(ray_actors(name))} {name} processes outlived the killed run by {timeout_s:g} s")
        time.sleep(1)


def rss_mb(processes: list[psutil.Process]) -> float:
    total = 0
    for p in processes:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total / 2**20


class Soak:
    def __init__(self, config: Path, run_dir: Path, work: Path, hang_s: float):
        self.config, self.run_dir, self.work, self.hang_s = config, run_dir, work, hang_s
        self.injected: list[tuple[int, str]] = []
        self.rss: list[dict] = []
        self.hangs = 0
        self.resumes = 0
        self.process = None

    def start(self, resume: bool) -> None:
        args = [sys.executable, "-m", "relayrl.cli", "train", str(self.config)]
        if resume:
            args += ["--resume", str(self.run_dir)]
        log = open(self.work / "driver.log", "a")  # noqa: SIM115 - the driver writes into it until it ends
        self.process = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # its own process group: sigkill_resume kills the driver and what it started
        )

    def inject(self, fault: str, step: int) -> None:
        if fault == "kill_engine":
            os.kill(ray_actors("ray::EngineWorker")[0].pid, signal.SIGKILL)
        elif fault == "kill_reward_worker":
            os.kill(ray_actors("ray::RewardActor")[0].pid, signal.SIGKILL)
        elif fault == "hang_reward":
            (self.work / "hang").write_text("")
        elif fault == "sigterm_resume":
            self.process.send_signal(signal.SIGTERM)
            code = self.process.wait(timeout=120)
            if code != 128 + signal.SIGTERM:  # a preempted run exits 143 with a checkpoint
                raise RuntimeError(f"the run exited {code} after SIGTERM; see {self.work / 'driver.log'}")
            self.start(resume=True)
            self.resumes += 1
        elif fault == "kill_learner_rank":
            os.kill(ray_actors("ray::LearnerRank")[-1].pid, signal.SIGKILL)
        elif fault == "sigkill_resume":  # no checkpoint at the kill: the resumed run redoes the steps since the last
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=60)
            wait_gone("ray::", timeout_s=120)  # the head guard ends the session's actors with the driver
            self.start(resume=True)
            self.resumes += 1
        self.injected.append((step, fault))
        print(f"step {step}: injected {fault}", flush=True)

    def sample_rss(self) -> None:
        try:
            driver = psutil.Process(self.process.pid)
        except psutil.Error:  # between a run's exit and its resume
            return
        actors, driver_mb = ray_actors("ray::"), rss_mb([driver])
        if not driver_mb:  # it exited while being read
            return
        self.rss.append(
            {
                "t": time.time(),
                "driver_mb": driver_mb,
                "actors_mb": rss_mb(actors),
                "actors": len(actors),
                "segment": self.resumes,
            }
        )

    def run(self, every: int) -> int:
        self.start(resume=False)
        next_fault, last_rows, last_change = every, 0, time.time()
        while self.process.poll() is None:  # after a SIGTERM, self.process is the resumed run
            time.sleep(2)
            self.sample_rss()
            done = len(rows(self.run_dir))
            if done != last_rows:
                last_rows, last_change = done, time.time()
            elif time.time() - last_change > self.hang_s:
                self.hangs += 1
                self.process.kill()
                raise RuntimeError(f"no metrics row for {self.hang_s:g} s at step {done}: a hang")
            if done >= next_fault and self.process.poll() is None:
                self.inject(FAULTS[len(self.injected) % len(FAULTS)], done)
                next_fault += every
        return self.process.returncode


def segments(samples: list[dict]) -> list[list[dict]]:
    """The samples of each run (before and after every SIGTERM-and-resume): a resume restarts every actor.
    A run's shutdown (its actors exiting one by one after the last step) is trimmed off its end."""
    out = [[]]
    for sample in samples:
        if sample.get("segment", 0) >= len(out):
            out.append([])
        out[-1].append(sample)
    for seg in out:
        running = max((sample["actors"] for sample in seg), default=0)
        while seg and seg[-1]["actors"] < running:
            seg.pop()
    return out


def slope_mb_per_min(samples: list[dict], key: str) -> float:
    """Least-squares slope over the second half of each run segment (after start-up and warm-up), the mean
    of the segments' slopes weighted by their length."""
    slopes = [(len(seg), _slope(seg[len(seg) // 2 :], key)) for seg in segments(samples) if len(seg) >= 4]
    return sum(n * s for n, s in slopes) / sum(n for n, _ in slopes) if slopes else 0.0


def _slope(half: list[dict], key: str) -> float:
    if len(half) < 2:
        return 0.0
    t0 = half[0]["t"]
    xs, ys = [(s["t"] - t0) / 60 for s in half], [s[key] for s in half]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0


def report(soak: Soak, code: int, steps: int, expected_per_step: int) -> dict:
    metrics = rows(soak.run_dir)
    log = (soak.work / "driver.log").read_text(errors="replace")
    trained = [round(r["throughput/samples_per_s"] * r["time/step"]) for r in metrics]
    drops = sum(r.get(k, 0.0) for r in metrics for k in DOCUMENTED_DROPS)
    lost = sum(max(0, expected_per_step - n) for n in trained)
    result = {
        "exit_code": code,
        "steps_completed": len({r["step"] for r in metrics}),
        "steps": steps,
        "faults_injected": len(soak.injected),
        "faults_survived": len(soak.injected) if code == 0 else 0,
        "faults": [f"{s}:{f}" for s, f in soak.injected],
        "hangs": soak.hangs,
        "samples_lost": lost,
        "documented_drops": drops,
        "reward_timeouts": sum(r.get("reward/timeouts", 0.0) for r in metrics),
        "reward_errors": sum(r.get("reward/errors", 0.0) for r in metrics),
        "engine_restarts": max((r.get("placement/engine_restarts", 0.0) for r in metrics), default=0),
        "learner_restarts": sum(1 for line in log.splitlines() if "restarting the learner from" in line),
        "engine_restart_lines": sum(1 for line in log.splitlines() if "restarting engine" in line),
        "hangs_that_bit": len(list(soak.work.glob("hang.claimed.*"))),
        "actors_mb_per_segment": [
            [round(seg[len(seg) // 2]["actors_mb"]), round(seg[-1]["actors_mb"])] for seg in segments(soak.rss) if seg
        ],
        "driver_mb_per_segment": [
            [round(seg[len(seg) // 2]["driver_mb"]), round(seg[-1]["driver_mb"])] for seg in segments(soak.rss) if seg
        ],
        "driver_rss_slope_mb_per_min": round(slope_mb_per_min(soak.rss, "driver_mb"), 2),
        "actors_rss_slope_mb_per_min": round(slope_mb_per_min(soak.rss, "actors_mb"), 2),
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=40, help="steps between faults")
    parser.add_argument("--hang-s", type=float, default=240.0)
    parser.add_argument("--out", default="runs/soak")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        task, model = fixtures(work)
        run_dir = out / "run"
        shutil.rmtree(run_dir, ignore_errors=True)
        config = write_config(work, task, model, run_dir, args.steps)
        soak = Soak(config, run_dir, work, args.hang_s)
        code = soak.run(args.every)
        result = report(soak, code, args.steps, expected_per_step=16 * 8)
        (out / "rss.jsonl").write_text("".join(json.dumps(s) + "\n" for s in soak.rss))
        (out / "driver.log").write_text((work / "driver.log").read_text())
    (out / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    for key, value in result.items():
        print(f"{key:30s} {value}")


if __name__ == "__main__":
    main()
