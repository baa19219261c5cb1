"""Result and sweep plots (veil.render.plots), PNGs through matplotlib's Agg."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

from tests.support.images import png_size
from tests.support.results import RESULTS, first_row
from veil.local.demo import example_survey
from veil.render.plots import plot_results, plot_sweep
from veil.survey.plan import expected_errors


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
