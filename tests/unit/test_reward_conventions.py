"""TRL's and verl's reward functions scored through relayrl's loader and scorer unchanged (rewards/conventions.py)."""

from __future__ import annotations

import sys
import textwrap

import pytest

from relayrl.config import RewardConfig
from relayrl.errors import RewardError
from relayrl.rewards import load_reward, score_rollouts
from relayrl.rewards.service import build_reward_service
from relayrl.types import Prompt, Rollout, Score


@pytest.fixture
def trl_rewards():
    """TRL's reward functions, imported by the tests that call them (not at collection, on every worker)."""
    return pytest.importorskip("trl.rewards")


MESSAGES = [{"role": "system", "content": "Think, then answer."}, {"role": "user", "content": "What is 1/3?"}]
COMPLETIONS = [
    r"<think>easy</think> \boxed{\frac{1}{3}}",
    r"\boxed{\frac{1}{2}}",
    "<think>a<think>b</think>",
    "no answer at all",
]
SOLUTIONS = [r"\frac{1}{3}", r"\frac{1}{3}", r"\frac{1}{3}", "not math"]


def rollout(completion: str, index: int, messages=None, ids=None, **columns) -> Rollout:
    prompt = Prompt(id=f"p{index}", text="rendered prompt", token_ids=[1, 2], columns=columns, messages=messages)
    return Rollout(
        prompt=prompt,
        group_index=0,
        response_ids=ids or [7] * (index + 1),
        response_text=completion,
        behaviour_logprobs=[-0.5],
        finish_reason="stop",
        versions=[0],
    )


def chat_batch():
    return [rollout(c, i, MESSAGES, solution=s) for i, (c, s) in enumerate(zip(COMPLETIONS, SOLUTIONS))]


def as_trl_completions():
    return [[{"role": "assistant", "content": c}] for c in COMPLETIONS]


def rewards(scores):
    return [s.reward for s in scores]


def test_trl_accuracy_reward_on_messages_rows_equals_trl_called_directly(trl_rewards):
    fn = load_reward("trl.rewards:accuracy_reward")
    scores, errors = score_rollouts(fn, chat_batch())
    direct = trl_rewards.accuracy_reward(as_trl_completions(), SOLUTIONS)
    assert direct[3] is None  # an unparseable gold solution: TRL skips the sample
    assert rewards(scores) == [0.0 if d is None else d for d in direct] == [1.0, 0.0, 0.0, 0.0]
    assert errors == []  # None means "does not apply", not a failure


def test_trl_none_contributes_nothing_to_a_combined_reward():
    config = RewardConfig(
        components=[{"fn": "trl.rewards:accuracy_reward", "weight": 2.0}, {"fn": "trl.rewards:think_format_reward"}]
    )
    with build_reward_service(config) as service:
        scores, metrics = service.score(chat_batch())
    assert rewards(scores) == [3.0, 0.0, 0.0, 0.0] and metrics["reward/errors"] == 0
    assert scores[3] is not None and scores[3].components == {"accuracy_reward": 0.0, "think_format_reward": 0.0}


def test_trl_think_format_reward_equals_trl_called_directly(trl_rewards):
    scores, _ = score_rollouts(load_reward("trl.rewards:think_format_reward"), chat_batch())
    assert rewards(scores) == trl_rewards.think_format_reward(as_trl_completions()) == [1.0, 0.0, 0.0, 0.0]


def test_trl_on_plain_rows_gets_strings_like_trl(tmp_path, monkeypatch):
    (tmp_path / "trl_style.py").write_text(
        textwrap.dedent("""
        def length_reward(completions, answer, completion_ids, **kwargs):
            return [float(isinstance(c, str)) + len(ids) / 10 for c, ids in zip(completions, completion_ids)]

        def echo(prompts, completions, **kwargs):
            return [float(p == "rendered prompt" and c == "a") for p, c in zip(prompts, completions)]
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    batch = [rollout("a", 0, answer="1"), rollout("b", 1, answer="2")]
    assert rewards(score_rollouts(load_reward("trl_style:length_reward"), batch)[0]) == [1.1, 1.2]
    forced = load_reward("trl_style:echo", style="trl")  # (prompts, completions, ...) is relayrl's under auto
    assert forced.style == "trl" and rewards(score_rollouts(forced, batch)[0]) == [1.0, 0.0]


def test_trl_continued_assistant_turn_prefixes_the_completion(tmp_path, monkeypatch):
    (tmp_path / "trl_seen.py").write_text(
        textwrap.dedent("""
        SEEN = []
        def seen(prompts, completions, **kwargs):
            SEEN.append((prompts, completions))
            return [0.0] * len(completions)
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "It is "}]
    score_rollouts(load_reward("trl_seen:seen", style="trl"), [rollout("4", 0, messages)])
    assert [([messages[:1]], [[{"role": "assistant", "content": "It is 4"}]])] == sys.modules["trl_seen"].SEEN


