"""relayrl.rewards: loading reward functions and the guard that checks what they return."""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pytest

from relayrl.errors import RelayError, RewardError
from relayrl.rewards import load_reward, score_rollouts
from relayrl.types import Prompt, Rollout, Score


def rollout(completion: str, prompt_id: str = "p", index: int = 0, text: str = "Q:", **columns) -> Rollout:
    prompt = Prompt(id=prompt_id, text=text, token_ids=[1, 2], columns=columns)
    return Rollout(
        prompt=prompt,
        group_index=index,
        response_ids=[3],
        response_text=completion,
        behaviour_logprobs=[-0.5],
        finish_reason="stop",
        versions=[0],
    )


def rewards(scores: list[Score]) -> list[float]:
    return [s.reward for s in scores]


def reward_error(fn, *args, **kwargs) -> str:
    with pytest.raises(RewardError) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, RelayError)
    return str(info.value)


def constant(values):
    """A batched reward that returns `values` whatever the batch."""
    return lambda prompts, completions, **columns: list(values)


# ---------------------------------------------------------------------------- built-ins


def test_exact_match_normalises_whitespace():
    fn = load_reward("exact_match")
    batch = [
        rollout(" 42\n", answer="42", index=0),
        rollout("4 2", answer="42", index=1),
        rollout("a  b", answer="a b ", index=2),
        rollout("43", answer="42", index=3),
        rollout("7", answer=7, index=4),
    ]
    scores, errors = score_rollouts(fn, batch)
    assert rewards(scores) == [1.0, 0.0, 1.0, 0.0, 1.0] and errors == []


def test_exact_match_without_answer_column_names_it_even_with_on_error_zero():
    fn = load_reward("exact_match")
    for on_error in ("error", "zero"):  # a missing column is a setup mistake, not a failing sample
        message = reward_error(score_rollouts, fn, [rollout("4", solution="4")], on_error)
        assert "'answer' column" in message and "exact_match" in message and "solution" in message


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("The answer is $\\frac{1}{2}$", "0.5", 1.0),
        ("so we get \\boxed{4}", "4", 1.0),
        ("\\boxed{4}", 4, 1.0),
        ("The answer is $\\frac{1}{3}$", "0.5", 0.0),
        ("\\boxed{5}", "4", 0.0),
        ("no idea", "4", 0.0),
        ("$x = 2$", "$2$", 1.0),
    ],
)
def test_math_verifier(completion, answer, expected):
    scores, errors = score_rollouts(load_reward("math"), [rollout(completion, answer=answer)])
    assert rewards(scores) == [expected] and errors == []


def test_regex_with_kwargs():
    fn = load_reward("regex", {"pattern": r"<answer>\d+</answer>"})
    batch = [
        rollout(" <answer>12</answer>\n"),
        rollout("<answer>x</answer>", index=1),
        rollout("<answer>1</answer> and more", index=2),
    ]
    scores, _ = score_rollouts(fn, batch)
    assert rewards(scores) == [1.0, 0.0, 0.0]


def test_regex_without_pattern_says_how_to_set_it():
    message = reward_error(score_rollouts, load_reward("regex"), [rollout("x")], "zero")
    assert "reward.kwargs.pattern" in message


def test_unknown_builtin_lists_builtins():
    message = reward_error(load_reward, "exact")
    assert "'exact'" in message and "exact_match" in message and "math" in message
    assert "module:function" in message


