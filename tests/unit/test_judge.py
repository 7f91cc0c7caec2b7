"""relayrl.rewards.judge: the template, and the parser that turns a judge's answer into a score."""

from __future__ import annotations

import re

import pytest

from relayrl.errors import RewardError
from relayrl.rewards.judge import DEFAULT_PATTERN, Judge, parse_judgement


class EchoEngine:
    """A text engine that answers each prompt with a fixed answer, and records what it was sent."""

    def __init__(self, answers):
        self.answers, self.sent = answers, []

    def complete(self, texts, max_tokens):
        self.sent.extend(texts)
        return list(self.answers)


@pytest.mark.parametrize(
    "answer, expected", [("7", 7.0), (" 8/10", 8.0), ("score: -2.5 points", -2.5), ("9 then 3", 9.0)]
)
def test_default_pattern_takes_the_first_number(answer, expected):
    assert parse_judgement(answer, re.compile(DEFAULT_PATTERN), "s") == expected


def test_a_group_in_the_pattern_is_the_score():
    assert parse_judgement("Rating: [[6]] (of 10)", re.compile(r"\[\[(\d+)\]\]"), "s") == 6.0


def test_an_unparseable_answer_names_the_sample_and_quotes_it():
    with pytest.raises(
        RewardError,
        match=r"judge answer for sample p#3 does not parse \(no match for .*\): "
        r"'I think it is good'",
    ):
        parse_judgement("I think it is good", re.compile(DEFAULT_PATTERN), "p#3")


def test_a_match_that_is_not_a_number_says_so():
    with pytest.raises(RewardError, match="matched 'good', not a number"):
        parse_judgement("verdict: good", re.compile(r"verdict: (\w+)"), "s")


def test_default_scores_unparseable_answers():
    assert parse_judgement("no idea", re.compile(DEFAULT_PATTERN), "s", default=0.0) == 0.0


def test_judge_fills_the_template_with_columns():
    engine = EchoEngine(["3", "x"])
    judge = Judge(engine, template="Q {prompt} A {completion} gold {answer}:", default=-1.0)
    assert judge.score(["1+1", "2+2"], ["2", "5"], answer=["2", "4"]) == [3.0, -1.0]
    assert engine.sent == ["Q 1+1 A 2 gold 2:", "Q 2+2 A 5 gold 4:"]


def test_judge_names_the_sample_in_the_batch():
    with pytest.raises(RewardError, match=r"sample 1 of the batch \(prompt 'b'\)"):
        Judge(EchoEngine(["3", "x"])).score(["a", "b"], ["1", "2"])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"template": "{prompt"}, "not a format string"),
        ({"template": "{0} {prompt}"}, "fields must be names"),
        ({"pattern": "(["}, "is not a regex"),
    ],
)
def test_bad_template_or_pattern_fails_at_construction(kwargs, message):
    with pytest.raises(RewardError, match=message):
        Judge(EchoEngine([]), **kwargs)


def test_a_template_field_that_is_not_a_column_is_named():
    with pytest.raises(RewardError, match=r"uses \{solution\}, which is neither .* \(columns: \['answer'\]\)"):
        Judge(EchoEngine(["1"]), template="{prompt} {solution}").score(["a"], ["b"], answer=["c"])
