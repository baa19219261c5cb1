"""Survey results made by hand for the rendering tests: a yes/no and a
choice question with their estimates, intervals and true values."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from veil.dp.accounting import Guarantee
from veil.survey import parse_survey
from veil.survey.results import QuestionResult, Row

SURVEY = parse_survey(
    """
[survey]
name = "Report"
epsilon = 2

[[question]]
id = "remote"
kind = "yes_no"

[[question]]
id = "team"
kind = "choice"
options = ["eng", "sales", "other"]

[[question]]
id = "commute"
kind = "integer"
max = 180
"""
)


def result(qid: str, *rows: Row, epsilon: Fraction = Fraction(1, 2)) -> QuestionResult:
    unit = "mean answer (0 to 180)" if qid == "commute" else "respondents"
    q = SURVEY.question(qid)
    return QuestionResult(q, 1000, Guarantee.pure(epsilon), rows, unit, 0.95)


RESULTS = [
    result("remote", Row("yes", 351.0, 340.0, 362.0, truth=357)),
    result(
        "team",
        Row("eng", 388.0, 370.0, 406.0, truth=391),
        Row("sales", 223.5, 205.0, 242.0, truth=220),
        Row("other", 390.0, 372.0, 408.0, truth=389),
    ),
]


def first_row(r: QuestionResult, **changes: float) -> QuestionResult:
    """`r` with its first row changed."""
    return replace(r, rows=(replace(r.rows[0], **changes), *r.rows[1:]))
