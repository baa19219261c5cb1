"""A breakdown reconciled with its questions (veil.dp.reconcile): the tables add
up, no reconciled estimate is less precise than its sources, the stated
variances are the estimator's own, and a weighted sum of noises gets its exact
interval (the coverage study's quick version is tests/bench/test_reconcile.py)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize

from veil.dp import DiscreteGaussian, DiscreteLaplace, InvalidParameter, TotalNoise
from veil.dp.reconcile import (
    Block,
    Crossing,
    Margin,
    ReconcilePlan,
    _transport,
    breakdown_plan,
    joint_plan,
    same_respondents,
)


def _laplace(scale: int | Fraction, parts: int = 2) -> TotalNoise:
    return TotalNoise((DiscreteLaplace(scale),) * parts)


def _gaussian(sigma2: int | Fraction) -> TotalNoise:
    return TotalNoise((DiscreteGaussian.from_sigma_squared(sigma2),) * 2)


# --------------------------------------------------------------------------- breakdowns

KIND_SHAPES = {
    "yes_no": (2, 1),
    "choice": (None, 1),
    "multi_choice": (None, 1),
    "integer": (1, None),
    "points": (None, None),
}


@st.composite
def breakdowns(draw: st.DrawFn) -> tuple:  # type: ignore[type-arg]
    """A breakdown of any kind, its releases' noise and released values."""
    kind = draw(st.sampled_from(sorted(KIND_SHAPES)))
    group_kind = draw(st.sampled_from(["yes_no", "choice"]))
    fixed_m, fixed_top = KIND_SHAPES[kind]
    m = fixed_m or draw(st.integers(2, 5))
    k = 2 if group_kind == "yes_no" else draw(st.integers(2, 5))
    top = fixed_top or draw(st.integers(1, 20))
    n = draw(st.integers(0, 300))

    def noise() -> TotalNoise:
        if draw(st.booleans()):
            return _laplace(Fraction(draw(st.integers(1, 400)), 10), draw(st.integers(1, 2)))
        return _gaussian(Fraction(draw(st.integers(1, 4000)), 10))

    breakdown = noise()
    question = noise() if draw(st.booleans()) else None
    group = noise() if draw(st.booleans()) else None
    plan = breakdown_plan(kind, m, group_kind, k, n, top, breakdown, question, group)
    spread = draw(st.integers(0, 200))
    values = np.array(draw(st.lists(st.integers(-spread, n * top + spread), min_size=k * m,
                                    max_size=k * m)))  # fmt: skip
    margins = [
        np.array(draw(st.lists(st.integers(-spread, n * top + spread), min_size=r, max_size=r)))
        for r in (margin.design.shape[0] for margin in plan.margins)
    ]
    return plan, values, margins, kind, n, top, m


@settings(max_examples=150, deadline=None)
@given(breakdowns())
def test_the_published_tables_add_up(case: tuple) -> None:  # type: ignore[type-arg]
    plan, values, margins, kind, n, top, m = case
    result = plan.apply(values, margins)
    cells = np.array([float(e.value) for e in result.cells])
    shown = [e.value for e in result.shown_cells]
    for margin, rec, published in zip(
        plan.margins, result.margins, result.shown_margins, strict=True
    ):
        # Published totals are the sums of the published cells, exactly.
        for row, est in zip(margin.design, published, strict=True):
            assert est.value == sum(
                (Fraction(w) * v for w, v in zip(row, shown, strict=True) if w), Fraction(0)
            )
            assert 0 <= est.value <= margin.high and est.low <= est.value <= est.high
        for row, est in zip(margin.design, rec, strict=True):
            assert float(est.value) == pytest.approx(float(row @ cells), abs=1e-6 * (1 + n * top))
    assert all(v >= 0 for v in shown)
    assert all(e.low <= e.value <= e.high for e in result.shown_cells)
    if kind in ("yes_no", "choice"):
        assert sum(shown) == n  # the cells are the n respondents
        assert sum(float(e.value) for e in result.cells) == pytest.approx(n, abs=1e-6 * (1 + n))
    elif kind == "multi_choice":
        columns = np.array(shown, dtype=object).reshape(-1, m).sum(axis=0)
        assert all(c <= n for c in columns)
    else:
        assert sum(shown) <= n * top
    if kind in ("multi_choice", "integer") and plan.margins:
        # Its margin is published as its reconciled value cut to its range.
        for rec, published in zip(result.margins[0], result.shown_margins[0], strict=True):
            cut = min(max(float(rec.value), 0.0), n * top)
            assert float(published.value) == pytest.approx(cut, abs=1e-6 * (1 + n * top))


