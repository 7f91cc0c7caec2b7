"""`learner.activation_checkpointing: auto` (relayrl/planner/checkpointing.py): chosen once when the config is
resolved, on for a colocated GPU run whose planned update does not fit beside the engine without it, off for a
small one, for disaggregated engines and on CPU; the choice and its reason in the dump; the plan and
`plan.simulate` use what auto chooses on the plan's GPU; a learner never reads an unresolved auto on a GPU."""

from __future__ import annotations

import functools

import pytest

from relayrl.build import resolve
from relayrl.config import dump_config, load_config
from relayrl.errors import ConfigError
from relayrl.planner import PROFILES, load_shape, make_plan
from relayrl.planner.checkpointing import DISAGGREGATED, KEY, choose_checkpointing
from relayrl.planner.estimate import workload_from_config

SEVEN_B = "examples/grpo_7b/config.yaml"  # Qwen2.5-7B's shape, KL on, gpu_memory_utilization 0.5, micro_batch 4
COLOCATED_8 = ["placement.mode=ray", "placement.layout=colocated", "placement.learner_ranks=8", "placement.engines=8"]
DISAGGREGATED_4 = [
    "placement.mode=ray",
    "placement.layout=disaggregated",
    "placement.learner_ranks=4",
    "placement.engines=4",
]


def h100():
    return PROFILES["H100-80GB"]


def resolved_on_h100(monkeypatch, path, overrides):
    """The config resolved as on a machine whose GPU is an H100 (this one has none)."""
    from relayrl.planner import checkpointing

    monkeypatch.setattr(checkpointing, "this_gpu", h100)
    return resolve(load_config(path, overrides))


def test_a_7b_step_colocated_on_8_h100s_gets_checkpointing_and_the_dump_says_why(monkeypatch):
    """micro_batch 4 x 1280 positions: the update without checkpointing (56 GB per rank: 1/8 of the states, the
    activations of the whole decoder) is over the 40 GB the engine's 0.5 leaves; one row a micro-batch fits."""
    config = resolved_on_h100(monkeypatch, SEVEN_B, COLOCATED_8)
    assert config.learner.activation_checkpointing is True
    chosen, why = config._auto[KEY]
    assert chosen is True and "over the 40.0 GB" in why and "gpu_memory_utilization=0.5" in why
    assert "56.3 GB per GPU" in why
    line = next(line for line in dump_config(config).splitlines() if "activation_checkpointing" in line)
    assert line.strip().startswith("activation_checkpointing: auto") and "auto chose True" in line and "over" in line
    small = resolved_on_h100(monkeypatch, SEVEN_B, [*COLOCATED_8, "train.micro_batch=1"])
    assert small.learner.activation_checkpointing is False and "within the 40.0 GB" in small._auto[KEY][1]


def test_a_small_model_colocated_on_a_gpu_keeps_it_off(monkeypatch, random_model_dir):
    config = resolved_on_h100(monkeypatch, None, [f"model.path={random_model_dir}"])  # placement.mode=local
    assert config.learner.activation_checkpointing is False and "within" in config._auto[KEY][1]


def test_disaggregated_engines_and_cpu_keep_it_off(monkeypatch):
    assert resolve(load_config(SEVEN_B, COLOCATED_8)).learner.activation_checkpointing is False  # this machine
    config = resolve(load_config(SEVEN_B, COLOCATED_8))
    work = functools.partial(workload_from_config, config, checkpointing=False)
    assert choose_checkpointing(config.model.path, work, True, lambda: None) == (
        False,
        "no GPU here: the learner's memory is the host's",
    )
    assert resolved_on_h100(monkeypatch, SEVEN_B, DISAGGREGATED_4)._auto[KEY] == (False, DISAGGREGATED)


def test_disaggregated_engines_decide_it_without_asking_the_gpu_or_sizing_the_update():
    """The learner has its GPUs to itself whatever their memory: neither this machine's GPU (torch's
    get_device_properties) nor the workload nor the model's shape is asked."""
    asked = []

    def gpu():
        asked.append("gpu")
        return h100()

    def work():
        asked.append("work")
        raise AssertionError("the workload is not needed")

    assert choose_checkpointing("no/model/here", work, False, gpu) == (False, DISAGGREGATED)
    assert asked == []


def test_a_value_set_is_kept_and_not_noted(monkeypatch):
    for value in (True, False):
        config = resolved_on_h100(monkeypatch, SEVEN_B, [*COLOCATED_8, f"learner.activation_checkpointing={value}"])
        assert config.learner.activation_checkpointing is value and KEY not in config._auto


def test_a_config_the_planner_cannot_size_keeps_it_off_saying_why(tmp_path):
    config = resolve(load_config(None, [f"model.path={tmp_path}"]))  # no config.json there
    work = functools.partial(workload_from_config, config, checkpointing=False)
    on, why = choose_checkpointing(config.model.path, work, True, h100)
    assert not on and why.startswith("the planner could not size the update") and "config.json" in why


def test_the_plan_uses_what_auto_chooses_on_its_hardware():
    """This CPU machine resolved auto to off; the plan for 8 H100s uses what a run there chooses (on), and its
    activations are the checkpointed ones; learner.activation_checkpointing=false plans them whole."""
    config = resolve(load_config(SEVEN_B, COLOCATED_8))
    shape = load_shape(config.model.path)

    def plan(config, hardware):
        return make_plan(config, shape, hardware, learner_ranks=8, read_prompts=False)

    on, cpu = plan(config, h100()), plan(config, PROFILES["cpu"])
    off = plan(resolve(load_config(SEVEN_B, [*COLOCATED_8, "learner.activation_checkpointing=false"])), h100())
    assert on.workload.checkpointing and not cpu.workload.checkpointing and not off.workload.checkpointing
    assert on.memory.activations < off.memory.activations / 5


def test_a_gpu_learner_refuses_an_unresolved_auto():
    from relayrl.learner.activation_checkpointing import checkpointing_on

    learner = load_config(None, []).learner
    assert learner.activation_checkpointing == "auto"  # the default
    assert checkpointing_on(learner, "cpu") is False
    with pytest.raises(ConfigError, match="learner.activation_checkpointing is still auto where the cuda learner"):
        checkpointing_on(learner, "cuda")
    assert checkpointing_on(load_config(None, ["learner.activation_checkpointing=true"]).learner, "cuda") is True


def test_a_bad_value_names_the_key():
    with pytest.raises(ConfigError, match="learner.activation_checkpointing"):
        load_config(None, ["learner.activation_checkpointing=sometimes"])
