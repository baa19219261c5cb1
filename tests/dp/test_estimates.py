"""Collector estimates, confidence intervals and post-processing (veil.dp.estimates)."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from tests.support.modes import LONG
from veil.dp import (
    DPConfig,
    Estimate,
    InvalidParameter,
    NoiseMode,
    NoisePlan,
    add_noise,
    clamp,
    consistent_box,
    consistent_histogram,
    decode,
    draw_noise,
    estimate,
    feasible_range,
    frequencies,
    mean,
    noise_half_width,
    project_histogram,
)
from veil.dp.estimates import simultaneous_alpha

FIELD64 = 2**32 * (2**32 - 1) + 1
RUNS = 2_000


def noised_aggregates(plan: NoisePlan, truth: int, runs: int, seed: str) -> list[int]:
    """`runs` independent collections of the same truth, through both aggregators."""
    rng = random.Random(seed)
    leader = [rng.randrange(FIELD64) for _ in range(runs)]
    helper = [(truth - s) % FIELD64 for s in leader]
    a = add_noise(leader, FIELD64, plan, rng)
    b = add_noise(helper, FIELD64, plan, rng)
    return decode([(x + y) % FIELD64 for x, y in zip(a, b, strict=True)], FIELD64)


@pytest.mark.parametrize(
    ("config", "vdaf", "params"),
    [
        (DPConfig.geometric(1), "Prio3Count", {}),
        (DPConfig.geometric("0.5", NoiseMode.SPLIT), "Prio3Sum", {"max_measurement": 4}),
        (DPConfig.gaussian("0.1"), "Prio3Histogram", {"length": 4}),
        (DPConfig.laplace(2, 4), "Prio3Sum", {"max_measurement": 16}),
    ],
    ids=["geometric", "split", "gaussian", "laplace-fixed-point"],
)
def test_confidence_interval_coverage(config, vdaf, params) -> None:
    plan = NoisePlan.for_task(config, vdaf, params)
    truth = 40
    results = estimate(noised_aggregates(plan, truth, RUNS, f"ci-{vdaf}"), plan, alpha=0.05)
    unit = Fraction(1, 2**config.fixed_point_bits)
    covered = sum(e.low <= truth * unit <= e.high for e in results) / RUNS
    expected = results[0].coverage
    print(f"CI coverage {config.mechanism}/{config.mode}: {covered:.4f} (exact {expected:.4f})")
    assert expected >= 0.95
    assert abs(covered - expected) <= 4 * math.sqrt(expected * (1 - expected) / RUNS)


def test_estimate_is_unbiased() -> None:
    plan = NoisePlan.for_task(DPConfig.geometric("0.5"), "Prio3Count", {})
    results = estimate(noised_aggregates(plan, 100, 20_000, "unbiased"), plan)
    values = [float(e.value) for e in results]
    _, table = plan.total_noise_pmf()
    sd = math.sqrt(2 * 2 * math.exp(-0.5) / (1 - math.exp(-0.5)) ** 2)
    assert abs(sum(values) / len(values) - 100) < 5 * sd / math.sqrt(len(values))
    assert table.sum() == pytest.approx(1, abs=1e-12)


def test_half_width_is_the_least_that_covers() -> None:
    # Split mode: the total is one discrete Laplace, P(|Z| <= c) = 1 - 2q**(c+1)/(1+q).
    plan = NoisePlan.for_task(DPConfig.geometric(1, NoiseMode.SPLIT), "Prio3Count", {})
    q = math.exp(-1)
    for alpha in (0.5, 0.05, 0.01, 1e-6):
        c, coverage = noise_half_width(plan, alpha)
        exact = 1 - 2 * q ** (c + 1) / (1 + q)
        assert coverage == pytest.approx(exact, abs=1e-12)
        assert exact >= 1 - alpha
        assert 1 - 2 * q**c / (1 + q) < 1 - alpha  # c - 1 would not do


def test_independent_mode_interval_is_wider_than_split() -> None:
    independent = NoisePlan.for_task(DPConfig.geometric(1), "Prio3Count", {})
    split = NoisePlan.for_task(DPConfig.geometric(1, NoiseMode.SPLIT), "Prio3Count", {})
    assert noise_half_width(independent, 0.05)[0] > noise_half_width(split, 0.05)[0]


def test_none_mechanism_has_exact_answers() -> None:
    plan = NoisePlan.for_task(DPConfig.none(), "Prio3Count", {})
    assert estimate([7], plan) == [Estimate(Fraction(7), Fraction(7), Fraction(7), 0.95, 1.0)]


def test_fixed_point_values_are_scaled_back() -> None:
    plan = NoisePlan.for_task(DPConfig.laplace(1, 3), "Prio3Sum", {"max_measurement": 80})
    (result,) = estimate([20], plan)
    assert result.value == Fraction(20, 8)
    assert result.low < result.value < result.high


@pytest.mark.parametrize("alpha", [0, 1, -0.1, 1e-12])
def test_bad_alpha_is_refused(alpha) -> None:
    plan = NoisePlan.for_task(DPConfig.geometric(1), "Prio3Count", {})
    with pytest.raises(InvalidParameter, match="alpha"):
        estimate([1], plan, alpha=alpha)


# --------------------------------------------------------------------------- post-processing


def test_project_histogram_example() -> None:
    assert project_histogram([5, -1, 2], 5) == [4, 0, 1]
    assert project_histogram([3, 3], 0) == [0, 0]
    assert project_histogram([-4, -4], 2) == [1, 1]


def test_project_histogram_is_the_nearest_feasible_point() -> None:
    rng = random.Random("projection")
    for _ in range(200):
        length = rng.randrange(1, 8)
        values = [rng.randrange(-20, 40) for _ in range(length)]
        total = rng.randrange(0, 60)
        x = project_histogram(values, total)
        assert sum(x) == total and min(x) >= 0
        dist = sum((a - b) ** 2 for a, b in zip(x, values, strict=True))
        for _ in range(20):
            # Random feasible points are never closer.
            cuts = sorted(Fraction(rng.randrange(0, 1000), 1000) * total for _ in range(length - 1))
            y = [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]
            assert dist <= sum((a - b) ** 2 for a, b in zip(y, values, strict=True))


def test_project_histogram_refuses_bad_input() -> None:
    with pytest.raises(InvalidParameter):
        project_histogram([], 3)
    with pytest.raises(InvalidParameter):
        project_histogram([1], -1)


def test_clamp_and_feasible_range() -> None:
    low, high = feasible_range("Prio3Sum", {"max_measurement": 10}, 5)
    assert (low, high) == (0, 50)
    assert clamp([-3, 20, 60], low, high) == [0, 20, 50]
    assert feasible_range("Prio3Histogram", {"length": 3}, 9) == (0, 9)
    assert feasible_range("Prio3SumVec", {"length": 3, "bits": 2}, 9) == (0, 27)
    with pytest.raises(InvalidParameter):
        clamp([1], 2, 1)
    with pytest.raises(InvalidParameter):
        feasible_range("Prio3Count", {}, -1)


def test_mean_and_frequencies() -> None:
    total = Estimate(Fraction(30), Fraction(20), Fraction(40), 0.95, 0.96)
    assert mean(total, 10) == Estimate(Fraction(3), Fraction(2), Fraction(4), 0.95, 0.96)
    hist = [Estimate(Fraction(v), Fraction(v - 2), Fraction(v + 2), 0.95, 0.96) for v in (6, 4)]
    assert [f.value for f in frequencies(hist, 10)] == [Fraction(3, 5), Fraction(2, 5)]
    with pytest.raises(InvalidParameter):
        mean(total, 0)


# ------------------------------------------ simultaneous intervals (issue 14 item 4)

# Runs per case: a few seconds in CI; VEIL_TEST_LONG=1 runs 20x as many.
COVERAGE_RUNS = 20_000 if LONG else 1_000


def _joint_coverage(plan: NoisePlan, k: int, simultaneous: bool, runs: int, seed: str) -> float:
    """The share of runs in which every coordinate's interval covers the truth."""
    rng = random.Random(seed)
    truth = [50] * k
    covered = 0
    for _ in range(runs):
        noise = [
            a + b for a, b in zip(draw_noise(plan, k, rng), draw_noise(plan, k, rng), strict=True)
        ]
        noisy = [t + z for t, z in zip(truth, noise, strict=True)]
        est = estimate(noisy, plan, 0.05, simultaneous=simultaneous)
        covered += all(e.low <= t <= e.high for e, t in zip(est, truth, strict=True))
    return covered / runs