@settings(max_examples=150, deadline=None)
@given(breakdowns())
def test_no_reconciled_estimate_is_less_precise_than_its_sources(case: tuple) -> None:  # type: ignore[type-arg]
    plan = case[0]
    raw = plan.raw_cell_variances()
    assert np.all(plan.cell_variances() <= raw * (1 + 1e-9))
    for i in range(len(plan.margins)):
        assert np.all(plan.margin_variances(i) <= plan.raw_margin_variances(i) * (1 + 1e-9))
    if plan.margins:
        # With a margin to learn from, every cell gains.
        assert np.all(plan.cell_variances() < raw)


@settings(max_examples=60, deadline=None)
@given(breakdowns())
def test_the_stated_variance_is_the_estimators_own(case: tuple) -> None:  # type: ignore[type-arg]
    """The estimate is affine in the released values: its weights, read off by
    moving one released value at a time, give Σ v_r·w² = the stated variance."""
    plan, values, margins, *_ = case
    base = plan.apply(values, margins)
    variances = [plan.noise.variance(), *(m.noise.variance() for m in plan.margins)]
    released = [values.astype(float), *(m.astype(float) for m in margins)]
    total = np.zeros(plan.size + sum(m.design.shape[0] for m in plan.margins))

    def outputs(result):  # type: ignore[no-untyped-def]
        return np.array(
            [float(e.value) for e in (*result.cells, *(e for ms in result.margins for e in ms))]
        )

    at_base = outputs(base)
    for r, values_r in enumerate(released):
        for i in range(values_r.size):
            moved = [v.copy() for v in released]
            moved[r][i] += 1.0
            weight = outputs(plan.apply(moved[0], moved[1:])) - at_base
            total += variances[r] * weight**2
    stated = np.concatenate(
        [plan.cell_variances(), *(plan.margin_variances(i) for i in range(len(plan.margins)))]
    )
    # The gain is an inverse computed in floats, so its error is bounded
    # norm-wise (relative to its largest entries, not to each one) and grows
    # with its condition number: releases whose variances differ by 4e7 (a
    # noiseless-looking margin beside noisy cells) gave 1.2e-6 relative on a
    # cell at a condition number of 7.8e7, about 70 epsilons times it.
    rel = 1e-6 + 1e3 * np.finfo(float).eps * np.linalg.cond(plan._gain)
    assert np.abs(total - stated).max() <= rel * np.abs(stated).max() + 1e-9, (total, stated)


def test_simultaneous_intervals_are_bonferronis() -> None:
    args = ("choice", 3, "choice", 2, 50, 1, _laplace(2), _laplace(3), _gaussian(5))
    each = breakdown_plan(*args, 0.9)
    together = breakdown_plan(*args, 0.9, simultaneous=True)
    values, margins = [5, 10, 10, 5, 10, 10], [[10, 20, 20], [25, 25]]
    one, six = each.apply(values, margins), together.apply(values, margins)
    for a, b in zip(one.cells, six.cells, strict=True):
        assert b.high - b.value > a.high - a.value
        assert b.coverage >= 1 - 0.1 / 6 > a.coverage >= 0.9
    assert six.margins[0][0].coverage >= 1 - 0.1 / 3 and six.margins[1][0].coverage >= 1 - 0.05


def test_consistent_releases_without_noise_come_back_unchanged() -> None:
    truth = np.array([[3, 1, 0], [2, 2, 4]])
    plan = breakdown_plan("choice", 3, "choice", 2, 12, 1, _laplace(2), _laplace(3), _gaussian(5))
    result = plan.apply(truth.reshape(-1), [truth.sum(axis=0), truth.sum(axis=1)])
    assert [float(e.value) for e in result.cells] == pytest.approx(truth.reshape(-1).tolist())
    assert [e.value for e in result.shown_cells] == [
        pytest.approx(v, abs=1e-9) for v in truth.reshape(-1).tolist()
    ]


