"""Result tables and JSON (veil.render.text)."""

from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction

from tests.support.results import RESULTS, first_row, result
from veil.dp.accounting import Guarantee
from veil.render.text import demo_json, format_table
from veil.survey.results import Row


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