@pytest.mark.parametrize(
    ("vdaf", "params", "config"),
    [
        ("Prio3MultihotCountVec", {"length": 7, "max_weight": 3}, DPConfig.geometric(1)),
        ("Prio3Histogram", {"length": 6}, DPConfig.geometric("0.5")),
        ("Prio3SumVec", {"length": 3, "max_measurement": 10}, DPConfig.geometric("0.25")),
        ("Prio3Histogram", {"length": 6}, DPConfig.gaussian("0.5")),
    ],
    ids=["multihot-7", "histogram-6", "sumvec-3", "gaussian-histogram-6"],
)
def test_simultaneous_intervals_cover_a_whole_question(vdaf, params, config) -> None:
    plan = NoisePlan.for_task(config, vdaf, params)
    k = params["length"]
    per = _joint_coverage(plan, k, False, COVERAGE_RUNS, f"per-{vdaf}-{config}")
    joint = _joint_coverage(plan, k, True, COVERAGE_RUNS, f"joint-{vdaf}-{config}")
    expected = estimate([0] * k, plan, 0.05, simultaneous=True)[0].coverage
    marginal = estimate([0] * k, plan, 0.05)[0].coverage
    print(
        f"coverage {vdaf}{params} {config.mechanism}: per-coordinate joint {per:.3f} "
        f"(exact {marginal**k:.3f}), simultaneous {joint:.3f} (exact {expected:.4f})"
    )
    assert expected >= 0.95
    # Both agree with their exact joint coverage (two-sided binomial, α = 1e-3) ...
    assert stats.binomtest(round(joint * COVERAGE_RUNS), COVERAGE_RUNS, expected).pvalue > 1e-3
    assert stats.binomtest(round(per * COVERAGE_RUNS), COVERAGE_RUNS, marginal**k).pvalue > 1e-3
    # ... and the per-coordinate "95%" intervals miss the whole question far more often.
    assert marginal**k < 0.9