def test_an_exact_release_is_a_fact() -> None:
    """A question released without noise (mechanism none) fixes its margins; one
    that contradicts an exact breakdown means other respondents, and is refused."""
    plan = breakdown_plan("integer", 1, "choice", 3, 10, 5, _laplace(4), TotalNoise(()), None)
    result = plan.apply([10, 3, 20], [[30]])
    assert float(result.margins[0][0].value) == pytest.approx(30)
    assert plan.margin_variances(0) == pytest.approx([0.0], abs=1e-9)
    assert sum(float(e.value) for e in result.cells) == pytest.approx(30)
    exact = breakdown_plan("integer", 1, "choice", 3, 10, 5, TotalNoise(()), TotalNoise(()), None)
    assert [float(e.value) for e in exact.apply([10, 3, 20], [[33]]).cells] == pytest.approx(
        [10, 3, 20]
    )
    with pytest.raises(InvalidParameter, match="contradict"):
        exact.apply([10, 3, 20], [[34]])


def test_same_respondents_is_equal_counts() -> None:
    assert same_respondents(120, 120) and not same_respondents(118, 120)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("text", 2, "choice", 2, 10, 1), "no breakdown"),
        (("choice", 2, "integer", 2, 10, 1), "yes_no or choice"),
        (("yes_no", 3, "choice", 2, 10, 1), "two cells"),
        (("choice", 3, "yes_no", 4, 10, 1), "two cells"),
        (("integer", 2, "choice", 2, 10, 5), "one cell per group"),
        (("choice", 3, "choice", 2, 10, 2), "top is 1"),
        (("choice", 0, "choice", 2, 10, 1), "categories"),
        (("choice", 3, "choice", True, 10, 1), "groups"),
        (("choice", 3, "choice", 2, -1, 1), "report_count"),
        (("points", 3, "choice", 2, 10, 0), "top"),
    ],
)
def test_malformed_breakdowns_are_refused(args: tuple, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidParameter, match=match):
        breakdown_plan(*args, _laplace(2), _laplace(2), _laplace(2))


def test_malformed_releases_are_refused() -> None:
    plan = breakdown_plan("choice", 3, "choice", 2, 10, 1, _laplace(2), _laplace(2), _laplace(2))
    good = ([1, 2, 3, 1, 2, 1], [[2, 4, 4], [6, 4]])
    plan.apply(*good)
    for cells, margins, match in [
        ([1, 2, 3, 1, 2], good[1], "shape"),
        ([[1, 2, 3], [1, 2, 1]], good[1], "shape"),
        ([1, 2, 3, 1, 2, math.nan], good[1], "not finite"),
        ([1, 2, 3, 1, 2, math.inf], good[1], "not finite"),
        (good[0], [[2, 4, 4]], "margins given"),
        (good[0], [[2, 4, 4], [6, 4, 0]], "shape"),
        (good[0], [[2, 4, 4], [6, -math.inf]], "not finite"),
    ]:
        with pytest.raises(InvalidParameter, match=match):
            plan.apply(cells, margins)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter, match="columns"):
        ReconcilePlan(3, _laplace(2), [Margin(np.ones((1, 4)), _laplace(2), 3)], [])
    with pytest.raises(InvalidParameter, match="outside"):
        ReconcilePlan(3, _laplace(2), [], [Block((0, 3), 5)])
    with pytest.raises(InvalidParameter, match="partition"):
        Block((0, 1, 2), 5, parts=((0,), (1,)))
    with pytest.raises(InvalidParameter, match="finite matrix"):
        Margin(np.array([[1.0, math.nan]]), _laplace(2), 3)
    with pytest.raises(InvalidParameter, match="confidence"):
        ReconcilePlan(3, _laplace(2), [], [], confidence=1.0)
    with pytest.raises(InvalidParameter, match="at least one cell"):
        ReconcilePlan(0, _laplace(2), [], [])


