"""Survey files: the example parses; errors name the file, the line and
what to change; the budget split is exact."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from veil.dp.accounting import zcdp_rho
from veil.survey import AnswerError, SurveyError, load_survey, parse_survey

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "survey.toml"

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
    # The questions and the breakdown (remote by team) share the survey's ε.
    assert sum((q.epsilon for q in survey.tasked), Fraction(0)) == survey.epsilon
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
        (
            '[[question]]\nid = "a"\nkind = "yes_no"\ncolour = "red"\n',
            8,
            "unknown setting 'colour'",
        ),
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
    [
        ("0", r"\[1/1000, 20\]"),
        ("-1", r"\[1/1000, 20\]"),
        ("21", r"\[1/1000, 20\]"),
        ("1e-30", r"\[1/1000, 20\]"),
        ('"abc"', "number"),
    ],
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


Q = '\n[[question]]\nid = "a"\nkind = "yes_no"\n'


def test_window_in_rfc3339_aligned_to_time_precision() -> None:
    survey = parse_survey(
        HEAD
        + "opens = 2026-05-01T09:00:00+02:00\n"
        + 'closes = "2026-05-08T07:00:00Z"\n'
        + "time_precision = 1800\nmax_clock_skew = 30\n"
        + Q
    )
    assert survey.opens == 1777618800  # 07:00 UTC
    assert survey.closes == survey.opens + 7 * 86400
    assert (survey.time_precision, survey.max_clock_skew, survey.id) == (1800, 30, "t")
    assert parse_survey(HEAD + Q).opens is None  # a survey without a window: simulated only


@pytest.mark.parametrize(
    ("window", "line", "message"),
    [
        ("opens = 2026-05-01T09:00:00Z\n", 4, "needs both `opens` and `closes`"),
        (
            "opens = 2026-05-01T09:00:00\ncloses = 2026-05-02T09:00:00Z\n",
            4,
            "no UTC offset",
        ),
        (
            'opens = "yesterday"\ncloses = 2026-05-02T09:00:00Z\n',
            4,
            "not an RFC 3339 date-time",
        ),
        (
            "opens = 2026-05-01T09:30:00Z\ncloses = 2026-05-02T09:00:00Z\n",
            4,
            "not aligned to the time_precision of 3600 s.*use 2026-05-01T09:00:00Z",
        ),
        (
            "opens = 2026-05-02T09:00:00Z\ncloses = 2026-05-01T09:00:00Z\n",
            5,
            "`closes` must be after `opens`",
        ),
        ("opens = 1\ncloses = 2\n", 4, "not a date-time"),
        ("time_precision = 0\n", 4, "`time_precision` must be"),
        ("max_clock_skew = -1\n", 4, "`max_clock_skew` must be"),
    ],
)
def test_window_errors_name_line_and_fix(window: str, line: int, message: str) -> None:
    with pytest.raises(SurveyError, match=message) as info:
        parse_survey(HEAD + window + Q, "s.toml")
    assert str(info.value).startswith(f"s.toml:{line}:"), str(info.value)


def test_answers_by_label_and_what_is_allowed() -> None:
    survey = parse_survey(
        HEAD
        + '[[question]]\nid = "v"\nkind = "vector"\nlength = 2\nmax = 5\nlabels = ["x", "y"]\n'
        + '[[question]]\nid = "n"\nkind = "integer"\nmax = 9\n'
        + '[[question]]\nid = "m"\nkind = "multi_choice"\noptions = ["a", "b", "c"]\n'
        + "max_choices = 2\n"
        + Q
    )
    yes = survey.question("a")
    assert [yes.to_measurement(x) for x in ("yes", "No", "true", False)] == [1, 0, 1, 0]
    assert survey.question("n").to_measurement("7") == 7
    assert survey.question("v").to_measurement([5, "0"]) == [5, 0]
    assert survey.question("v").element_labels() == ("x", "y")
    assert survey.question("m").to_measurement(["c"]) == [False, False, True]
    cases = [
        ("a", "maybe", "'a': 'maybe' is not an allowed answer.*give yes or no"),
        ("n", 10, "'n': 10 .*a whole number from 0 to 9"),
        ("n", 2.5, "whole number"),
        ("n", True, "whole number"),
        ("v", [1], r"\(1 numbers\).*2 whole numbers"),
        ("m", ["a", "b", "c"], r"\(3 options chosen\).*at most 2 of 'a', 'b', 'c'"),
        ("m", ["a", "a"], "named twice"),
        ("m", "a", "not a list"),
        ("m", ["d"], "'d' is not one of the options"),
    ]
    for qid, answer, message in cases:
        with pytest.raises(AnswerError, match=message):
            survey.question(qid).to_measurement(answer)


def test_vector_labels_must_match_length() -> None:
    with pytest.raises(SurveyError, match="2 distinct names"):
        parse_survey(
            HEAD + '[[question]]\nid = "v"\nkind = "vector"\nlength = 2\nmax = 5\nlabels = ["x"]\n'
        )


# --------------------------------------------------------------- ε vs ρ (issue 14)

QUESTIONS = """
[[question]]
id = "a"
kind = "yes_no"

