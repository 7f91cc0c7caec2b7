"""The teacher's share of the learner's step by `teacher.engine`: `local` (a forward in the learner's process),
`actor` (the same forward in a Ray actor of its own: each batch travels to it and back), and `vllm` (a vLLM engine's
prompt log-probs: in this process, as placement.mode=local runs it, and in a Ray actor, as placement.mode=ray does).

The student and a larger teacher (hidden 256, 4 layers) with the student's tokenizer, built here as in
benchmarks/distill_teacher_share.py, and its synthetic batch (`--groups` x `--n` rows, prompt 16 and response
`--response` tokens). Per engine: the learner's phases of a distillation step (`prepare`, the teacher's scoring, the
advantage stage, `update`), best of `--repeats` after a warm-up; printed: each phase's seconds, the teacher's share of
the step, the teacher's time against the local engine's measured in the same run (`vs local`) and against the
student's forward of the same case (`T/logp`: steadier on a shared machine, whose load moves between cases). Every
engine's log-probs are compared with the local engine's on the same batch (`max gap`).

Simplifications, stated: no rollout engine (the share is of the learner's phases only), CPU fp32 on shared cores
(the load average is printed), tiny models where fixed per-call costs (a Ray round trip, vLLM's scheduler) weigh
more than on a GPU. The actors get the threads this process has (`torch.get_num_threads()`).

Run: .venv/bin/python benchmarks/teacher_engines.py [--groups 8 --n 4 --response 48 --repeats 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.distill_teacher_share import batch, build_models
from relayrl.algorithms.stage import advantage_stage
from relayrl.config import load_config
from relayrl.learner.batching import make_experience
from relayrl.learner.role import LearnerRole
from relayrl.learner.settings import TeacherSettings
from relayrl.learner.teacher_role import TeacherRole
from relayrl.placement.sections import learner_settings
from relayrl.types import Rollout, Score

ENGINES = {  # case: (teacher.engine, in a Ray actor)
    "local": ("local", False),
    "actor": ("actor", True),
    "vllm (in process)": ("vllm", False),
    "vllm (own actor)": ("vllm", True),
}


def scorer(config, in_actor: bool, max_len: int, learner: LearnerRole):
    """What scores the batch: the learner (local), a TeacherRole here, or a handle on one in a Ray actor."""
    if config.teacher.engine == "local":
        return learner.score_teacher
    if not in_actor:
        return TeacherRole(TeacherSettings.of(learner_settings(config)), max_model_len=max_len).score_teacher
    import ray

    threads = torch.get_num_threads()
    actor = (
        ray.remote(TeacherRole)
        .options(num_cpus=1)
        .remote(TeacherSettings.of(learner_settings(config)), threads, max_len)
    )
    return lambda exp: ray.get(actor.score_teacher.remote(exp))


def measure(engine: str, in_actor: bool, student: Path, teacher: Path, rollouts: list[Rollout], repeats: int):
    """(best-of-`repeats` seconds of each phase, the teacher's log-probs of the last pass)."""
    mode = "ray" if in_actor else "local"
    config = load_config(
        None,
        [f"model.path={student}", f"teacher.path={teacher}", f"teacher.engine={engine}", f"placement.mode={mode}"]
        + ["algorithm.advantage=distill", "rollout.n=4", "train.lr=1e-5"],
    )
    learner, stage = LearnerRole(learner_settings(config)), advantage_stage(config.algorithm, teacher=True)
    score = scorer(config, in_actor, 16 + max(len(r.response_ids) for r in rollouts) + 1, learner)
    best: dict[str, float] = {}
    for _ in range(repeats + 1):
        times, exp = {}, make_experience(rollouts, [Score(1.0)] * len(rollouts), pad_id=0)
        for phase, run in (
            ("logprobs", learner.prepare),
            ("teacher", score),
            ("advantage", lambda e: stage(e, rollouts)),
            ("update", lambda e: (learner.update(0, e), e)[1]),
        ):
            start = time.perf_counter()
            exp = run(exp)
            times[phase] = time.perf_counter() - start
        best = times if not best else {k: min(best[k], times[k]) for k in times}  # the first pass is the warm-up
    return best, exp.teacher_logprobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--response", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            student, large = build_models(Path(scratch))
            rollouts = batch(args.groups, args.n, args.response, 40)
            print(f"{len(rollouts)} rows, prompt 16 + response {args.response}; load {os.getloadavg()[0]:.2f}")
            print(
                f"{'engine':20} {'logprobs':>9} {'teacher':>9} {'update':>9} {'share':>7} {'vs local':>8} "
                f"{'T/logp':>7} {'max gap':>8}"
            )
            local = None
            for name, (engine, in_actor) in ENGINES.items():
                t, logp = measure(engine, in_actor, student, large, rollouts, args.repeats)
                local = local or (t["teacher"], logp)
                gap = float((logp - local[1]).abs().max())
                print(
                    f"{name:20} {t['logprobs']:9.4f} {t['teacher']:9.4f} {t['update']:9.4f} "
                    f"{t['teacher'] / sum(t.values()):7.1%} {t['teacher'] / local[0]:8.2f} "
                    f"{t['teacher'] / t['logprobs']:7.2f} {gap:8.1e}"
                )
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