# --------------------------------------------------------------------------- joint plans


@st.composite
def joint_breakdowns(draw: st.DrawFn) -> tuple:  # type: ignore[type-arg]
    """Two or three breakdowns over a few questions, sharing some: a question by
    two groups, two questions by one group, a group that is another's question."""
    n = draw(st.integers(0, 200))
    questions = {"a": ("yes_no", 2), "b": ("choice", draw(st.integers(2, 4))),
                 "c": ("choice", draw(st.integers(2, 3))), "d": ("integer", 1),
                 "e": ("multi_choice", 3)}  # fmt: skip
    pairs = draw(st.lists(st.sampled_from([
        ("a", "b"), ("a", "c"), ("b", "c"), ("c", "b"), ("b", "a"), ("d", "b"), ("d", "a"),
        ("e", "c"),
    ]), min_size=2, max_size=3))  # fmt: skip

    def noise() -> TotalNoise:
        if draw(st.booleans()):
            return _laplace(Fraction(draw(st.integers(1, 400)), 10), draw(st.integers(1, 2)))
        return _gaussian(Fraction(draw(st.integers(1, 4000)), 10))

    crossings = []
    for q, g in pairs:
        kind, m = questions[q]
        top = 7 if kind == "integer" else 1
        crossings.append(Crossing(q, kind, m, g, questions[g][0], questions[g][1], n, top, noise()))
    releases = {q: noise() for q in questions if draw(st.booleans()) or q == pairs[0][0]}
    plan = joint_plan(crossings, releases)
    spread = draw(st.integers(0, 100))
    high = n * 7

    def values(size: int) -> np.ndarray:  # type: ignore[type-arg]
        return np.array(draw(st.lists(st.integers(-spread, high + spread), min_size=size,
                                      max_size=size)))  # fmt: skip

    margins = [values(m.design.shape[0]) for m in plan.margins]
    return plan, values(plan.size), margins, crossings, n


@settings(max_examples=120, deadline=None)
@given(joint_breakdowns())
def test_joint_tables_add_up_in_every_breakdown(case: tuple) -> None:  # type: ignore[type-arg]
    """Every published total equals the sum of every breakdown's published cells
    that measure it; each breakdown's cells are possible."""
    plan, values, margins, crossings, n = case
    result = plan.apply(values, margins)
    shown = np.array([float(e.value) for e in result.shown_cells])
    assert np.all(shown >= 0)
    for margin, published in zip(plan.margins, result.shown_margins, strict=True):
        totals = np.array([float(e.value) for e in published])
        for design in (margin.design, *margin.others):
            assert design @ shown == pytest.approx(totals, abs=1e-9 * (1 + n * 7))
        rec = np.array([float(e.value) for e in result.cells])
        for design in margin.others:  # tied before the cut too
            assert design @ rec == pytest.approx(margin.design @ rec, abs=1e-6 * (1 + n * 7))
    for c, piece in zip(crossings, plan.pieces, strict=True):
        if c.histogram:
            assert shown[list(piece)].sum() == pytest.approx(n, abs=1e-9 * (1 + n))


@settings(max_examples=120, deadline=None)
@given(joint_breakdowns())
def test_joint_estimates_are_at_least_as_precise_as_any_source(case: tuple) -> None:  # type: ignore[type-arg]
    plan = case[0]
    assert np.all(plan.cell_variances() <= plan.raw_cell_variances() * (1 + 1e-9))
    for i, m in enumerate(plan.margins):
        smallest = plan.raw_margin_variances(i)
        assert np.all(plan.margin_variances(i) <= smallest * (1 + 1e-9) + 1e-9)
        for design in (m.design, *m.others):  # every breakdown's sum is a source
            assert np.all(smallest <= (design**2) @ plan.raw_cell_variances() * (1 + 1e-12))


