"""A learner rank killed mid-run (SIGKILL of its Ray worker, `placement.learner_ranks=2`): the run replaces the
whole learner group, restores it from the newest checkpoint, pushes that version to the engine, redoes the steps
after it and learns as an undisturbed run does (the in-process cases, a hang and the settings that stop it are
tests/unit/test_learner_restarts.py)."""

import json
import re

import pytest

from benchmarks.learning_cases import CASES, gain
from tests.e2e.test_ray_placement import rows, run_and_kill

pytestmark = pytest.mark.slow


def test_a_killed_learner_rank_is_restarted_from_the_checkpoint_and_the_run_learns(tmp_path, warm_model_dir, toy_task):
    case = CASES["ray_shm"]  # the same run but for the ranks: W=2 updates equal W=1's (tests/e2e/test_learner_ranks.py)
    settings = [*case.overrides, "placement.learner_ranks=2", "checkpoint.every=3", "log.save_model=false"]
    # after 4 rows, step_000002 is written; either rank will do: the group goes as a whole
    run_dir, code, stderr, _ = run_and_kill(
        tmp_path, warm_model_dir, toy_task, *settings, actor="ray::LearnerRank", actors=2, after_rows=4
    )
    assert code == 0, stderr[-3000:]
    assert re.search(r"restarting the learner from \S+/checkpoints/step_00000[25] \(restart 1 of 2\)", stderr), stderr[
        -3000:
    ]
    logged = rows(run_dir)
    assert [r["step"] for r in logged] == list(range(12))  # steps 3.. were redone and logged once
    assert logged[-1]["placement/learner_restarts"] == 1
    assert [r["sync/version"] for r in logged] == list(range(1, 13))  # the engine went back to version 3 and on
    assert max(r["mismatch/logprob_abs_max"] for r in logged) < 1e-3  # no step sampled with another policy
    scores = json.loads((run_dir / "eval.json").read_text())
    assert gain(scores) >= case.min_gain, (scores, case.spread)