def test_simultaneous_alpha_is_sidak_and_refuses_what_tables_cannot_give() -> None:
    assert simultaneous_alpha(0.05, 1) == 0.05
    assert simultaneous_alpha(0.05, 7) == pytest.approx(1 - 0.95 ** (1 / 7), rel=1e-12)
    assert simultaneous_alpha(0.05, 7) > 0.05 / 7  # slightly narrower than Bonferroni
    with pytest.raises(InvalidParameter, match="larger α"):
        simultaneous_alpha(1e-6, 10_000)


# ------------------------------------------------ consistent estimates (issue 30)

_values = st.integers(-200, 200)


@given(st.lists(st.tuples(_values, st.integers(0, 60)), min_size=1, max_size=8), st.integers(0, 50))
@settings(max_examples=300, deadline=None)
def test_consistent_box_stays_in_range_and_keeps_coverage(raw, top) -> None:
    est = [Estimate(Fraction(v), Fraction(v - c), Fraction(v + c), 0.95, 0.95) for v, c in raw]
    for e, out in zip(est, consistent_box(est, 0, top), strict=True):
        assert 0 <= out.low <= out.value <= out.high <= top
        # Every truth in the range that the raw interval covered, the shown one covers.
        for t in range(top + 1):
            if e.low <= t <= e.high:
                assert out.low <= t <= out.high
        if 0 <= e.value <= top:
            assert out.value == e.value


@given(st.lists(st.integers(0, 30), min_size=2, max_size=7), st.integers(0, 40), st.data())
@settings(max_examples=300, deadline=None)
def test_consistent_histogram_sums_to_n_and_stays_in_its_intervals(truth, c, data) -> None:
    n = sum(truth)
    # Noise within ±c on every bucket: the event on which simultaneous intervals hold.
    noisy = [t + data.draw(st.integers(-c, c)) for t in truth]
    est = [Estimate(Fraction(v), Fraction(v - c), Fraction(v + c), 0.95, 0.95) for v in noisy]
    out = consistent_histogram(est, n)
    assert sum(e.value for e in out) == n
    for t, e in zip(truth, out, strict=True):
        assert 0 <= e.low <= e.value <= e.high <= n
        assert e.low <= t <= e.high
    # On that event the projection moves no bucket further than c: the shown
    # estimate lies in the raw interval cut to the range, never widened.
    for raw, e in zip(est, out, strict=True):
        assert e.low == max(raw.low, 0) and e.high == min(raw.high, n)


def test_consistent_histogram_far_outside_widens_rather_than_hides() -> None:
    # All buckets far below zero (a miss, probability at most α): the projection
    # puts n somewhere; the interval grows to hold it, still within [0, n].
    est = [Estimate(Fraction(-50), Fraction(-60), Fraction(-40), 0.95, 0.95)] * 3
    out = consistent_histogram(est, 7)
    assert sum(e.value for e in out) == 7
    assert all(0 <= e.low <= e.value <= e.high <= 7 for e in out)
