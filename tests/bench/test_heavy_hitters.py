"""bench.heavy_hitters (scripts/hh_plan.py): the issue's case, computed as it says."""

from __future__ import annotations

from fractions import Fraction

from bench import heavy_hitters as hh
from veil.dp.accounting import Neighbouring
from veil.dp.heavy_hitters import HeavyHittersPlan, detection_floor, release_threshold
from veil.dp.mechanisms import DPConfig, NoiseMode


def test_zipf_counts_fill_the_respondents_not_given_once() -> None:
    counts = hh.zipf_counts(10_000)
    assert len(counts) == 50 and counts == sorted(counts, reverse=True)
    assert abs(sum(counts) - 9_500) <= 25  # rounding of 50 counts
    assert counts[0] == 2 * counts[1] or abs(counts[0] - 2 * counts[1]) <= 1
    assert hh.default_text_epsilon() == Fraction(2, 7)


def test_a_case_row_agrees_with_the_library() -> None:
    row = hh.case_row(DPConfig.geometric(1), Neighbouring.ADD_REMOVE, 10_000)
    plan = HeavyHittersPlan(DPConfig.geometric(1), 16, Neighbouring.ADD_REMOVE)
    t = release_threshold(plan)
    assert row.threshold == t and row.noise == "DLap(16)"
    assert row.floor_count == detection_floor(plan, t.value, 10_000).count
    assert row.recovered == sum(c >= row.floor_count for c in hh.zipf_counts(10_000))
    table = hh.format_case([row], 10_000)
    assert f"| {t.value} |" in table and "add_remove" in table


def test_least_epsilon_is_the_least_on_its_grid() -> None:
    share = Fraction(1, 20)
    relation, mode = Neighbouring.REPLACE_ONE, NoiseMode.INDEPENDENT
    eps = hh.least_epsilon_for_share(share, relation, mode, 10_000, step=Fraction(1, 10))

    def floor(e: Fraction) -> Fraction:
        plan = HeavyHittersPlan(DPConfig.geometric(e), 16, relation)
        return detection_floor(plan, release_threshold(plan).value, 10_000).share

    assert floor(eps) <= share < floor(eps - Fraction(1, 10))


def test_floor_table_marks_floors_beyond_the_respondents() -> None:
    rows = hh.floor_table([Fraction(2, 7)], [1_000, 100_000])
    text = hh.format_floor_table(rows, [1_000, 100_000])
    assert "none (floor > n)" in text and len(rows) == 4