def test_a_question_two_breakdowns_measure_gains_from_both() -> None:
    """remote by team and remote by office: remote's reconciled total is more
    precise than from either breakdown with remote alone, and each breakdown's
    cells gain from the other's."""
    args = ("yes_no", 2, "choice", 3, 100, 1)
    alone = breakdown_plan(*args, _laplace(3), _laplace(3), _laplace(3))
    by_team = Crossing("remote", "yes_no", 2, "team", "choice", 3, 100, 1, _laplace(3))
    by_office = Crossing("remote", "yes_no", 2, "office", "choice", 2, 100, 1, _laplace(3))
    joint = joint_plan([by_team, by_office], dict.fromkeys(("remote", "team", "office"),
                                                           _laplace(3)))  # fmt: skip
    assert [m.name for m in joint.margins] == ["remote", "team", "office"]
    assert joint.margin_variances(0)[0] < alone.margin_variances(0)[0]
    assert np.all(joint.cell_variances()[:6] < alone.cell_variances())
    assert joint.pieces == (tuple(range(6)), tuple(range(6, 10)))


def test_transport_meets_both_sets_of_totals() -> None:
    """The cut of a cross-tied histogram: non-negative, its rows and columns the
    given totals, and the closest such point."""
    values = [Fraction(v) for v in (-3, 5, 2, 8, -1, 4)]
    rows, columns = ((0, 1, 2), (3, 4, 5)), ((0, 3), (1, 4), (2, 5))
    out = _transport(values, rows, columns, [Fraction(6), Fraction(9)],
                     [Fraction(5), Fraction(3), Fraction(7)])  # fmt: skip
    x = np.array([float(out[j]) for j in range(6)])
    assert np.all(x >= 0)
    assert x.reshape(2, 3).sum(axis=1) == pytest.approx([6, 9], abs=1e-9)
    assert x.reshape(2, 3).sum(axis=0) == pytest.approx([5, 3, 7], abs=1e-9)
    # The closest such point: no better one found by a general solver (the last
    # column's total follows from the others').
    target = np.array([float(v) for v in values])
    best = optimize.minimize(
        lambda y: float(np.sum((y - target) ** 2)),
        np.full(6, 2.5),
        constraints=[{"type": "eq", "fun": lambda y: np.concatenate(
            [y.reshape(2, 3).sum(axis=1) - [6, 9], y.reshape(2, 3).sum(axis=0)[:2] - [5, 3]])}],
        bounds=[(0, None)] * 6,
        method="SLSQP",
        options={"ftol": 1e-12},
    )  # fmt: skip
    assert best.success
    assert np.sum((x - target) ** 2) <= best.fun + 1e-6
    assert x == pytest.approx(best.x, abs=1e-4)


def test_malformed_joint_plans_are_refused() -> None:
    one = Crossing("q", "choice", 3, "g", "choice", 2, 10, 1, _laplace(2))
    with pytest.raises(InvalidParameter, match="by itself"):
        Crossing("q", "choice", 3, "q", "choice", 3, 10, 1, _laplace(2))
    with pytest.raises(InvalidParameter, match="one breakdown or more"):
        joint_plan([], {})
    other = Crossing("q", "choice", 3, "h", "yes_no", 2, 11, 1, _laplace(2))
    with pytest.raises(InvalidParameter, match="different report counts"):
        joint_plan([one, other], {"q": _laplace(2)})
    # Without the shared release, they are apart: nothing ties them.
    assert not joint_plan([one, other], {}).margins
    with pytest.raises(InvalidParameter, match="partition the cells"):
        ReconcilePlan(3, [((0, 1), _laplace(2))], [], [])
    with pytest.raises(InvalidParameter, match="link differ"):
        ReconcilePlan(4, _laplace(2), [], [Block((0, 1), 5, True, ((0,), (1,)), "x"),
                                            Block((2, 3), 6, True, ((2,), (3,)), "x")])  # fmt: skip
    with pytest.raises(InvalidParameter, match="linked block has parts"):
        Block((0, 1), 5, link="x")
    with pytest.raises(InvalidParameter, match="cross partition"):
        Block((0, 1), 5, False, ((0, 1),), cross=((0,), (1,)))
    with pytest.raises(InvalidParameter, match="one shape"):
        Margin(np.ones((1, 4)), _laplace(2), 3, "x", (np.ones((2, 4)),))
    with pytest.raises(InvalidParameter, match="tie"):
        ReconcilePlan(2, _laplace(2), [], [], ties=[[1.0, math.inf]])