[[question]]
id = "b"
kind = "integer"
max = 10
"""


def test_gaussian_survey_epsilon_alone_is_refused() -> None:
    # The defect: `epsilon = 2` with the gaussian mechanism was taken as ρ = 2
    # (ε ≈ 11.7 at δ = 1e-6). Now a zCDP budget is `rho`, or `epsilon` and `delta`.
    text = '[survey]\nname = "t"\nepsilon = 2\nmechanism = "gaussian"\n' + QUESTIONS
    with pytest.raises(SurveyError, match=r"<string>:3: .*`rho`, or as `epsilon` and `delta`"):
        parse_survey(text)


def test_gaussian_survey_epsilon_and_delta_solve_for_rho() -> None:
    text = '[survey]\nepsilon = 2\ndelta = 1e-6\nmechanism = "gaussian"\n' + QUESTIONS
    survey = parse_survey(text)
    assert survey.zcdp and survey.epsilon is None
    assert survey.delta == Fraction(1, 10**6)
    assert survey.rho == zcdp_rho(Fraction(2), Fraction(1, 10**6))
    assert 0.08 < survey.rho < 0.09  # far below the 2 it used to be
    assert sum((q.rho or 0 for q in survey.questions), Fraction(0)) == survey.rho
    assert all(q.epsilon is None and q.mechanism == "gaussian" for q in survey.questions)


def test_gaussian_survey_takes_rho() -> None:
    survey = parse_survey('[survey]\nrho = 0.5\nmechanism = "gaussian"\n' + QUESTIONS)
    assert survey.rho == Fraction(1, 2) and survey.delta == Fraction(1, 10**6)
    assert [q.rho for q in survey.questions] == [Fraction(1, 4), Fraction(1, 4)]


@pytest.mark.parametrize(
    ("head", "message"),
    [
        ('rho = 0.5\nepsilon = 1\nmechanism = "gaussian"', "`rho`, or as `epsilon` and `delta`"),
        ('rho = 0.5\nmechanism = "geometric"', "`rho` belongs to zCDP"),
        ('epsilon = 1\ndelta = 1e-6\nmechanism = "geometric"', "`delta` belongs to zCDP"),
        ('rho = 0\nmechanism = "gaussian"', r"`rho` must be in \[1/2000000, 4\]"),
        ('epsilon = 1\ndelta = 0.5\nmechanism = "gaussian"', r"`delta` must be in"),
        ('rho = "x"\nmechanism = "gaussian"', "`rho` must be a number"),
    ],
)
def test_bad_zcdp_budgets_name_the_line(head: str, message: str) -> None:
    with pytest.raises(SurveyError, match=message):
        parse_survey("[survey]\n" + head + "\n" + QUESTIONS)


def test_mixed_survey_is_composed_under_zcdp() -> None:
    text = """[survey]
rho = 1
[[question]]
id = "a"
kind = "yes_no"
mechanism = "gaussian"
rho = 0.5
[[question]]
id = "b"
kind = "yes_no"
epsilon = 0.5
[[question]]
id = "c"
kind = "yes_no"
"""
    survey = parse_survey(text)
    a, b, c = survey.questions
    assert survey.zcdp and survey.rho == 1
    assert (a.mechanism, a.rho, a.epsilon) == ("gaussian", Fraction(1, 2), None)
    # A pure question of ε costs the survey ε²/2 ...
    assert (b.mechanism, b.epsilon, b.share) == ("geometric", Fraction(1, 2), Fraction(1, 8))
    # ... and one by weight gets the ε whose ε²/2 fits its share of ρ 3/8.
    assert c.share == Fraction(3, 8) and c.epsilon is not None
    assert c.epsilon**2 / 2 <= c.share and float(c.epsilon) == pytest.approx(0.75**0.5, abs=1e-8)


def test_a_gaussian_question_takes_no_epsilon() -> None:
    text = '[survey]\nrho = 1\n[[question]]\nid = "a"\nkind = "yes_no"\nmechanism = "gaussian"\n'
    with pytest.raises(SurveyError, match=r"<string>:7: .*gaussian question's budget is `rho`"):
        parse_survey(text + "epsilon = 0.5\n")


def test_errors_say_an_integer_question() -> None:
    with pytest.raises(SurveyError, match=r"\(for an integer question\)"):
        parse_survey(
            HEAD + '[[question]]\nid = "a"\nkind = "integer"\nmax = 5\noptions = ["x", "y"]\n'
        )
    with pytest.raises(SurveyError, match=r"\(for a choice question\)"):
        parse_survey(
            HEAD + '[[question]]\nid = "a"\nkind = "choice"\noptions = ["x", "y"]\nmax = 5\n'
        )


@pytest.mark.parametrize(
    ("setting", "line", "message"),
    [
        ('epsilon = "one"', 3, "survey `epsilon` must be a number: got 'one'"),
        ("epsilon = true", 3, "survey `epsilon` must be a number: got True"),
        ('epsilon = 1\n[[question]]\nid = "b"\nkind = "yes_no"\nepsilon = "one"', 7,
         "`epsilon` must be a number: got 'one'"),
        ('epsilon = 1\n[[question]]\nid = "b"\nkind = "yes_no"\nlocal_epsilon = "1/0"', 7,
         "`local_epsilon` must be a number in (0, 20]: got '1/0'"),
    ],
)  # fmt: skip
def test_a_non_number_budget_is_refused_in_our_words(setting: str, line: int, message: str) -> None:
    # `epsilon = "one"` was refused with Python's "Invalid literal for Fraction".
    text = f'[survey]\nname = "t"\n{setting}\n[[question]]\nid = "a"\nkind = "yes_no"\n'
    with pytest.raises(SurveyError) as info:
        parse_survey(text, "s.toml")
    said = str(info.value)
    assert said.startswith(f"s.toml:{line}: ") and said.endswith(message), said
    assert "Invalid literal" not in said and "Fraction" not in said
