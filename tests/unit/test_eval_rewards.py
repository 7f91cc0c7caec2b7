"""`relayrl eval` and its reward: kwargs for the function, and failures that are counted, not hidden as zeros (a
skipped sample counts as 0, as training's evaluation counts it).

The model is the session's random tiny Llama through the HF engine (a second or two per run); the reward
functions are written per test and fail on the samples of a prompt named in their kwargs.
"""

from __future__ import annotations

import json

import pytest

from relayrl.cli import main

FAILING_REWARD = """
import time

def score(prompts, completions, fail_on="", hang_on="", **columns):
    if hang_on in prompts:
        time.sleep(3600)
    if fail_on == "*" or fail_on in prompts:
        raise ValueError("cannot score this one")
    return [1.0] * len(completions)
"""


def run_eval(capsys, model_dir, data, *extra):
    code = main(
        ["eval", str(model_dir), str(data), "rollout.engine=hf", "eval.max_prompts=4", "rollout.max_tokens=2", *extra]
    )
    out, err = capsys.readouterr()
    return code, (json.loads(out.strip().splitlines()[-1]) if code == 0 else None), err


def first_prompts(data, count: int) -> list[str]:
    return [json.loads(line)["prompt"] for line in data.read_text().splitlines()[:count]]


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "failing.py"
    path.write_text(FAILING_REWARD)
    return f"{path}:score"


@pytest.mark.parametrize("text, problem", [("{pattern: 1}", "is not valid JSON"), ('["a"]', "not a JSON object")])
def test_bad_reward_kwargs_are_named(tmp_path, capsys, text, problem):
    code = main(
        [
            "eval",
            "--model",
            str(tmp_path / "none"),
            "--data",
            str(tmp_path / "none.jsonl"),
            "--reward",
            "regex",
            "--reward-kwargs",
            text,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "--reward-kwargs" in err and problem in err and text in err


def test_reward_kwargs_reach_the_reward(capsys, random_model_dir, toy_task):
    code, result, err = run_eval(
        capsys, random_model_dir, toy_task["eval"], "reward.fn=regex", 'reward.kwargs={"pattern": ".*"}'
    )
    assert code == 0, err
    assert result == {"reward_mean": 1.0, "n": 4, "errors": 0, "timeouts": 0, "skipped": 0}


def test_regex_without_kwargs_says_how_to_pass_them(capsys, random_model_dir, toy_task):
    code, _, err = run_eval(capsys, random_model_dir, toy_task["eval"], "reward.fn=regex")
    assert code == 2 and "--reward-kwargs" in err and "pattern" in err


@pytest.mark.parametrize("on_error, mean, skipped", [("zero", 0.75, 0), ("skip", 0.75, 1)])
def test_failures_are_counted_per_on_error(capsys, random_model_dir, toy_task, reward_file, on_error, mean, skipped):
    kwargs = json.dumps({"fail_on": first_prompts(toy_task["eval"], 1)[0]})
    code, result, err = run_eval(
        capsys,
        random_model_dir,
        toy_task["eval"],
        f"reward.fn={reward_file}",
        f"reward.kwargs={kwargs}",
        f"reward.on_error={on_error}",
    )
    assert code == 0, err
    assert result == {"reward_mean": mean, "n": 4, "errors": 1, "timeouts": 0, "skipped": skipped}


def test_on_error_error_names_the_sample(capsys, random_model_dir, toy_task, reward_file):
    kwargs = json.dumps({"fail_on": first_prompts(toy_task["eval"], 1)[0]})
    code, _, err = run_eval(
        capsys,
        random_model_dir,
        toy_task["eval"],
        f"reward.fn={reward_file}",
        f"reward.kwargs={kwargs}",
        "reward.on_error=error",
    )
    assert code == 2 and "raised on sample" in err and "cannot score this one" in err


def test_a_reward_failing_on_every_sample_is_an_error_not_a_zero(capsys, random_model_dir, toy_task, reward_file):
    code, _, err = run_eval(
        capsys,
        random_model_dir,
        toy_task["eval"],
        f"reward.fn={reward_file}",
        'reward.kwargs={"fail_on": "*"}',
        "reward.on_error=zero",
    )
    assert code == 2 and "failed on 4 of 4 samples" in err


def test_timeouts_in_reward_workers_are_counted(capsys, random_model_dir, toy_task, reward_file):
    kwargs = json.dumps({"hang_on": first_prompts(toy_task["eval"], 2)[1]})
    code, result, err = run_eval(
        capsys,
        random_model_dir,
        toy_task["eval"],
        f"reward.fn={reward_file}",
        f"reward.kwargs={kwargs}",
        "reward.workers=1",
        "reward.timeout_s=1",
    )
    assert code == 0, err
    assert result == {"reward_mean": 0.75, "n": 4, "errors": 0, "timeouts": 1, "skipped": 0}


def test_the_old_flags_still_work_with_one_deprecation_line_naming_each_key(capsys, random_model_dir, toy_task):
    argv = ["eval", "--model", str(random_model_dir), "--data", str(toy_task["eval"]), "--engine", "hf"]
    argv += ["--max-prompts", "4", "--max-tokens", "2", "--reward", "regex", "--reward-kwargs", '{"pattern": ".*"}']
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {
        "reward_mean": 1.0,
        "n": 4,
        "errors": 0,
        "timeouts": 0,
        "skipped": 0,
    }
    lines = [line for line in err.splitlines() if "deprecated" in line]
    assert len(lines) == 1, err
    for replacement in ("model.path=", "data.eval=", "rollout.engine=hf", "eval.max_prompts=4", "rollout.max_tokens=2",
                        "reward.fn=regex", """reward.kwargs='{"pattern": ".*"}'"""):  # fmt: skip
        assert replacement in lines[0]


def test_a_key_value_eval_prints_no_deprecation(capsys, random_model_dir, toy_task):
    code, result, err = run_eval(capsys, random_model_dir, toy_task["eval"], "reward.fn=exact_match")
    assert code == 0 and "deprecated" not in err and result["n"] == 4


@pytest.mark.parametrize(
    "override, named",
    [("reward.fnn=regex", "'reward.fnn'"), ("rewrd.fn=regex", "'rewrd'"), ("eval.max_promts=2", "'eval.max_promts'")],
)
def test_an_unknown_key_is_one_error_naming_it(capsys, random_model_dir, toy_task, override, named):
    code, _, err = run_eval(capsys, random_model_dir, toy_task["eval"], override)
    assert code == 2 and named in err and "did you mean" in err
    assert err.count("\n") == 1


def test_a_bad_reward_kwargs_key_is_named(capsys, random_model_dir, toy_task):
    code, _, err = run_eval(capsys, random_model_dir, toy_task["eval"], "reward.fn=regex", "reward.kwargs=[a]")
    assert code == 2 and "reward.kwargs" in err


def test_model_and_data_are_needed(capsys, random_model_dir):
    code, _, err = run_eval(capsys, random_model_dir, "reward.fn=regex", "reward.kwargs={pattern: x}")
    assert code == 2 and "MODEL and DATA" in err and "data.eval" in err
