"""The teacher's share of the learner's step by `teacher.engine`: `local` (a forward in the learner's process),
`actor` (the same forward in a Ray actor of its own: each batch travels to it and back), and `vllm` (a vLLM engine's
prompt log-probs: in this process, as placement.mode=local runs it, and in a Ray actor, as placement.mode=ray does).

The student and a larger teacher (hidden 256, 4 layers) with the student's tokenizer, the synthetic batch
(`--groups` x `--n` rows, prompt 16 and response `--response` tokens) and the timing of the learner's phases of a
distillation step (`prepare`, the teacher's scoring, the advantage stage, `update`; best of `--repeats` after a
warm-up) are benchmarks/distill_teacher_share.py's. Per engine, printed: each phase's seconds, the teacher's share of
the step, the teacher's time against the local engine's measured in the same run (`vs local`) and against the
student's forward of the same case (`T/logp`: steadier on a shared machine, whose load moves between cases). Every
engine's log-probs are compared with the local engine's on the same batch (`max gap`).

Simplifications, stated: no rollout engine (the share is of the learner's phases only), CPU fp32 on shared cores
(the load average is printed), tiny models where fixed per-call costs (a Ray round trip, vLLM's scheduler) weigh
more than on a GPU. The actors get the threads this process has (`torch.get_num_threads()`).

Run: .venv/bin/python benchmarks/teacher_engines.py [--groups 8 --n 4 --response 48 --repeats 3]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling below, run as a script or a module
from distill_teacher_share import DISTILL, batch_arguments, learner_step_times, models_and_batch  # noqa: E402

from relayrl.algorithms.stage import advantage_stage  # noqa: E402
from relayrl.config import load_config  # noqa: E402
from relayrl.learner.role import LearnerRole  # noqa: E402
from relayrl.learner.settings import TeacherSettings  # noqa: E402
from relayrl.learner.teacher_role import TeacherRole  # noqa: E402
from relayrl.placement.sections import learner_settings  # noqa: E402
from relayrl.types import Rollout  # noqa: E402

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
        + DISTILL,
    )
    learner, stage = LearnerRole(learner_settings(config)), advantage_stage(config.algorithm, teacher=True)
    score = scorer(config, in_actor, 16 + max(len(r.response_ids) for r in rollouts) + 1, learner)
    best, exp = learner_step_times(learner, score, stage, rollouts, repeats)
    return best, exp.teacher_logprobs


def main() -> None:
    args = batch_arguments(__doc__.split("\n")[0])
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        with models_and_batch(args) as (student, large, rollouts):
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
