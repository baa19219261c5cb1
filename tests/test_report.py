"""Result tables, JSON and plots."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

from veil.dp.accounting import Guarantee
from veil.local.demo import example_survey
from veil.render.plots import plot_results, plot_sweep
from veil.render.text import demo_json, format_table
from veil.survey import parse_survey
from veil.survey.plan import expected_errors
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


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_table_lists_every_row() -> None:
    table = format_table(RESULTS)
    lines = table.splitlines()
    assert lines[0].split()[:5] == ["question", "answer", "truth", "estimate", "95%"]
    assert "remote" in lines[2] and "357" in lines[2] and "[340, 362]" in lines[2]
    assert any(line.split()[0] == "sales" for line in lines[3:])
    # Header, rule, three results' rows, and the line saying which intervals these are.
    assert len(lines) == 2 + 1 + 3 + 1
    assert lines[-1] == "95% CI: each row on its own"
    simultaneous = [replace(r, intervals="simultaneous (exact max-of-k)") for r in RESULTS]
    assert format_table(simultaneous).splitlines()[-1] == (
        "95% CI: simultaneous (exact max-of-k): all rows of a question at once"
    )


def test_table_names_what_a_single_number_is() -> None:
    # A yes/no question's number counts the yeses, an integer's is the mean
    # (the labels of results.csv); the answer column was empty for both.
    mean = result(
        "commute", Row("mean", 71.5, 71.4, 71.7, truth=71.6), Row("sum", 71500, 71400, 71700)
    )
    lines = format_table([RESULTS[0], mean]).splitlines()
    assert lines[2].split()[:2] == ["remote", "yes"]
    assert lines[3].split()[:2] == ["commute", "mean"]
    # The integer's sum row (results.json has it) reads as the mean alone here.
    assert len(lines) == 4 and mean.shown == mean.rows[:1]


def test_table_says_why_an_interval_reaches_below_zero() -> None:
    below = [first_row(RESULTS[0], ci_low=-3.0)]
    assert "may reach below 0: the noise is symmetric" in format_table(below)
    assert "below 0" not in format_table(RESULTS)
    third = replace(RESULTS[0], guarantee=Guarantee.pure(Fraction(1, 3)))
    assert "ε=0.333 " in format_table([third]) + " "


def test_table_says_why_an_estimate_lies_outside_its_interval() -> None:
    # A local layer's de-biased estimate can be negative while its interval is
    # cut at 0 (seen in `veil simulate --local-epsilon 2`: -108.15 in [0, 765]).
    outside = [first_row(RESULTS[0], estimate=-108.15, ci_low=0.0, ci_high=765.0)]
    assert "may lie outside its interval" in format_table(outside)
    assert "outside" not in format_table(RESULTS)


def test_json_has_documented_keys() -> None:
    data = json.loads(demo_json(RESULTS))
    assert [set(d) for d in data] == [
        {
            "question", "kind", "truth", "estimate", "ci_low", "ci_high", "intervals",
            "epsilon", "labels", "indicative_only",
        }
    ] * 2  # fmt: skip
    assert data[1]["estimate"] == [388.0, 223.5, 390.0]
    assert data[0]["truth"] == 357 and data[1]["truth"] == [391, 220, 389]
    # Which number is which option.
    assert data[1]["labels"] == ["eng", "sales", "other"]
    assert data[0]["labels"] == "yes"


def test_plots_are_pngs_of_expected_size(tmp_path: Path) -> None:
    out = tmp_path / "results.png"
    plot_results(RESULTS, out)
    assert png_size(out) == (1200, 400)
    sweep = tmp_path / "sweep.png"
    survey = example_survey()
    errors = expected_errors(survey, 1000, [Fraction(1, 2), Fraction(1), Fraction(4)])
    plot_sweep(errors, 1000, sweep)
    assert png_size(sweep) == (900, 550)


def test_plot_draws_an_estimate_outside_its_interval(tmp_path: Path) -> None:
    # `veil simulate --local-epsilon 2 --plot` failed with a traceback when a
    # de-biased estimate lay below its interval, cut at 0 (negative yerr).
    outside = [first_row(RESULTS[0], estimate=-108.15, ci_low=0.0, ci_high=765.0)]
    out = tmp_path / "outside.png"
    plot_results(outside, out)
    assert png_size(out) == (1200, 400)


def test_expected_error_is_exact_relative_and_falls_with_epsilon() -> None:
    survey = example_survey()
    errors = expected_errors(survey, 1000, [Fraction(1, 2), Fraction(2)])
    by = {(e.question, e.epsilon): e for e in errors}
    for q in survey.questions:
        low, high = by[(q.id, 0.5)], by[(q.id, 2.0)]
        # Four times the ε, about a quarter of the error (the geometric noise's
        # scale is 1/ε); the band lies above the median.
        assert 0 < high.median < low.median and high.median <= low.median / 2
        assert low.median <= low.p90
    # The same inputs give the same figures: nothing random in them.
    assert errors == expected_errors(survey, 1000, [Fraction(1, 2), Fraction(2)])
    remote = by[("remote", 2.0)]
    assert remote.unit == "share of respondents" and remote.median < 0.05
    assert by[("commute", 2.0)].unit == "share of the range 0..180"
