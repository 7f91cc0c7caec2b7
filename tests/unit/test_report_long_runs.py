"""`relayrl report` on runs of realistic length and shape: the demo's 50 steps, each schedule's timeline rows,
and the edge cases of a run that is just starting or was killed (empty, one row, a truncated last line)."""

import json
import re
from pathlib import Path

import pytest

from relayrl.errors import DataError
from relayrl.metrics.report import write_report

PHASE_SECONDS = {"generate": 0.12, "reward": 0.01, "logprobs": 0.03, "advantage": 0.002, "update": 0.07, "sync": 0.01}
# the role each loop phase is recorded under (relayrl/metrics/timeline.py ROLE_OF_PHASE; advantage -> driver)
ROLE = {
    "generate": "engines",
    "reward": "reward",
    "logprobs": "learner",
    "advantage": "driver",
    "update": "learner",
    "sync": "sync",
    "wait": "learner",
}


def _metrics_row(step: int, schedule: str | None = "sync") -> dict:
    phases = {**PHASE_SECONDS, **({"wait": 0.02} if schedule == "async" else {})}  # the async learner's idle time
    return {
        "step": step,
        "reward/mean": 0.3 + 0.01 * step,
        "reward/std": 0.2,
        **{f"time/{phase}": seconds for phase, seconds in phases.items()},
        "time/step": sum(phases.values()) + 0.01,
        "stale/mean": 0.0,
        "stale/max": 0.0,
        "mismatch/logprob_abs_mean": 1e-6,
        "mismatch/logprob_abs_max": 1e-5,
        "response/length_mean": 4.0,
        "response/length_max": 6.0,
    }


def _timeline(schedule: str, steps: int, engines: int = 2) -> list[dict]:
    """Rows shaped like each schedule's: the loop's phases, plus per-replica spans ("engine k") that overlap
    the learner under one_step_off and async, and the learner's "wait" phase under async."""
    rows, clock = [], 1_700_000_000.0
    phases = list(PHASE_SECONDS)
    if schedule == "async":
        phases = ["wait"] + [p for p in phases if p != "generate"]
    for step in range(steps):
        start = clock
        for phase in phases:
            seconds = PHASE_SECONDS.get(phase, 0.005)
            rows.append({"step": step, "role": ROLE[phase], "phase": phase, "start": clock, "end": clock + seconds})
            clock += seconds
        if schedule != "sync":  # replicas generating the next batch while this step trains
            for replica in range(engines):
                rows.append(
                    {
                        "step": step,
                        "role": f"engine {replica}",
                        "phase": "generate",
                        "start": start + 0.01 * replica,
                        "end": clock - 0.02,
                    }
                )
    return rows


def _write_run(run: Path, steps: int, schedule: str | None = "sync") -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(_metrics_row(s, schedule)) + "\n" for s in range(steps)))
    if schedule:
        (run / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _timeline(schedule, steps)))
    return run


@pytest.mark.parametrize("schedule", ["sync", "one_step_off", "async"])
def test_report_of_a_50_step_run_draws_every_schedules_timeline(tmp_path, schedule):
    run = _write_run(tmp_path / schedule, steps=50, schedule=schedule)
    page = write_report(run).read_text()
    assert (run / "report" / "timeline.png").read_bytes().startswith(b"\x89PNG")
    assert 'alt="timeline"' in page and ">50 (last step 49)<" in page


def test_every_phase_a_run_logs_is_drawn_in_the_phase_chart(tmp_path):
    """time/swap (colocated time-sharing) and time/wait (the async learner idle) as well as the loop's phases:
    a phase without a colour crashed the report of every async run."""
    from relayrl.metrics.report import PHASES

    run = _write_run(tmp_path / "run", steps=3, schedule=None)
    rows = [{**_metrics_row(step), **{f"time/{phase}": 0.01 for phase in PHASES}} for step in range(3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_report(run)
    assert (run / "report" / "phase_times.png").read_bytes().startswith(b"\x89PNG")


def test_timeline_with_many_unknown_phases_does_not_run_out_of_colours(tmp_path):
    run = _write_run(tmp_path / "run", steps=3, schedule=None)
    rows = [
        {"step": 0, "role": "learner", "phase": f"custom {i}", "start": float(i), "end": i + 0.5} for i in range(40)
    ]
    (run / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_report(run)
    assert (run / "report" / "timeline.png").is_file()


def test_empty_metrics_of_a_run_that_has_not_finished_a_step_gives_a_page_with_a_note(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    page = write_report(run).read_text()
    assert "no steps logged yet" in page and "<img" not in page


def test_a_one_step_run_reports(tmp_path):
    run = _write_run(tmp_path / "run", steps=1)
    page = write_report(run).read_text()
    assert ">1 (last step 0)<" in page and len(re.findall("<img", page)) >= 4


def test_a_truncated_last_metrics_line_is_left_out_with_a_note(tmp_path):
    run = _write_run(tmp_path / "run", steps=5)
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(_metrics_row(5))[:40])  # the process was killed mid-write: no newline, half a row
    page = write_report(run).read_text()
    assert ">5 (last step 4)<" in page and "metrics.jsonl:6" in page and "left out" in page


def test_a_truncated_last_timeline_line_is_left_out(tmp_path):
    run = _write_run(tmp_path / "run", steps=5)
    with (run / "timeline.jsonl").open("a") as f:
        f.write('{"step": 5, "role": "lea')
    write_report(run)
    assert (run / "report" / "timeline.png").is_file()


def test_a_malformed_line_in_the_middle_is_still_an_error_naming_the_line(tmp_path):
    run = _write_run(tmp_path / "run", steps=5)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:30]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"metrics\.jsonl:2"):
        write_report(run)


def test_a_last_line_cut_inside_a_multibyte_character_is_left_out(tmp_path):
    run = _write_run(tmp_path / "run", steps=3, schedule=None)
    with (run / "metrics.jsonl").open("ab") as f:
        f.write('{"step": 3, "note": "é'.encode()[:-1])  # half of a two-byte UTF-8 character
    assert ">3 (last step 2)<" in write_report(run).read_text()


def test_a_multi_turn_run_draws_turns_per_trajectory_and_a_single_turn_run_has_no_turns_note(tmp_path):
    run = _write_run(tmp_path / "multi", steps=50, schedule=None)
    rows = [
        _metrics_row(s) | {"env/turns_mean": 2.5 - s / 50, "env/turns_max": 3.0, "env/success": s / 50}
        for s in range(50)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = write_report(run).read_text()
    assert 'alt="turns"' in page and (run / "report" / "turns.png").read_bytes().startswith(b"\x89PNG")
    single = write_report(_write_run(tmp_path / "single", steps=5, schedule=None)).read_text()
    assert "turns" not in single