# ---------------------------------------------------------------------------- user functions


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent("""
        def length_bonus(prompts, completions, answer, scale=1.0, **_):
            return [scale * len(c) + (c == a) for c, a in zip(completions, answer)]

        not_a_function = 3
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    import sys

    sys.modules.pop("my_rewards", None)


def test_user_function_by_module(user_module):
    fn = load_reward(f"{user_module}:length_bonus")
    scores, _ = score_rollouts(fn, [rollout("abc", answer="abc"), rollout("ab", answer="x", index=1)])
    assert rewards(scores) == [4.0, 2.0]


def test_user_function_kwargs_are_bound(user_module):
    fn = load_reward(f"{user_module}:length_bonus", {"scale": 0.5})
    scores, _ = score_rollouts(fn, [rollout("abcd", answer="zz")])
    assert rewards(scores) == [2.0]


def test_user_function_by_file_path(tmp_path):
    path = tmp_path / "sub" / "score.py"
    path.parent.mkdir()
    path.write_text(
        textwrap.dedent("""
        from __future__ import annotations

        from dataclasses import dataclass

        @dataclass
        class Weights:  # with string annotations, dataclass looks its module up in sys.modules
            hit: float = 2.0

        def reward(prompts, completions, **columns):
            return [Weights().hit if "yes" in c else 0.0 for c in completions]
    """)
    )
    fn = load_reward(f"{path}:reward")
    scores, _ = score_rollouts(fn, [rollout("yes!"), rollout("no", index=1)])
    assert rewards(scores) == [2.0, 0.0]


def test_missing_file_names_the_spec(tmp_path):
    spec = f"{tmp_path / 'nope.py'}:reward"
    message = reward_error(load_reward, spec)
    assert repr(spec) in message and "file not found" in message


def test_missing_function_in_module(user_module):
    message = reward_error(load_reward, f"{user_module}:nope")
    assert "'my_rewards:nope'" in message and "no function 'nope'" in message


def test_attribute_that_is_not_callable(user_module):
    assert "no function 'not_a_function'" in reward_error(load_reward, f"{user_module}:not_a_function")


def test_missing_function_in_file(tmp_path):
    path = tmp_path / "score.py"
    path.write_text("def other(p, c): return [0.0] * len(c)\n")
    message = reward_error(load_reward, f"{path}:reward")
    assert f"{path}:reward" in message and "no function 'reward'" in message


def test_unimportable_module_names_the_spec():
    message = reward_error(load_reward, "no_such_module_xyz:fn")
    assert "'no_such_module_xyz:fn'" in message and "cannot import module 'no_such_module_xyz'" in message


def test_module_that_fails_on_import_names_the_spec(tmp_path, monkeypatch):
    (tmp_path / "broken_reward.py").write_text("def reward(p, c)\n    return 1\n")  # SyntaxError
    (tmp_path / "raising_reward.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    message = reward_error(load_reward, "broken_reward:reward")
    assert "'broken_reward:reward'" in message and "SyntaxError" in message
    message = reward_error(load_reward, "raising_reward:reward")
    assert "'raising_reward:reward'" in message and "no_such_dependency_xyz" in message


def test_file_that_fails_on_import_names_the_spec(tmp_path):
    path = tmp_path / "score.py"
    path.write_text("raise RuntimeError('needs a GPU')\n")
    message = reward_error(load_reward, f"{path}:reward")
    assert f"{path}:reward" in message and "RuntimeError: needs a GPU" in message


# ---------------------------------------------------------------------------- the output guard


def test_columns_reach_the_function_aligned_with_the_batch():
    seen = {}

    def fn(prompts, completions, **columns):
        seen.update(prompts=prompts, completions=completions, **columns)
        return [0.0] * len(completions)

    batch = [rollout("a", "p1", text="T1", answer="1", level=2), rollout("b", "p2", text="T2", answer="2")]
    score_rollouts(fn, batch)
    assert seen == {"prompts": ["T1", "T2"], "completions": ["a", "b"], "answer": ["1", "2"], "level": [2, None]}


def test_dict_results_are_components_summed():
    fn = constant([{"correct": 1.0, "format": 0.25}, {"correct": 0, "format": np.float32(0.5)}])
    scores, errors = score_rollouts(fn, [rollout("a"), rollout("b", index=1)])
    assert scores[0] == Score(1.25, {"correct": 1.0, "format": 0.25})
    assert scores[1] == Score(0.5, {"correct": 0.0, "format": 0.5})
    assert all(type(v) is float for s in scores for v in s.components.values())
    assert errors == []


@pytest.mark.parametrize("bad", [{}, {"correct": 1.0, "format": None}, {"correct": float("nan")}])
def test_bad_dict_result_names_the_sample(bad):
    message = reward_error(score_rollouts, constant([1.0, bad]), [rollout("a"), rollout("b", "q", 3)])
    assert "sample q#3" in message


def test_raising_on_one_sample_names_it():
    def fn(prompts, completions, **columns):
        if "boom" in completions:
            raise ValueError("cannot parse")
        return [1.0] * len(completions)

    batch = [rollout("ok", "p", 0), rollout("boom", "p", 1), rollout("ok", "q", 0)]
    message = reward_error(score_rollouts, fn, batch, "error")
    assert "sample p#1" in message and "ValueError: cannot parse" in message
    assert "p#0" not in message and "q#0" not in message


def test_raising_on_one_sample_with_on_error_zero():
    def fn(prompts, completions, **columns):
        if "boom" in completions:
            raise ValueError("cannot parse")
        return [1.0] * len(completions)

    batch = [rollout("ok", "p", 0), rollout("boom", "p", 1), rollout("ok", "q", 0)]
    scores, errors = score_rollouts(fn, batch, "zero")
    assert rewards(scores) == [1.0, 0.0, 1.0] and len(errors) == 1


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), None, "1.0", [1.0], np.float64("nan")])
def test_non_finite_or_non_number_names_the_sample(bad):
    batch = [rollout("a", "p", 0), rollout("b", "p", 1)]
    message = reward_error(score_rollouts, constant([1.0, bad]), batch, "error")
    assert "sample p#1" in message and repr(bad) in message and "reward.on_error=zero" in message


@pytest.mark.parametrize("bad", [float("nan"), None, "1.0"])
def test_non_number_scores_zero_and_is_counted_with_on_error_zero(bad):
    batch = [rollout("a", "p", 0), rollout("b", "p", 1), rollout("c", "p", 2)]
    scores, errors = score_rollouts(constant([0.5, bad, bad]), batch, "zero")
    assert rewards(scores) == [0.5, 0.0, 0.0] and len(errors) == 2


@pytest.mark.parametrize("values", [[1.0], [1.0, 1.0, 1.0], 1.0, None, "11"])
def test_wrong_length_or_type_of_result(values):
    def fn(prompts, completions, **columns):
        return values

    message = reward_error(score_rollouts, fn, [rollout("a"), rollout("b", index=1)], "zero")
    assert "must return a list of 2 values" in message and "batched" in message


def test_tuple_result_is_accepted():
    scores, _ = score_rollouts(lambda p, c, **k: (1.0, 0.0), [rollout("a"), rollout("b", index=1)])
    assert rewards(scores) == [1.0, 0.0]


def test_numpy_numbers_are_accepted_as_python_floats():
    values = [np.float64(0.25), np.float32(0.5), np.int64(2), 3]
    scores, errors = score_rollouts(constant(values), [rollout(str(i), index=i) for i in range(4)])
    assert rewards(scores) == [0.25, 0.5, 2.0, 3.0] and errors == []
    assert all(type(r) is float for r in rewards(scores))


def test_bools_score_one_and_zero():
    # A decision: `completion == answer` is a natural reward, so bools (Python's and numpy's) count as 1.0/0.0.
    values = [True, False, np.bool_(True), np.bool_(False)]
    scores, errors = score_rollouts(constant(values), [rollout(str(i), index=i) for i in range(4)])
    assert rewards(scores) == [1.0, 0.0, 1.0, 0.0] and errors == []
    assert all(type(r) is float for r in rewards(scores))


def test_empty_batch():
    assert score_rollouts(constant([]), []) == ([], [])


def test_scores_are_finite_floats():
    scores, _ = score_rollouts(constant([-1.5, 0, 1e6]), [rollout(str(i), index=i) for i in range(3)])
    assert all(math.isfinite(s.reward) for s in scores) and rewards(scores) == [-1.5, 0.0, 1e6]


# ---------------------------------------------------------------------------- arrays and tensors


def returning(values):
    """A batched reward that returns `values` itself (an array, a tensor) whatever the batch."""
    return lambda prompts, completions, **columns: values


def test_a_numpy_array_of_one_value_per_sample_is_accepted():
    for values, expected in [
        (np.array([0.25, 1.0, 0.0]), [0.25, 1.0, 0.0]),
        (np.array([2, 0, 1], dtype=np.int32), [2.0, 0.0, 1.0]),
        (np.array([True, False, True]), [1.0, 0.0, 1.0]),
    ]:
        scores, errors = score_rollouts(returning(values), [rollout(str(i), index=i) for i in range(3)])
        assert rewards(scores) == expected and errors == []
        assert all(type(r) is float for r in rewards(scores))


def test_a_torch_tensor_of_one_value_per_sample_is_accepted():
    import torch

    for values in [
        torch.tensor([0.5, 2.0]),
        torch.tensor([0.5, 2.0], requires_grad=True),
        torch.tensor([0.5, 2.0], dtype=torch.bfloat16),
    ]:
        scores, errors = score_rollouts(returning(values), [rollout("a"), rollout("b", index=1)])
        assert rewards(scores) == [0.5, 2.0] and errors == []
        assert all(type(r) is float for r in rewards(scores))


def test_zero_dimensional_arrays_and_tensors_are_numbers():
    import torch

    values = [torch.tensor(0.5), np.array(1.5), {"correct": torch.tensor(1.0), "format": np.array(0.25)}]
    scores, errors = score_rollouts(returning(values), [rollout(str(i), index=i) for i in range(3)])
    assert rewards(scores) == [0.5, 1.5, 1.25] and errors == []
    assert scores[2].components == {"correct": 1.0, "format": 0.25}


@pytest.mark.parametrize(
    "values, got",
    [(np.ones(3), "got 3 values"), (np.ones((2, 1)), "got an array of shape (2, 1)"), (np.float64(1.0), "got float64")],
)
def test_an_array_of_the_wrong_shape_is_named(values, got):
    message = reward_error(score_rollouts, returning(values), [rollout("a"), rollout("b", index=1)], "zero")
    assert "must return a list of 2 values" in message and got in message


def test_a_nan_in_an_array_names_the_sample():
    message = reward_error(score_rollouts, returning(np.array([1.0, np.nan])), [rollout("a"), rollout("b", index=1)])
    assert "sample p#1" in message and "nan" in message
