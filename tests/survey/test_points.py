"""Points questions (kind = "points", issue 42): a respondent splits at most
`total` points across the options, proved with Prio3L1BoundSum. The file's
settings and their errors, answers by label and their refusals, the public
description, the plan, the published rows and the privacy statement's note."""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.dp.estimates import Estimate, consistent_bounded_sum
from veil.dp.sensitivities import sensitivity
from veil.local.simulate import simulate_answer, truth
from veil.survey import AnswerError, Survey, SurveyError, parse_survey
from veil.survey.answers import parse_points
from veil.survey.description import load_description, public_description
from veil.survey.plan import plan_survey
from veil.survey.results import question_result
from veil.survey.statement import survey_statement
from veil.survey.tasks import task_specs

HEAD = """\
[survey]
name = "t"
epsilon = 1
opens = 2026-12-01T00:00:00Z
closes = 2026-12-15T00:00:00Z
"""
POINTS = """
[[question]]
id = "budget"
text = "Split 100 points across what we should improve"
kind = "points"
options = ["training", "tools", "travel"]
total = 100
"""


def _survey(body: str = POINTS, head: str = HEAD) -> Survey:
    return parse_survey(head + body, "s.toml")


def test_a_points_question_is_an_l1_bound_sum_task() -> None:
    survey = parse_survey(HEAD + POINTS)
    (q,) = survey.questions
    assert (q.kind, q.options, q.total) == ("points", ("training", "tools", "travel"), 100)
    assert q.vdaf_type == "l1boundsum"
    assert q.vdaf_params == {"length": 3, "max_value": 100, "chunk_length": 5}
    vdaf, dp, _ = task_specs(survey)["budget"]
    assert vdaf.type == "l1boundsum"
    assert dp.plan(vdaf).sensitivity == sensitivity("Prio3L1BoundSum", vdaf.params)
    # One respondent moves the options' totals by twice the total in all, however many
    # options there are; not by the total on every option.
    assert dp.plan(vdaf).sensitivity.l1 == 200
    q.vdaf()


@pytest.mark.parametrize(
    ("change", "line", "message"),
    [
        ('options = ["training", "tools", "travel"]', 11, "at least two names"),
        ("total = 100", 10, "needs `total`"),
        ("total = 0", 12, "`total` must be a positive integer, got 0"),
        ("total = -5", 12, "`total` must be a positive integer, got -5"),
        ("total = 1.5", 12, "`total` must be a positive integer, got 1.5"),
        ('total = "100"', 12, "`total` must be a positive integer, got '100'"),
        ("total = true", 12, "`total` must be a positive integer, got True"),
        ("total = 1000001", 12, "`total` = 1000001 does not fit: at most 1000000"),
        ("total = 100\nmax = 3", 13, "for a points question"),
        ("total = 100\nlocal_epsilon = 2", 13, "takes no `local_epsilon`"),
    ],
)
def test_bad_points_settings_name_the_line(change: str, line: int, message: str) -> None:
    body = POINTS
    if change.startswith("options"):
        body = body.replace(change, 'options = ["training"]')
    elif change == "total = 100":
        body = body.replace(change, "")
    else:
        body = body.replace("total = 100", change)
    with pytest.raises(SurveyError) as e:
        _survey(body)
    assert message in str(e.value)
    assert str(e.value).startswith(f"s.toml:{line}:")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("[]", "at least two names"),
        ('["a", "a"]', "must not repeat a name"),
        ('["a", ""]', "at least two names"),
        ('["a", 3]', "at least two names"),
        ('"a, b"', "at least two names"),
    ],
)
def test_bad_points_options_are_refused(options: str, message: str) -> None:
    body = POINTS.replace('["training", "tools", "travel"]', options)
    with pytest.raises(SurveyError, match=message):
        _survey(body)


def test_points_are_not_asked_under_add_remove() -> None:
    head = HEAD + 'neighbouring = "add_remove"\n'
    with pytest.raises(SurveyError, match='cannot be asked under neighbouring = "add_remove"'):
        _survey(head=head)


