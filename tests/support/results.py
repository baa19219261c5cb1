"""Survey results made by hand for the rendering and results tests: a yes/no
and a choice question with their estimates, intervals and true values; and
the "Seven" survey, collected with noise far wider than its seven answers."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from veil.collector import CollectionResult
from veil.dp.accounting import Guarantee
from veil.survey import parse_survey
from veil.survey.results import QuestionResult, Row, question_result

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


# A survey of seven respondents, collected with wide noise: the published
# rows must stay within what seven answers make possible.
SEVEN_SURVEY = """
[survey]
name = "Seven"
epsilon = 1.25
min_batch_size = 5
opens = 2026-12-01T00:00:00Z
closes = 2026-12-02T00:00:00Z

[[question]]
id = "remote"
text = "Do you work remotely?"
kind = "yes_no"

[[question]]
id = "commute"
text = "Minutes of commute (0-120)?"
kind = "integer"
max = 120

[[question]]
id = "team"
text = "Which team?"
kind = "choice"
options = ["engineering", "design", "sales"]

[[question]]
id = "tools"
text = "Which tools?"
kind = "multi_choice"
options = ["email", "chat", "wiki"]
max_choices = 2

[[question]]
id = "ratings"
text = "Rate workload and pay (0-10)."
kind = "vector"
length = 2
max = 10
labels = ["workload", "pay"]
"""


def collected(values: list[int], half_width: int, n: int = 7) -> CollectionResult:
    return CollectionResult(
        start=0, duration=3600, report_count=n,
        estimate=[Fraction(v) for v in values] if len(values) > 1 else Fraction(values[0]),
        lower=[Fraction(v - half_width) for v in values] if len(values) > 1
        else Fraction(values[0] - half_width),
        upper=[Fraction(v + half_width) for v in values] if len(values) > 1
        else Fraction(values[0] + half_width),
        confidence=0.95, intervals="simultaneous (exact max-of-k)", spent=Fraction(1, 4),
        unit="epsilon", against_collector=Guarantee.pure(Fraction(1, 4)),
        mechanism="geometric", noisy_aggregate=values, seconds=0.0,
    )  # fmt: skip


# What the issue saw at 7 respondents and ε = 0.25 per question: "yes 25" of 7,
# negative options, a mean commute of -115 minutes, a pay rating of -60.7.
SEVEN = {
    "remote": collected([25], 16),
    "commute": collected([-805], 1930),
    "team": collected([-9, 4, 19], 22),
    "tools": collected([-12, 30, 3], 20),
    "ratings": collected([41, -425], 160),
}


def seven() -> list[QuestionResult]:
    survey = parse_survey(SEVEN_SURVEY)
    return [question_result(q, SEVEN[q.id]) for q in survey.questions]
