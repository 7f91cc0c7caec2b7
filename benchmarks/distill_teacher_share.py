"""The teacher's share of the learner's step (on-policy distillation, `teacher.engine: local`), at a few teacher
sizes, and with two teachers routed by a column.

One student (a tiny random Llama, hidden 128, 3 layers) and, per case, its teacher(s) built here with the student's
tokenizer: the same size as the student (T/P = 1), a larger one (hidden 256, 4 layers), and two student-sized
teachers routed half the rows each (`teacher.teachers`). Each case runs the learner's phases of a distillation step
on the same synthetic batch (`--groups` x `--n` rows, prompt 16 and response `--response` tokens) in this process:
`prepare` (the student's pre-update log-probs), `score_teacher`, the advantage stage and `update`, best of
`--repeats` after a warm-up. Printed per case: each phase's seconds, the teacher's share of that learner step, its
time against the student's forward measured in the same run (`teacher / logprobs`), and the planner's figure for
that ratio (T / P; with two teachers, the largest T).

Simplifications, stated: no engine (generation is left out, so the share is of the learner's phases only; a real
step's generation makes it smaller), CPU fp32 on shared cores (the load average is printed), tiny models where
fixed per-call costs weigh more than on a GPU.

Run: .venv/bin/python benchmarks/distill_teacher_share.py [--groups 8 --n 4 --response 48 --repeats 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from relayrl.algorithms.stage import advantage_stage
from relayrl.algorithms.teacher_routes import TeacherRoutes
from relayrl.config import load_config
from relayrl.learner.batching import make_experience
from relayrl.learner.role import LearnerRole
from relayrl.models.shape import load_shape
from relayrl.models.tiny import build_tiny, build_tiny_model
from relayrl.placement.sections import learner_settings
from relayrl.types import Prompt, Rollout, Score

LARGE = {"hidden": 256, "layers": 4, "heads": 4, "intermediate": 1024}
VOCAB = 40  # the student's char tokenizer's size: the batch's token ids stay below it
DISTILL = ["algorithm.advantage=distill", "rollout.n=4", "train.lr=1e-5"]  # the step both benchmarks time


def build_models(root: Path) -> tuple[Path, Path]:
    """The student (with its char tokenizer) and a larger teacher with that tokenizer."""
    student = root / "student"
    _, tokenizer = build_tiny(["0123456789+-=abcdefghijklmnopqrstuvwxyz "], student, seed=0)
    large = root / "large"
    build_tiny_model(vocab_size=len(tokenizer), seed=3, **LARGE).save_pretrained(large)
    tokenizer.save_pretrained(large)
    return student, large


def batch(groups: int, n: int, response: int, vocab: int) -> list[Rollout]:
    """`groups` prompts of 16 tokens, `n` responses each, the rows' `task` alternating `a` / `b`."""
    gen = torch.Generator().manual_seed(0)
    rollouts = []
    for g in range(groups):
        ids = torch.randint(4, vocab, (16,), generator=gen).tolist()
        prompt = Prompt(f"p{g}", "", ids, {"task": "ab"[g % 2]})
        for i in range(n):
            out = torch.randint(4, vocab, (response,), generator=gen).tolist()
            rollouts.append(Rollout(prompt, i, out, "", [-1.0] * response, "stop", [0] * response))
    return rollouts


def learner_step_times(learner: LearnerRole, score, stage, rollouts: list[Rollout], repeats: int, routes=None):
    """(best-of-`repeats` seconds of each learner phase of one distillation step after a warm-up, the last pass's
    experience): `prepare` (logprobs), `score` (teacher), the advantage `stage`, `update`. `routes`: the
    TeacherRoutes that split the rows between teachers (None: one teacher). teacher_engines.py times its engines
    with it too."""
    best: dict[str, float] = {}
    for _ in range(repeats + 1):
        times, exp = {}, make_experience(rollouts, [Score(1.0)] * len(rollouts), pad_id=0)
        if routes is not None:
            exp.teacher_routes = routes.rows(rollouts)
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
    return best, exp


def measure(overrides: list[str], rollouts: list[Rollout], repeats: int) -> dict[str, float]:
    """Best-of-`repeats` seconds of each learner phase of one distillation step (after a warm-up)."""
    config = load_config(None, [*DISTILL, *overrides])
    role, stage = LearnerRole(learner_settings(config)), advantage_stage(config.algorithm, teacher=True)
    routes = TeacherRoutes.of(config.teacher)
    assert routes is not None
    return learner_step_times(role, role.score_teacher, stage, rollouts, repeats, routes)[0]


def batch_arguments(description: str) -> argparse.Namespace:
    """The batch's size and the repeats, the arguments both teacher benchmarks take."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--response", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args()


@contextmanager
def models_and_batch(args: argparse.Namespace) -> Iterator[tuple[Path, Path, list[Rollout]]]:
    """(the student, the larger teacher, the synthetic batch), the models in a scratch directory while in use."""
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as scratch:
        student, large = build_models(Path(scratch))
        yield student, large, batch(args.groups, args.n, args.response, VOCAB)


def main() -> None:
    args = batch_arguments(__doc__.split("\n")[0])
    with models_and_batch(args) as (student, large, rollouts):
        p, t_large = load_shape(str(student)).params, load_shape(str(large)).params
        two = f"teacher.teachers=[{{route: a, path: {student}}}, {{route: b, path: {student}}}]"
        cases = {
            "same size (T=P)": ([f"teacher.path={student}"], 1.0),
            "larger teacher": ([f"teacher.path={large}"], t_large / p),
            "two routed (T=P each)": (["teacher.route_by=task", two], 1.0),
        }
        print(f"student P={p:,}, larger teacher T={t_large:,}; {len(rollouts)} rows; load {os.getloadavg()[0]:.2f}")
        print(
            f"{'case':24} {'logprobs':>9} {'teacher':>9} {'advantage':>9} {'update':>9} {'share':>7} "
            f"{'T/logp':>7} {'plan T/P':>8}"
        )
        for name, (overrides, planned) in cases.items():
            t = measure([f"model.path={student}", *overrides], rollouts, args.repeats)
            share = t["teacher"] / sum(t.values())
            print(
                f"{name:24} {t['logprobs']:9.4f} {t['teacher']:9.4f} {t['advantage']:9.4f} {t['update']:9.4f} "
                f"{share:7.1%} {t['teacher'] / t['logprobs']:7.2f} {planned:8.2f}"
            )


if __name__ == "__main__":
    main()