def test_the_total_must_fit_the_respondents_sums() -> None:
    # n · total must stay far below the field (Field128: 2^126 / max_respondents).
    head = HEAD + "max_respondents = 1000000000000\n"
    assert parse_survey(head + POINTS).questions[0].total == 100


def test_answers_by_label_list_or_text() -> None:
    (q,) = parse_survey(HEAD + POINTS).questions
    assert q.to_measurement({"training": 40, "tools": 60}) == [40, 60, 0]
    assert q.to_measurement({"travel": "7"}) == [0, 0, 7]
    assert q.to_measurement({}) == [0, 0, 0]  # nothing given: allowed, at most the total
    assert q.to_measurement([10, 20, 70]) == [10, 20, 70]
    assert q.to_measurement("training:40, tools:60") == [40, 60, 0]
    assert q.to_measurement("1:40,3:60") == [40, 0, 60]  # options by their number
    assert q.to_measurement("10, 20, 30") == [10, 20, 30]
    assert q.to_measurement({"training": 100}) == [100, 0, 0]


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ({"training": 40, "tools": 61}, "the points add up to 101, over the total of 100"),
        ("training:90,travel:90", "add up to 180, over the total of 100; take 80 off"),
        ([50, 50, 1], "add up to 101"),
        ({"gym": 10}, "'gym' is not one of the options"),
        ({"training": -1}, "is not an allowed answer"),
        ({"training": 101}, "is not an allowed answer"),
        ({"training": 1.5}, "is not an allowed answer"),
        ({"training": True}, "is not an allowed answer"),
        ({"training": "ten"}, "is not an allowed answer"),
        ([10, 20], "2 numbers for 3 options"),
        ("training:40,training:10", "'training' is given twice"),
        ("training:forty", "'training:forty' is not option:points"),
        ("training=40", "3 options"),
        (40, "not a mapping of options to points"),
        (None, "not a mapping of options to points"),
    ],
)
def test_bad_points_answers_are_refused(answer: object, message: str) -> None:
    (q,) = parse_survey(HEAD + POINTS).questions
    with pytest.raises(AnswerError) as e:
        q.to_measurement(answer)
    assert message in str(e.value)
    assert "'budget'" in str(e.value)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 100), min_size=3, max_size=3))
def test_every_split_in_any_form_is_taken_or_refused_by_its_sum(points: list[int]) -> None:
    (q,) = parse_survey(HEAD + POINTS).questions
    forms = [
        dict(zip(q.options, points, strict=True)),
        points,
        ", ".join(f"{o}:{p}" for o, p in zip(q.options, points, strict=True)),
        ",".join(map(str, points)),
    ]
    for form in forms:
        if sum(points) <= 100:
            assert q.to_measurement(form) == points
        else:
            with pytest.raises(AnswerError, match=f"add up to {sum(points)}"):
                q.to_measurement(form)


def test_option_names_may_hold_a_colon() -> None:
    options = ["a:b", "c"]
    assert parse_points("a:b:3, c:4", options) == {"a:b": 3, "c": 4}
    with pytest.raises(ValueError, match="given twice"):
        parse_points("c:1, 2:1", options)


def test_the_public_description_carries_options_and_total(tmp_path: Path) -> None:
    survey = parse_survey(HEAD + POINTS)
    doc = public_description(survey, {"budget": "id"})
    assert doc["questions"][0]["options"] == ["training", "tools", "travel"]
    assert doc["questions"][0]["total"] == 100
    root = tmp_path
    (root / "survey.json").write_text(json.dumps(doc))
    (q,) = load_description(root).survey.questions
    assert (q.kind, q.options, q.total) == ("points", ("training", "tools", "travel"), 100)
    for bad, message in [
        ({"total": 0}, "`total` must be at least 1"),
        ({"total": "100"}, "`total` is missing or not a int"),
        ({"options": ["a", "a"]}, "must not repeat a name"),
    ]:
        entry = {**doc["questions"][0], **bad}
        (root / "survey.json").write_text(json.dumps({**doc, "questions": [entry]}))
        with pytest.raises(SurveyError, match=message):
            load_description(root)


