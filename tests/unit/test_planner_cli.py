"""`relayrl plan` as a user meets it: the printed memory lines and learner-rank table, shape flags without a model,
one error naming a bad length or unknown key, the old flags' deprecation line, and the advice (the HF engine for a
tiny model on CPU, a placement the overrides express, a busy machine's measurement). The estimates themselves:
test_planner_memory.py and test_planner_time.py."""

import pytest

from relayrl.cli import main
from relayrl.planner import PROFILES, ModelShape, load_shape, make_plan
from tests.unit.planner_helpers import ROOT, SEVEN_B_KEYS, planned


def test_cli_plan_prints_the_memory_lines(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the example's model.path is relative to the repository root
    assert main(["plan", "examples/grpo_7b/config.yaml", "plan.hardware=H100-80GB"]) == 0
    out = capsys.readouterr().out
    for line in (
        "actor",
        "reference",
        "KV bytes/token",
        "57,344 B",
        "colocated peak",
        "disaggregated",
        "recommendation",
    ):
        assert line in out


def test_cli_plan_with_shape_flags_and_no_model(capsys, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("rollout: {n: 4, prompts_per_step: 2, max_tokens: 8}\n")
    assert main(["plan", str(config), "plan.hardware=A100-80GB", *SEVEN_B_KEYS]) == 0
    assert "112.00 GB" in capsys.readouterr().out
    assert main(["plan", str(config)]) == 2  # no model.path and no flags: one line naming model.path
    assert "model.path" in capsys.readouterr().err


@pytest.mark.parametrize(
    "lengths, message",
    [
        (["plan.response_tokens=-3"], "plan.response_tokens=-3: a number of tokens, more than 0"),
        (["plan.mean_response_tokens=0"], "plan.mean_response_tokens=0: a number of tokens, more than 0"),
        (
            ["plan.mean_response_tokens=9"],
            "plan.mean_response_tokens=9 is over the longest response (rollout.max_tokens=8)",
        ),
        (
            ["plan.response_tokens=4", "plan.mean_response_tokens=5"],
            "plan.mean_response_tokens=5 is over the longest response (plan.response_tokens=4)",
        ),
    ],
)
def test_cli_plan_refuses_impossible_lengths_naming_the_key(capsys, tmp_path, lengths, message):
    config = tmp_path / "c.yaml"
    config.write_text("rollout: {n: 4, prompts_per_step: 2, max_tokens: 8}\n")
    assert main(["plan", str(config), *SEVEN_B_KEYS, *lengths]) == 2
    assert message in capsys.readouterr().err


def test_plan_advises_the_hf_engine_for_a_tiny_model_on_cpu_only():
    from relayrl.planner.report import engine_advice

    tiny = ModelShape(params=600_000, layers=3, hidden=128, kv_heads=4, head_dim=32, vocab=16)
    config = planned(None, ["rollout.n=8", "rollout.prompts_per_step=32", "rollout.max_tokens=6"])
    assert "rollout.engine=hf is faster here" in engine_advice(make_plan(config, tiny, PROFILES["cpu"]))
    assert engine_advice(make_plan(config, tiny, PROFILES["H100-80GB"])) is None
    hf = planned(None, ["rollout.engine=hf"])
    assert engine_advice(make_plan(hf, tiny, PROFILES["cpu"])) is None
    big = ModelShape(params=27e6, layers=8, hidden=512, kv_heads=8, head_dim=64, vocab=16)
    assert engine_advice(make_plan(config, big, PROFILES["cpu"])) is None


def test_cli_plan_prints_the_smallest_learner_ranks_per_profile(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    whole = "learner.activation_checkpointing=false"  # every layer's activations kept (auto checkpoints on a GPU)
    assert main(["plan", "examples/grpo_7b/config.yaml", whole, "plan.hardware=H100-80GB", "plan.learner_ranks=1"]) == 0
    out = capsys.readouterr().out
    assert "smallest W that fits" in out
    rows = {line.split("│")[1].strip(): line.split("│")[3].strip() for line in out.splitlines() if "least W" in line}
    assert rows["H100-80GB"].startswith("W=4 (") and rows["A100-80GB"].startswith("W=4 (")
    assert rows["H200"].startswith("W=2 (")
    assert rows["cpu"].startswith("none")  # fp32 activations of one micro-batch alone exceed 24 GB
    small = ["algorithm.kl.coef=0", "train.micro_batch=1"]  # 122 GB of states + 5 GB: one H200 holds it
    assert main(["plan", "examples/grpo_7b/config.yaml", *small, "plan.hardware=H200", "plan.learner_ranks=2"]) == 0
    out = capsys.readouterr().out
    assert "gather per sync" in out and "smallest W" not in out


def test_the_recommendation_is_a_placement_the_code_expresses_with_its_overrides():
    """7B on H100s: colocated time-sharing (rollout.sleep auto on a GPU) fits 4 colocated pairs; with the engine
    awake while training it does not, and the advice is disaggregated. Either set of overrides loads."""
    from relayrl.planner import get_profile, make_plan

    example = "examples/grpo_7b/config.yaml"
    kept = ["learner.activation_checkpointing=false"]  # awake, a checkpointed update fits beside it on 8 pairs
    config = planned(example, kept)
    hardware = get_profile("H100-80GB")
    shared = make_plan(config, load_shape(config.model.path), hardware, read_prompts=False)
    assert shared.sleep and shared.advice.overrides == (
        "placement.mode=ray", "placement.layout=colocated", "placement.learner_ranks=4", "placement.engines=4"
    )  # fmt: skip
    awake = planned(example, [*kept, "rollout.sleep=off"])
    apart = make_plan(awake, load_shape(awake.model.path), hardware, read_prompts=False).advice
    assert apart.text.startswith("disaggregated") and "placement.layout=disaggregated" in apart.overrides
    for overrides in (shared.advice.overrides, apart.overrides):
        placed = planned(example, [*kept, *overrides]).placement
        assert placed.mode == "ray" and placed.learner_ranks in (4, 5, 8)


def test_a_measurement_on_a_busy_machine_is_said_in_the_plan(monkeypatch, capsys):
    import relayrl.planner as planner
    from relayrl.planner import get_profile, make_plan
    from relayrl.planner.report import print_plan

    config = planned("examples/grpo_7b/config.yaml")
    cpu = get_profile("cpu")
    monkeypatch.setattr(planner, "_measured_rates", lambda *args: planner.profile_rates(cpu))
    monkeypatch.setattr(planner.os, "getloadavg", lambda: (64.0, 1.0, 1.0))
    plan = make_plan(config, load_shape(config.model.path), cpu, read_prompts=False, measure=True)
    assert plan.busy.startswith("measured at load average 64.0 on ")
    print_plan(plan)
    assert "note: measured at load average 64.0" in " ".join(capsys.readouterr().out.split())
    monkeypatch.setattr(planner.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    assert make_plan(config, load_shape(config.model.path), cpu, read_prompts=False, measure=True).busy == ""


def test_cli_plan_old_flags_still_work_with_one_deprecation_line(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = ["plan", "examples/grpo_7b/config.yaml", "--hardware", "H100-80GB", "--learner-ranks", "1", "--no-master"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "smallest W that fits" in captured.out
    lines = [line for line in captured.err.splitlines() if "deprecated" in line]
    assert len(lines) == 1, captured.err
    for key in ("plan.hardware=H100-80GB", "plan.learner_ranks=1", "plan.fp32_master=false"):
        assert key in lines[0]


@pytest.mark.parametrize(
    "override, named",
    [
        ("plan.hardwre=H200", "'plan.hardwre' (in the overrides); did you mean 'plan.hardware'"),
        ("rollout.nn=4", "'rollout.nn'"),
    ],
)
def test_cli_plan_an_unknown_key_is_one_error_naming_it(capsys, override, named):
    assert main(["plan", str(ROOT / "examples/grpo_7b/config.yaml"), override]) == 2
    err = capsys.readouterr().err
    assert named in err and err.count("\n") == 1


def test_cli_plan_without_a_config_plans_the_defaults_and_the_keys(capsys, random_model_dir):
    assert main(["plan", f"model.path={random_model_dir}", "plan.hardware=cpu", "rollout.n=4"]) == 0
    out, err = capsys.readouterr()
    assert "actor" in out and "deprecated" not in err
