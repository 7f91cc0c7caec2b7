"""The benchmark suite's pure parts: the regime-b reward, the target verdicts and the final table (no model runs)."""

import importlib.util
import sys
from pathlib import Path

import pytest

from relayrl.rewards import load_reward

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    """A benchmarks/ module by path, without putting benchmarks/ on sys.path for the rest of the test session."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


suite = _load("suite")
digit_fraction = _load("rewards").digit_fraction


def test_digit_fraction_counts_digit_characters():
    assert digit_fraction(["1+1="], ["12", "1+2=", "", "ab", "9 9"], answer=["2"] * 5) == [1.0, 0.5, 0.0, 0.0,
                                                                                           pytest.approx(2 / 3)]


def test_digit_fraction_loads_as_a_relayrl_reward_file():
    fn = load_reward(f"{BENCH / 'rewards.py'}:digit_fraction")
    assert fn(["1+1="], ["2+"], answer=["2"]) == [0.5]


@pytest.mark.parametrize("value, op, bound, expected", [
    (0.5, "<=", 0.67, "yes"), (0.67, "<=", 0.67, "yes"), (0.9, "<=", 0.67, "no"),
    (0.4, ">=", 0.35, "yes"), (0.2, ">=", 0.35, "no"), (None, "<=", 1.0, "n/a"),
])
def test_verdict(value, op, bound, expected):
    assert suite.verdict(value, op, bound) == expected


def test_verdict_rejects_an_unknown_comparison():
    with pytest.raises(ValueError):
        suite.verdict(1.0, "<", 2.0)


def _peer(ratio, ours_after, theirs_after):
    return {"step_time_ratio_relayrl_over_trl": ratio,
            "rows": {"relayrl": {"median_step_s": ratio, "greedy_after": ours_after, "greedy_before": 0.1},
                     "TRL": {"median_step_s": 1.0, "greedy_after": theirs_after, "greedy_before": 0.1}}}


def test_checks_from_results():
    results = {"peer_a": _peer(0.85, 0.60, 0.55), "peer_b": _peer(0.30, 0.40, 0.45),
               "rollout": {"ratio": 1.05, "medians_s": {"relayrl": 0.105, "bare": 0.1}},
               "phases": {"mfu": 0.2, "overhead_frac": 0.03}, "peer_b_phases": {"mfu": 0.5, "overhead_frac": 0.08}}
    rows = {row.metric: row for row in suite.checks(results)}
    met = {metric: row.met for metric, row in rows.items()}
    assert met == {
        "regime (a) median step, relayrl/TRL": "no",
        "regime (b) median step, relayrl/TRL": "yes",
        "regime (a) held-out exact match, relayrl vs TRL": "yes",
        "regime (b) held-out digit fraction, relayrl vs TRL": "no",
        "rollout, relayrl/bare vLLM generate (demo)": "yes",
        "update MFU (demo, phases.py)": "no",
        "update MFU (regime b, relayrl)": "yes",
        "controller overhead, share of step (demo)": "yes",
        "controller overhead, share of step (regime b)": "no",
    }
    assert rows["regime (a) median step, relayrl/TRL"].measured.startswith("0.85x")
    assert rows["regime (a) held-out exact match, relayrl vs TRL"].measured.startswith("0.600 vs 0.550")
    assert rows["update MFU (demo, phases.py)"].measured == "20%"


def test_missing_or_failed_benchmarks_read_n_a():
    rows = suite.checks({"peer_a": _peer(0.5, 0.6, 0.6)})
    assert [row.met for row in rows][:3] == ["yes", "n/a", "yes"]
    assert all(row.met == "n/a" and row.measured == "n/a" for row in rows[3:])


def test_table_has_one_line_per_check_and_aligned_columns():
    rows = suite.checks({"rollout": {"ratio": 1.2, "medians_s": {"relayrl": 0.12, "bare": 0.1}}})
    lines = suite.format_table(rows).splitlines()
    assert lines[0].split(" | ")[0].strip() == "metric" and lines[0].rstrip().endswith("met?")
    assert len(lines) == 2 + len(rows)
    assert len({line.index("|") for line in lines if "|" in line}) == 1
    assert "1.200x" in lines[2 + 4] and lines[2 + 4].rstrip().endswith("no")


def test_benchmark_argv_threads_regime_a_model_and_quick_sizes():
    assert suite.benchmark_argv("peer_b", True, "runs/x", None) == ("peer_trl", ["--regime", "b", "--dir", "runs/x",
                                                                                 "--quick"])
    module, argv = suite.benchmark_argv("phases", True, "runs/x", "m")
    assert module == "phases" and argv[:2] == ["--warmstart", "m"] and argv[-1] == str(suite.QUICK_PHASE_STEPS)
    module, argv = suite.benchmark_argv("rollout", False, "runs/x", None)
    assert argv == ["--repeats", str(suite.ROLLOUT_REPEATS)]
