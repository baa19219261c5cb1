"""Survey files: the example parses; errors name the file, the line and
what to change; the budget split is exact."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from veil.survey import SurveyError, load_survey, parse_survey

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "survey.toml"

HEAD = """\
[survey]
name = "t"
epsilon = 1
"""


def test_example_parses_and_splits_budget_by_weight() -> None:
    survey = load_survey(EXAMPLE)
    assert [q.kind for q in survey.questions] == [
        "yes_no",
        "integer",
        "choice",
        "multi_choice",
        "vector",
    ]
    assert sum((q.epsilon for q in survey.questions), Fraction(0)) == survey.epsilon
    eps = {q.id: q.epsilon for q in survey.questions}
    assert eps["commute"] == 2 * eps["remote"]
    for q in survey.questions:
        q.vdaf()  # every question maps to a constructible Prio3 instance


def test_explicit_epsilons_and_weights_mix() -> None:
    survey = parse_survey(
        HEAD
        + """
[[question]]
id = "a"
kind = "yes_no"
epsilon = 0.25

[[question]]
id = "b"
kind = "yes_no"
weight = 3

[[question]]
id = "c"
kind = "yes_no"
"""
    )
    assert [q.epsilon for q in survey.questions] == [
        Fraction(1, 4),
        Fraction(9, 16),
        Fraction(3, 16),
    ]


def test_answers_map_to_measurements() -> None:
    survey = load_survey(EXAMPLE)
    assert survey.question("remote").to_measurement(True) == 1
    assert survey.question("team").to_measurement("sales") == 2
    tools = survey.question("tools").to_measurement(["chat", "ide"])
    assert tools == [False, True, False, False, False, False, True]
    with pytest.raises(ValueError, match="not one of"):
        survey.question("team").to_measurement("marketing")
    with pytest.raises(ValueError, match="bool"):
        survey.question("remote").to_measurement(1)


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ('[[question]]\nid = "a"\nkind = "essay"\n', 7, "unknown kind 'essay'"),
        ('[[question]]\nid = "a"\nkind = "integer"\nmax = 0\n', 8, "`max` must be a positive"),
        (
            '[[question]]\nid = "a"\nkind = "integer"\nmax = 100000000000000000\n',
            8,
            "does not fit",
        ),
        (
            '[[question]]\nid = "a"\nkind = "yes_no"\nepsilon = 0.75\n'
            '[[question]]\nid = "b"\nkind = "yes_no"\nepsilon = 0.5\n',
            8,
            "overspends",
        ),
        ('[[question]]\nid = "a"\nkind = "yes_no"\nweight = -1\n', 8, "`weight` must be positive"),
        ('[[question]]\nid = "a"\nkind = "choice"\noptions = ["x"]\n', 8, "at least two"),
        (
            '[[question]]\nid = "a"\nkind = "multi_choice"\n'
            'options = ["x", "y"]\nmax_choices = 3\n',
            9,
            "does not fit",
        ),
        ('[[question]]\nid = "a"\nkind = "yes_no"\ncolour = "red"\n', 8, "not a setting"),
        (
            '[[question]]\nid = "a"\nkind = "yes_no"\n[[question]]\nid = "a"\nkind = "yes_no"\n',
            9,
            "used twice",
        ),
    ],
)
def test_errors_name_file_line_and_fix(body: str, line: int, message: str) -> None:
    with pytest.raises(SurveyError, match=message) as info:
        parse_survey(HEAD + "\n" + body, "s.toml")
    assert str(info.value).startswith(f"s.toml:{line}:"), str(info.value)


@pytest.mark.parametrize(
    ("epsilon", "message"),
    [("0", r"\(0, 20\]"), ("-1", r"\(0, 20\]"), ("21", r"\(0, 20\]"), ('"abc"', "number")],
)
def test_survey_epsilon_must_be_valid(epsilon: str, message: str) -> None:
    text = f'[survey]\nname = "t"\nepsilon = {epsilon}\n[[question]]\nid = "a"\nkind = "yes_no"\n'
    with pytest.raises(SurveyError, match=message) as info:
        parse_survey(text, "s.toml")
    assert str(info.value).startswith("s.toml:3:")


def test_structural_errors() -> None:
    with pytest.raises(SurveyError, match="not valid TOML"):
        parse_survey("[survey\n", "s.toml")
    with pytest.raises(SurveyError, match=r"\[survey\]"):
        parse_survey("[[question]]\nid='a'\nkind='yes_no'\n", "s.toml")
    with pytest.raises(SurveyError, match="at least one"):
        parse_survey(HEAD, "s.toml")
    with pytest.raises(SurveyError, match="cannot read"):
        load_survey("/nonexistent/survey.toml")