def test_the_plan_gives_each_options_mean_points() -> None:
    survey = parse_survey(HEAD + POINTS)
    (p,) = plan_survey(survey, 1000)
    assert p.unit == "mean points (0 to 100)"
    assert p.range_high == 100
    assert 0 < p.median < p.p90 < p.half_width < p.target == 10
    assert p.needed is not None and p.needed <= 1000 and p.reaches_target
    # Ten times the respondents: a tenth of the half-width (noise over n).
    (big,) = plan_survey(survey, 10_000)
    assert big.half_width == pytest.approx(p.half_width / 10, rel=1e-3)
    (small,) = plan_survey(survey, p.needed - 1)
    assert small.half_width >= small.target


def _collected(estimates: list[Fraction], n: int, c: Fraction) -> Any:
    """What a collection of simultaneous intervals of half-width c gives."""
    return SimpleNamespace(
        report_count=n,
        estimate=estimates,
        lower=[e - c for e in estimates],
        upper=[e + c for e in estimates],
        confidence=0.95,
        intervals="simultaneous",
        against_collector=survey_statement(parse_survey(HEAD + POINTS)).against_collector,
    )


def test_published_rows_are_mean_points_adding_up_to_at_most_the_total() -> None:
    (q,) = parse_survey(HEAD + POINTS).questions
    # Noise pushed the sums over n · total (10 · 100) and one below zero.
    r = question_result(
        q, _collected([Fraction(700), Fraction(500), Fraction(-30)], 10, Fraction(60))
    )
    assert r.unit == "mean points (0 to 100)"
    assert [row.label for row in r.rows] == ["training", "tools", "travel"]
    assert sum(row.estimate for row in r.rows) == pytest.approx(100)
    assert all(row.estimate >= 0 for row in r.rows)
    assert [row.raw_estimate for row in r.rows] == [70, 50, -3]
    for row in r.rows:
        assert 0 <= row.ci_low <= row.estimate <= row.ci_high <= 100
    # Within the total: only clamped at zero.
    r = question_result(
        q, _collected([Fraction(300), Fraction(200), Fraction(-5)], 10, Fraction(20))
    )
    assert [row.estimate for row in r.rows] == [30, 20, 0]


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 50),
    st.integers(1, 20),
    st.lists(st.integers(0, 20), min_size=2, max_size=6),
    st.integers(0, 40),
    st.randoms(use_true_random=False),
)
def test_the_projection_keeps_the_truth_covered(
    n: int, total: int, weights: list[int], c: int, rng: random.Random
) -> None:
    """Sums of n splits of at most `total`, raw estimates within c of them (all
    intervals hold): the projected values are non-negative, add up to at most
    n · total, and lie in their intervals, which still hold the truth."""
    whole = sum(weights) or 1
    truth_sums = [n * total * w // whole for w in weights]
    raw = [Fraction(t + rng.randint(-c, c)) for t in truth_sums]
    est = [Estimate(v, v - c, v + c, 0.95, 0.95) for v in raw]
    out = consistent_bounded_sum(est, n * total)
    assert all(e.value >= 0 for e in out)
    assert sum(e.value for e in out) <= n * total
    for e, t, r in zip(out, truth_sums, raw, strict=True):
        assert e.low <= e.value <= e.high
        assert e.low <= t <= e.high
        assert r - c <= e.value <= r + c or e.value == 0


def test_the_statement_says_how_far_one_respondent_moves_the_totals() -> None:
    notes = survey_statement(parse_survey(HEAD + POINTS)).notes
    (note,) = [n for n in notes if n.startswith("Points question")]
    assert "at most 100 points" in note
    assert "L1 = 200" in note and "L2² = 20000" in note


def test_simulated_splits_stay_within_the_total() -> None:
    (q,) = parse_survey(HEAD + POINTS).questions
    rng = random.Random(7)
    answers = [{"budget": simulate_answer(q, rng)} for _ in range(500)]
    for a in answers:
        assert set(a["budget"]) == set(q.options)
        assert sum(a["budget"].values()) <= 100
        q.to_measurement(a["budget"])
    sums = truth(q, answers)
    assert isinstance(sums, list) and len(sums) == 3
    assert sums[0] > sums[2] > 0  # the first options are favoured
    assert sum(sums) <= 500 * 100
