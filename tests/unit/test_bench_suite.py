"""The benchmark suite's pure parts: the regime-b reward, the target verdicts and the final table, peer_trl's
arguments, seed pooling and evaluation commands (no model runs)."""

import argparse
import importlib.util
import os
import statistics
import sys
from pathlib import Path

import pytest

from relayrl.rewards import load_reward

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    """A benchmarks/ module by path, without leaving benchmarks/ on sys.path (peer_trl imports its siblings
    peer_sides and peer_regimes from there) or peer_sides' environment defaults for the rest of the session."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    path, environ = list(sys.path), dict(os.environ)
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path
        os.environ.clear()
        os.environ.update(environ)
    return module


suite = _load("suite")
peer_trl = _load("peer_trl")
digit_fraction = _load("rewards").digit_fraction


def test_digit_fraction_counts_digit_characters():
    assert digit_fraction(["1+1="], ["12", "1+2=", "", "ab", "9 9"], answer=["2"] * 5) == [
        1.0,
        0.5,
        0.0,
        0.0,
        pytest.approx(2 / 3),
    ]


def test_digit_fraction_loads_as_a_relayrl_reward_file():
    fn = load_reward(f"{BENCH / 'rewards.py'}:digit_fraction")
    assert fn(["1+1="], ["2+"], answer=["2"]) == [0.5]


@pytest.mark.parametrize(
    "value, op, bound, expected",
    [
        (0.5, "<=", 0.67, "yes"),
        (0.67, "<=", 0.67, "yes"),
        (0.9, "<=", 0.67, "no"),
        (0.4, ">=", 0.35, "yes"),
        (0.2, ">=", 0.35, "no"),
        (None, "<=", 1.0, "n/a"),
    ],
)
def test_verdict(value, op, bound, expected):
    assert suite.verdict(value, op, bound) == expected


def test_verdict_rejects_an_unknown_comparison():
    with pytest.raises(ValueError):
        suite.verdict(1.0, "<", 2.0)


def _peer(ratio, ours_after, theirs_after, seeds=1, spread=0.0):
    def row(step, after):
        return {
            "median_step_s": step,
            "greedy_after": after,
            "greedy_before": 0.1,
            "seeds": seeds,
            "greedy_after_min": after - spread,
            "greedy_after_max": after + spread,
        }

    return {
        "seeds": seeds,
        "step_time_ratio_relayrl_over_trl": ratio,
        "rows": {"relayrl": row(ratio, ours_after), "TRL": row(1.0, theirs_after)},
    }


def test_checks_from_results():
    results = {
        "peer_a": _peer(0.85, 0.60, 0.55, seeds=3, spread=0.05),
        "peer_a_hf": _peer(0.49, 0.6, 0.6),
        "peer_b": _peer(0.30, 0.40, 0.45),
        "peer_c": _peer(0.64, 0.73, 0.75, seeds=3),
        "rollout": {"ratio": 1.05, "medians_s": {"relayrl": 0.105, "bare": 0.1}},
        "phases": {"mfu": 0.2, "overhead_frac": 0.03},
        "peer_b_phases": {"mfu": 0.5, "overhead_frac": 0.08},
    }
    rows = {row.metric: row for row in suite.checks(results)}
    met = {metric: row.met for metric, row in rows.items()}
    assert met == {
        "regime (a) median step, relayrl (vllm engine)/TRL": "no",
        "regime (a) median step, relayrl (hf engine)/TRL": "yes",
        "regime (b) median step, relayrl (vllm engine)/TRL": "yes",
        "regime (a) held-out exact match, seed mean, relayrl (vllm engine) vs TRL": "yes",
        "regime (b) held-out digit fraction, seed mean, relayrl (vllm engine) vs TRL": "no",
        "regime (c) median step, relayrl (auto engine)/TRL": "yes",
        "regime (c) held-out exact match, seed mean, relayrl (auto engine) vs TRL": "no",
        "rollout, relayrl/bare vLLM generate (demo)": "yes",
        "update MFU (demo, phases.py)": "no",
        "update MFU (regime b, relayrl)": "yes",
        "controller overhead, share of step (demo)": "yes",
        "controller overhead, share of step (regime b)": "no",
    }
    assert rows["regime (a) median step, relayrl (vllm engine)/TRL"].measured == "0.85x (0.850s vs 1.000s, 3 seeds)"
    assert rows["regime (a) median step, relayrl (hf engine)/TRL"].measured.startswith("0.49x")
    assert (
        rows["regime (a) held-out exact match, seed mean, relayrl (vllm engine) vs TRL"].measured
        == "0.600 [0.550-0.650] vs 0.550 [0.500-0.600], 3 seeds (initial 0.100)"
    )
    assert (
        rows["regime (b) held-out digit fraction, seed mean, relayrl (vllm engine) vs TRL"].measured
        == "0.400 vs 0.450, 1 seed (initial 0.100)"
    )
    assert rows["update MFU (demo, phases.py)"].measured == "20%"


def test_missing_or_failed_benchmarks_read_n_a():
    rows = suite.checks({"peer_a": _peer(0.5, 0.6, 0.6)})
    assert [row.met for row in rows][:5] == ["yes", "n/a", "n/a", "yes", "n/a"]
    assert all(row.met == "n/a" and row.measured == "n/a" for row in rows[4:])


def test_table_has_one_line_per_check_and_aligned_columns():
    rows = suite.checks({"rollout": {"ratio": 1.2, "medians_s": {"relayrl": 0.12, "bare": 0.1}}})
    lines = suite.format_table(rows).splitlines()
    assert lines[0].split(" | ")[0].strip() == "metric" and lines[0].rstrip().endswith("met?")
    assert len(lines) == 2 + len(rows)
    assert len({line.index("|") for line in lines if "|" in line}) == 1
    rollout = next(i for i, row in enumerate(rows) if row.metric.startswith("rollout"))
    assert "1.200x" in lines[2 + rollout] and lines[2 + rollout].rstrip().endswith("no")


def test_benchmark_argv_threads_regime_a_model_and_quick_sizes():
    assert suite.benchmark_argv("peer_b", True, "runs/x", None) == (
        "peer_trl",
        ["--regime", "b", "--seeds", "1", "--dir", "runs/x", "--quick"],
    )
    assert suite.benchmark_argv("peer_a", False, "runs/x", None) == (
        "peer_trl",
        ["--regime", "a", "--seeds", str(suite.SEEDS["peer_a"]), "--dir", "runs/x"],
    )
    assert suite.benchmark_argv("peer_a", True, "runs/x", None)[1][3] == "1"  # --quick: one seed everywhere
    assert suite.benchmark_argv("peer_a_hf", False, "runs/x", "m") == (
        "peer_trl",
        [
            "--regime",
            "a",
            "--engine",
            "hf",
            "--seeds",
            str(suite.SEEDS["peer_a_hf"]),
            "--dir",
            "runs/x",
            "--warmstart",
            "m",
        ],
    )
    assert suite.benchmark_argv("peer_c", False, "runs/x", "m")[1][:3] == ["--regime", "c", "--interleave"]
    module, argv = suite.benchmark_argv("phases", True, "runs/x", "m")
    assert module == "phases" and argv[:2] == ["--warmstart", "m"] and argv[-1] == str(suite.QUICK_PHASE_STEPS)
    module, argv = suite.benchmark_argv("rollout", False, "runs/x", None)
    assert argv == ["--repeats", str(suite.ROLLOUT_REPEATS)]


def test_suite_runs_peer_a_with_several_seeds_and_the_hf_engine():
    assert suite.SEEDS["peer_a"] >= 3 and suite.SEEDS["peer_b"] == 1
    assert suite.BENCHMARKS.index("peer_a") < suite.BENCHMARKS.index("peer_a_hf")  # peer_a's model is reused


# ---------------------------------------------------------------------------- peer_trl (pure parts)


def test_peer_trl_keeps_what_other_benchmarks_import():
    for name in ("build_config", "cpu_busy", "cpu_sample", "others_share", "prepare_inputs", "run_logged"):
        assert callable(getattr(peer_trl, name))


def test_peer_files_stay_small():
    for name in ("peer_trl", "peer_sides", "peer_regimes"):
        assert len((BENCH / f"{name}.py").read_text().splitlines()) <= 400, name


def test_peer_trl_arguments():
    args = peer_trl.parse_args(["--dir", "runs/x"])
    assert (args.seeds, args.engine, args.steps, args.min_tokens) == (1, "vllm", 20, 0)
    assert args.out == str(Path("runs/x/peer_trl.json"))
    args = peer_trl.parse_args(["--regime", "b", "--engine", "hf", "--seeds", "2", "--quick", "--dir", "runs/x"])
    assert (args.seeds, args.engine, args.steps, args.min_tokens) == (2, "hf", 2, 128)
    assert args.out == str(Path("runs/x/peer_trl_b_hf_quick.json"))
    with pytest.raises(SystemExit):
        peer_trl.parse_args(["--seeds", "0"])


def test_work_dirs_keep_engines_apart_and_regime_b_model_shared():
    regimes = sys.modules["peer_regimes"]
    a, a_hf = peer_trl.parse_args(["--dir", "w"]), peer_trl.parse_args(["--dir", "w", "--engine", "hf"])
    b_hf = peer_trl.parse_args(["--dir", "w", "--regime", "b", "--engine", "hf"])
    assert regimes.work_dir(a) == Path("w") and regimes.work_dir(a_hf) == Path("w/engine_hf")
    assert regimes.work_dir(b_hf) == Path("w/regime_b/engine_hf") and regimes.regime_dir(b_hf) == Path("w/regime_b")
    # phases.py and schedules.py hand build_config namespaces without regime/engine: regime a, vLLM
    assert regimes.work_dir(argparse.Namespace(dir="w")) == Path("w")


def test_config_overrides_carry_seed_engine_and_length_floor():
    regimes = sys.modules["peer_regimes"]
    args = peer_trl.parse_args(["--regime", "b", "--engine", "hf"])
    overrides = regimes.config_overrides(args, seed=2)
    assert {"train.seed=2", "rollout.engine=hf", "rollout.min_tokens=128", "train.micro_batch=32"} <= set(overrides)
    plain = regimes.config_overrides(peer_trl.parse_args([]), seed=0)
    assert not any(o.startswith(("train.seed", "rollout.engine", "rollout.min_tokens")) for o in plain)


def test_eval_command_is_relayrl_eval_with_the_regime_lengths():
    sides = sys.modules["peer_sides"]
    b = sides.eval_command(Path("m"), peer_trl.parse_args(["--regime", "b"]), Path("e.jsonl"), 1.0)
    assert b[1:6] == ["-m", "relayrl.cli", "eval", "m", "e.jsonl"]
    keys = dict(word.split("=", 1) for word in b[6:])
    assert keys == {
        "reward.fn": sys.modules["peer_regimes"].REGIMES["b"].reward,
        "rollout.engine": "vllm",
        "rollout.max_tokens": "128",
        "eval.temperature": "1",
        "rollout.min_tokens": "128",
        "eval.max_prompts": "64",
    }
    a = sides.eval_command(Path("m"), peer_trl.parse_args([]), Path("e.jsonl"), 0.0)
    assert not any(word.startswith(("rollout.min_tokens", "eval.max_prompts", "eval.temperature")) for word in a)


def _run(times, after, sampled=None, generate=None):
    return {
        "per_step": {
            "time_s": times,
            "completion_tokens": [64.0] * len(times),
            "train_reward": [0.5] * len(times),
            "generate_s": generate or [t / 2 for t in times],
        },
        "median_step_s": statistics.median(times),
        "wall_s": 10.0,
        "greedy_after": after,
        "sampled_after": sampled,
        "run_dir": f"r{after}",
    }


def test_combine_seeds_pools_every_step_and_spreads_held_out():
    runs = [_run([1.0, 2.0, 9.0], 0.874), _run([3.0, 4.0, 5.0], 0.742), _run([0.5, 6.0, 7.0], 0.832)]
    row = peer_trl.combine_seeds(runs, batch=16)
    assert row["median_step_s"] == 4.0  # all nine steps, none dropped
    assert row["min_step_s"] == 0.5 and row["steps"] == 9 and row["median_step_s_per_seed"] == [2.0, 4.0, 6.0]
    assert row["generate_median_s"] == 2.0 and row["completion_length_mean"] == 4.0
    assert row["greedy_after"] == pytest.approx((0.874 + 0.742 + 0.832) / 3)
    assert (row["greedy_after_min"], row["greedy_after_max"]) == (0.742, 0.874)
    assert row["sampled_after"] is None and row["seeds"] == 3 and row["wall_s"] == 30.0
    assert row["run_dir"] == "r0.874" and len(row["run_dirs"]) == 3 and row["per_seed"] is runs


def test_step_ratios_and_table_name_the_engine_and_each_seed():
    rows = {
        "relayrl": peer_trl.combine_seeds([_run([1.0], 0.8), _run([3.0], 0.6)], 16),
        "TRL": peer_trl.combine_seeds([_run([2.0], 0.7), _run([4.0], 0.9)], 16),
    }
    for row in rows.values():
        row.update(greedy_before=0.5)
    ratio, per_seed = peer_trl.step_ratios(rows)
    assert ratio == pytest.approx(2.0 / 3.0) and per_seed == [0.5, 0.75]
    text = peer_trl.table(rows, ratio, "held", engine="hf")
    assert "relayrl (hf engine)" in text and "0.700 [0.600-0.800]" in text
    assert "seed 1: relayrl (hf engine) 3.000 s/step, held-out 0.600; TRL 4.000 s/step, held-out 0.900" in text
    assert "step time relayrl (hf engine)/TRL: 0.67x (median over all 2 steps of 2 seeds)" in text
