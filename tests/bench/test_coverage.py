"""The coverage measurement (bench.coverage) on a few small points: the shown
intervals cover at least at their level, up to sampling error, and never less
often than the raw ones they are cut from."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
from scipy import stats

from bench.coverage import answers, coverage, coverage_survey, format_coverage
from tests.support.modes import LONG

RUNS = 3000 if LONG else 250


@pytest.mark.parametrize("neighbouring", ["replace_one", "add_remove"])
def test_shown_intervals_cover_at_seven_respondents(neighbouring: str) -> None:
    survey = coverage_survey(Fraction(1, 4), neighbouring)
    rng = random.Random(f"coverage-{neighbouring}")
    points = [coverage(survey, q, 7, case, RUNS, rng) for q in survey.questions
              for case in ("edge", "spread")]  # fmt: skip
    print(format_coverage(points))
    for p in points:
        assert p.runs == RUNS and p.nominal == 0.95
        # At least the nominal level, up to sampling error (one-sided, α = 1e-3).
        held = round(p.shown * RUNS)
        assert stats.binomtest(held, RUNS, 0.95, alternative="less").pvalue > 1e-3, p
        if p.raw is not None:
            assert p.shown >= p.raw and p.width is not None and p.width <= 1


def test_answers_are_valid_and_placed_as_named() -> None:
    survey = coverage_survey(Fraction(1, 4))
    for q in survey.questions:
        for case in ("edge", "spread"):
            given = answers(q, 9, case)
            assert len(given) == 9
            for a in given:
                q.to_measurement(a)  # raises on an answer the question refuses
    assert answers(survey.question("yes_no"), 4, "edge") == [False] * 4