def test_trl_factory_with_kwargs_equals_trl_called_directly(trl_rewards):
    kwargs = {"max_completion_len": 10, "soft_punish_cache": 4}
    fn = load_reward("trl.rewards:get_soft_overlong_punishment", kwargs)
    ids = [[7] * 5, [7] * 8, [7] * 12]
    batch = [rollout("x", i, ids=i_ids) for i, i_ids in enumerate(ids)]
    expected = trl_rewards.get_soft_overlong_punishment(**kwargs)(ids)
    assert rewards(score_rollouts(fn, batch)[0]) == expected == [0.0, -0.5, -1.0]


VERL = textwrap.dedent("""
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        correct = solution_str.strip() == str(ground_truth)
        return {"score": float(correct), "acc": correct, "pred": solution_str, "bonus": extra_info.get("bonus", 0)}

    def plain_score(data_source, solution_str, ground_truth):
        if solution_str == "boom":
            raise ValueError("cannot grade")
        return float(data_source == "gsm8k" and solution_str == ground_truth)
""")


@pytest.fixture
def verl_module(tmp_path):
    (tmp_path / "verl_reward.py").write_text(VERL)
    return str(tmp_path / "verl_reward.py")


def test_verl_dict_score_is_the_reward_and_the_rest_are_components(verl_module):
    fn = load_reward(f"{verl_module}:compute_score")
    batch = [
        rollout(
            " 4",
            0,
            MESSAGES,
            data_source="gsm8k",
            reward_model={"style": "rule", "ground_truth": "4"},
            extra_info={"bonus": 2},
        ),
        rollout("5", 1, ground_truth="4"),
    ]
    scores, errors = score_rollouts(fn, batch)
    assert scores == [Score(1.0, {"acc": 1.0, "bonus": 2.0}), Score(0.0, {"acc": 0.0, "bonus": 0.0})]  # not 2.0
    module = sys.modules["relayrl_user_reward_verl_reward"]
    assert [
        module.compute_score("gsm8k", " 4", "4", {"bonus": 2})["score"],
        module.compute_score(None, "5", "4", {})["score"],
    ] == rewards(scores)


def test_verl_float_and_a_raising_sample_named(verl_module):
    fn = load_reward(f"{verl_module}:plain_score")
    batch = [rollout("4", 0, data_source="gsm8k", ground_truth="4"), rollout("boom", 1, ground_truth="4")]
    with pytest.raises(RewardError, match="sample p1#0: ValueError: cannot grade"):
        score_rollouts(fn, batch)
    scores, errors = score_rollouts(fn, batch, on_error="zero")
    assert rewards(scores) == [1.0, 0.0] and len(errors) == 1


def test_verl_without_ground_truth_names_the_sample_and_columns(verl_module):
    with pytest.raises(RewardError, match=r"sample p0#0.*'ground_truth' column.*\['answer'\]"):
        score_rollouts(load_reward(f"{verl_module}:plain_score"), [rollout("4", 0, answer="4")], on_error="zero")


def test_signature_fitting_no_convention_says_what_was_expected(tmp_path):
    (tmp_path / "odd.py").write_text("def grade(text):\n    return 1.0\n")
    with pytest.raises(RewardError) as info:
        load_reward(f"{tmp_path / 'odd.py'}:grade")
    message = str(info.value)
    assert "grade(text)" in message and "fn(prompts, completions, **columns)" in message
    assert "compute_score(data_source, solution_str, ground_truth, extra_info)" in message


def test_auto_keeps_relayrl_functions_plain_and_announces_the_convention_once(tmp_path, capsys):
    (tmp_path / "own.py").write_text("def score(p, c, **cols):\n    return [1.0] * len(c)\n")
    spec = f"{tmp_path / 'own.py'}:score"
    fn = load_reward(spec)
    load_reward(spec)
    assert callable(fn) and fn.__name__ == "score"  # relayrl's own: the function itself, as before
    assert capsys.readouterr().err.count("relayrl's convention fn(prompts, completions, **columns)") == 1


def test_style_reaches_worker_processes(tmp_path, monkeypatch):
    (tmp_path / "trl_in_worker.py").write_text(
        textwrap.dedent("""
        def kind(prompts, completions, **kwargs):
            return [float(isinstance(c, list)) for c in completions]
    """)
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    config = RewardConfig(fn="trl_in_worker:kind", style="trl", workers=1, timeout_s=30)
    with build_reward_service(config) as service:
        scores, _ = service.score(chat_batch()[:2])
    assert rewards(scores) == [1.0, 1.0]


def test_trl_async_function_is_awaited(tmp_path, monkeypatch):
    (tmp_path / "trl_async.py").write_text(
        textwrap.dedent("""
        async def lengths(completions, **kwargs):
            return [float(len(c[0]["content"])) for c in completions]
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    scores, _ = score_rollouts(load_reward("trl_async:lengths"), chat_batch()[:2])
    assert rewards(scores) == [float(len(COMPLETIONS[0])), float(len(COMPLETIONS[1]))]


def test_verl_dict_without_score_names_the_sample_and_the_key(tmp_path):
    (tmp_path / "no_score.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return {'acc': 1.0}\n"
    )
    with pytest.raises(RewardError, match=r"sample p0#0 is \{'acc': 1.0\}, not .*a finite 'score'"):
        score_rollouts(load_reward(f"{tmp_path / 'no_score.py'}:compute_score"), [rollout("4", 0, ground_truth="4")])
