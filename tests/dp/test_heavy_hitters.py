"""DP for text questions: levels, budget split, threshold, detection (veil.dp.heavy_hitters)."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from veil.dp import DPConfig, InvalidParameter, NoiseMode, draw_noise
from veil.dp.accounting import Neighbouring
from veil.dp.distributions import DiscreteGaussian, DiscreteLaplace
from veil.dp.estimates import Estimate
from veil.dp.heavy_hitters import (
    HeavyHittersPlan,
    count_estimates,
    detection_floor,
    level_sensitivity,
    recovery_probability,
    release_probability,
    release_threshold,
    resolve_threshold,
    share_estimates,
    text_levels,
    upper_tail,
)
from veil.dp.mechanisms import TotalNoise

MODES = st.sampled_from([NoiseMode.INDEPENDENT, NoiseMode.SPLIT])
RELATIONS = st.sampled_from(list(Neighbouring))


def plan_of(epsilon: Fraction | str, max_bytes: int = 4, **kw: object) -> HeavyHittersPlan:
    mode = kw.pop("mode", NoiseMode.INDEPENDENT)
    assert isinstance(mode, NoiseMode)
    return HeavyHittersPlan(DPConfig.geometric(epsilon, mode), max_bytes, **kw)  # type: ignore[arg-type]


# ----------------------------------------------------------------- levels and sensitivity


def test_levels_are_one_per_byte() -> None:
    assert text_levels(16) == tuple(range(7, 128, 8))
    assert text_levels(1) == (7,)


@pytest.mark.parametrize("bad", [0, -1, 65, True, "16", 2.0, None])
def test_max_bytes_out_of_range_is_refused(bad: object) -> None:
    with pytest.raises(InvalidParameter, match="max_bytes"):
        text_levels(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter, match="max_bytes"):
        HeavyHittersPlan(DPConfig.geometric(1), bad)  # type: ignore[arg-type]


def prefix_counts(strings: list[bytes], prefixes: list[bytes]) -> list[int]:
    return [sum(s.startswith(p) for s in strings) for p in prefixes]


def l1(a: list[int], b: list[int]) -> int:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


STRINGS = st.lists(st.binary(min_size=3, max_size=3).map(lambda b: bytes(x % 3 for x in b)))


@settings(max_examples=60, deadline=None)
@given(
    data=STRINGS,
    level=st.integers(1, 3),
    picks=st.sets(st.integers(0, 26), min_size=1),
)
def test_level_sensitivity_bounds_every_neighbour(data: list[bytes], level: int, picks) -> None:
    """Brute force over every neighbour of a small dataset, for any prefix list."""
    universe = [bytes(p) for p in itertools.product(range(3), repeat=3)]
    prefixes = sorted({universe[i][:level] for i in picks})
    base = prefix_counts(data, prefixes)
    add = level_sensitivity("add_remove")
    replace = level_sensitivity(Neighbouring.REPLACE_ONE)
    for s in universe:
        assert l1(base, prefix_counts([*data, s], prefixes)) <= add.l1
    for i, s in itertools.product(range(len(data)), universe):
        changed = [*data[:i], s, *data[i + 1 :]]
        diff = [x - y for x, y in zip(base, prefix_counts(changed, prefixes), strict=True)]
        assert sum(abs(d) for d in diff) <= replace.l1
        assert sum(d * d for d in diff) <= replace.l2_squared
        assert max((abs(d) for d in diff), default=0) <= replace.per_coordinate


def test_level_sensitivity_is_attained() -> None:
    prefixes = [b"a", b"b"]
    assert l1(prefix_counts([b"a"], prefixes), prefix_counts([b"b"], prefixes)) == 2
    assert level_sensitivity("replace_one").l1 == 2
    assert level_sensitivity("add_remove").l1 == 1
    with pytest.raises(InvalidParameter, match="neighbouring"):
        level_sensitivity("swap")


# ----------------------------------------------------------------- budget split


@settings(max_examples=60, deadline=None)
@given(
    tenths=st.integers(1, 80),
    max_bytes=st.integers(1, 32),
    relation=RELATIONS,
    mode=MODES,
)
def test_budget_splits_evenly_and_composes_back(tenths, max_bytes, relation, mode) -> None:
    epsilon = Fraction(tenths, 10)
    plan = plan_of(epsilon, max_bytes, neighbouring=relation, mode=mode)
    assert plan.level_config.epsilon == epsilon / max_bytes
    assert plan.level_config.mode is mode
    assert plan.levels == text_levels(max_bytes)
    collector, one = plan.guarantees()
    assert collector.epsilon == epsilon
    assert plan.charge == max_bytes * plan.level_plan.charge
    if mode is NoiseMode.INDEPENDENT:
        assert one.epsilon == epsilon == plan.charge
        assert len(plan.level_plan.total_noise().parts) == 2
    else:
        assert one.epsilon == plan.charge and one.epsilon > epsilon
        assert len(plan.level_plan.total_noise().parts) == 1
    assert plan.level_plan.scale == level_sensitivity(relation).l1 * max_bytes / epsilon


def test_gaussian_splits_rho() -> None:
    plan = HeavyHittersPlan(DPConfig.gaussian("0.8"), 16)
    assert plan.level_config.rho == Fraction(1, 20)
    assert plan.level_plan.sigma_squared == Fraction(2) / (2 * Fraction(1, 20))
    collector, one = plan.guarantees()
    assert collector.rho == one.rho == Fraction(4, 5)
    assert plan.charge == Fraction(4, 5)


def test_statement_names_levels_and_prefixes() -> None:
    plan = plan_of("2", 16, max_prefixes=4096)
    statement = plan.statement("one report")
    assert statement.against_collector.epsilon == 2
    text = statement.text()
    assert "16 collections" in text and "at most 4096 prefixes" in text
    assert "ε = 0.125 each" in text
    none = HeavyHittersPlan(DPConfig.none(), 16)
    assert none.guarantees()[0].is_none and none.charge is None
    assert none.statement("one report").notes == ()


def test_too_thin_a_level_budget_is_refused_with_its_cause() -> None:
    with pytest.raises(InvalidParameter, match="max_bytes 16 spends its ε over 16 levels"):
        plan_of("0.01", 16)
    with pytest.raises(InvalidParameter, match="fixed_point_bits"):
        HeavyHittersPlan(DPConfig.laplace(1, 4), 16)
    with pytest.raises(InvalidParameter, match="max_prefixes"):
        plan_of("1", 4, max_prefixes=0)


# ----------------------------------------------------------------- tails, exactly


def brute_tail(pmf, t: int, reach: int) -> float:
    return math.fsum(pmf(z) for z in range(t, reach))


def laplace_sum_pmf(scale: str):
    """The pmf of the sum of two discrete Laplace draws, by summing the product of
    their pmfs over k in [-400, 400] (far past where they matter at these scales)."""
    one = DiscreteLaplace(scale)
    table: dict[int, float] = {}

    def pmf(z: int) -> float:
        if z not in table:
            table[z] = math.fsum(one.pmf(k) * one.pmf(z - k) for k in range(-400, 401))
        return table[z]

    return pmf


@pytest.mark.parametrize("scale", ["1/2", "1", "3", "7/2"])
def test_upper_tail_matches_brute_force_sums(scale: str) -> None:
    one = DiscreteLaplace(scale)
    two = laplace_sum_pmf(scale)
    for t in (-5, 0, 1, 2, 7, 20):
        assert upper_tail(TotalNoise((one,)), t) == pytest.approx(
            brute_tail(one.pmf, t, 600), rel=1e-9, abs=1e-15
        )
        assert upper_tail(TotalNoise((one, one)), t) == pytest.approx(
            brute_tail(two, t, 300), rel=1e-9, abs=1e-15
        )


def test_upper_tail_of_gaussians_matches_brute_force() -> None:
    g = DiscreteGaussian.from_sigma_squared(Fraction(9, 2))
    norm = math.fsum(math.exp(-(z * z) / 9) for z in range(-200, 201))
    single = [math.exp(-(z * z) / 9) / norm for z in range(-200, 201)]
    total = TotalNoise((g, g))
    for t in (-3, 1, 4, 10):
        expected = math.fsum(
            single[i] * single[j]
            for i in range(401)
            for j in range(401)
            if (i - 200) + (j - 200) >= t
        )
        assert upper_tail(total, t) == pytest.approx(expected, abs=1e-12)


# ----------------------------------------------------------------- threshold


@settings(max_examples=50, deadline=None)
@given(
    tenths=st.integers(5, 80),
    relation=RELATIONS,
    mode=MODES,
    target=st.sampled_from([1e-2, 1e-3, 1e-6]),
)
def test_release_threshold_is_the_least_meeting_its_target(tenths, relation, mode, target) -> None:
    plan = plan_of(Fraction(tenths, 10), 8, neighbouring=relation, mode=mode)
    t = release_threshold(plan, target)
    noise = plan.level_plan.total_noise()
    assert t.release_probability == upper_tail(noise, t.value - 1) <= target
    assert t.value == 1 or upper_tail(noise, t.value - 2) > target
    assert t.spurious_probability < t.release_probability
    assert release_probability(plan, t.value) == t.release_probability


def test_candidates_raise_the_threshold_to_bound_spurious_prefixes() -> None:
    plan = plan_of("2", 16)
    alone = release_threshold(plan)
    bounded = release_threshold(plan, candidates=50 * 256)
    assert bounded.value > alone.value
    assert 50 * 256 * bounded.spurious_probability <= 0.05
    assert 50 * 256 * upper_tail(plan.level_plan.total_noise(), bounded.value - 1) > 0.05


def test_operator_threshold_or_share() -> None:
    plan = plan_of("2", 16)
    given_t = resolve_threshold(plan, threshold=150)
    assert given_t.value == 150 and given_t.source == "threshold"
    assert given_t.release_probability == release_probability(plan, 150)
    share = resolve_threshold(plan, min_share=Fraction(1, 100), respondents=1234)
    assert share.value == 13 and share.source == "min_share"
    assert resolve_threshold(plan).value == release_threshold(plan).value


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"threshold": 5, "min_share": Fraction(1, 10)}, "not both"),
        ({"threshold": 0}, "threshold"),
        ({"threshold": True}, "threshold"),
        ({"min_share": Fraction(0)}, "min_share"),
        ({"min_share": Fraction(3, 2), "respondents": 10}, "min_share"),
        ({"min_share": Fraction(1, 10)}, "respondents"),
        ({"target": 0.0}, "release target"),
        ({"target": 0.7}, "release target"),
        ({"candidates": 0}, "candidates"),
    ],
)
def test_malformed_threshold_settings_are_refused(kwargs, match) -> None:
    with pytest.raises(InvalidParameter, match=match):
        resolve_threshold(plan_of("2", 16), **kwargs)


# ----------------------------------------------------------------- detection


def test_recovery_probability_matches_a_brute_force_sum() -> None:
    """Two levels, two aggregators' discrete Laplace noise each: sum the joint pmf."""
    plan = plan_of("4", 2)  # scale 2·2/4 = 1 per aggregator per level
    two = laplace_sum_pmf("1")
    threshold = 5
    for count in (0, 1, 3, 5, 9):
        survive_one = math.fsum(two(z) for z in range(threshold - count, 200))
        both = math.fsum(
            two(z1) * two(z2)
            for z1 in range(threshold - count, 60)
            for z2 in range(threshold - count, 60)
        )
        assert recovery_probability(plan, count, threshold) == pytest.approx(both, rel=1e-9)
        assert both == pytest.approx(survive_one**2, rel=1e-9)


def test_recovery_probability_agrees_with_drawn_noise() -> None:
    """Both aggregators draw each level's noise as they would; count survivals."""
    plan = plan_of("6", 3)
    level = plan.level_plan
    threshold, count, runs = 8, 9, 4000
    rng = random.Random("hh-recovery")
    draws = [
        [
            a + b
            for a, b in zip(draw_noise(level, runs, rng), draw_noise(level, runs, rng), strict=True)
        ]
        for _ in plan.levels
    ]
    survived = sum(all(count + z[i] >= threshold for z in draws) for i in range(runs))
    expected = recovery_probability(plan, count, threshold)
    assert stats.binomtest(survived, runs, expected).pvalue > 1e-3


@settings(max_examples=40, deadline=None)
@given(tenths=st.integers(5, 80), max_bytes=st.integers(1, 24), relation=RELATIONS, mode=MODES)
def test_detection_floor_is_the_least_count_found_at_95(tenths, max_bytes, relation, mode) -> None:
    plan = plan_of(Fraction(tenths, 10), max_bytes, neighbouring=relation, mode=mode)
    t = release_threshold(plan).value
    floor = detection_floor(plan, t, 10_000)
    assert floor.probability == recovery_probability(plan, floor.count, t) >= 0.95
    assert floor.count == 0 or recovery_probability(plan, floor.count - 1, t) < 0.95
    assert floor.share == Fraction(floor.count, 10_000)
    assert floor.count >= t  # P(Z >= 1) < 1/2: a count below T is found less often
    lower = [recovery_probability(plan, c, t) for c in range(0, floor.count + 5, 7)]
    assert lower == sorted(lower)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda p: detection_floor(p, 10, 0), "respondents"),
        (lambda p: detection_floor(p, 10, 100, target=1.0), "detection target"),
        (lambda p: detection_floor(p, 0, 100), "threshold"),
        (lambda p: recovery_probability(p, -1, 10), "count"),
    ],
)
def test_malformed_detection_inputs_are_refused(call, match) -> None:
    with pytest.raises(InvalidParameter, match=match):
        call(plan_of("2", 16))


# ----------------------------------------------------------------- estimates


def test_count_intervals_cover_at_their_level() -> None:
    plan = plan_of("8", 4)
    level = plan.level_plan
    rng = random.Random("hh-estimates")
    truth, runs = 120, 2000
    noised = [
        truth + a + b
        for a, b in zip(draw_noise(level, runs, rng), draw_noise(level, runs, rng), strict=True)
    ]
    estimates = count_estimates(noised, plan, 0.1)
    covered = sum(e.low <= truth <= e.high for e in estimates)
    assert stats.binomtest(covered, runs, 0.9, alternative="less").pvalue > 1e-3
    assert all(e.coverage >= 0.9 for e in estimates)


def test_share_estimates_from_an_exact_or_a_noisy_count() -> None:
    counts = [Estimate(Fraction(300), Fraction(250), Fraction(350), 0.95, 0.95)]
    exact = share_estimates(counts, 1000)
    assert (exact[0].value, exact[0].low, exact[0].high) == (
        Fraction(3, 10),
        Fraction(1, 4),
        Fraction(7, 20),
    )
    n = Estimate(Fraction(1000), Fraction(900), Fraction(1100), 0.95, 0.95)
    noisy = share_estimates(counts, n)[0]
    assert noisy.low == Fraction(250, 1100) and noisy.high == Fraction(350, 900)
    with pytest.raises(InvalidParameter, match="respondents"):
        share_estimates(counts, 0)


def test_without_noise_the_threshold_drops_exactly_the_answers_given_once() -> None:
    plan = HeavyHittersPlan(DPConfig.none(), 16)
    t = release_threshold(plan)
    assert (t.value, t.release_probability, t.spurious_probability) == (2, 0.0, 0.0)
    assert recovery_probability(plan, 2, 2) == 1.0 and recovery_probability(plan, 1, 2) == 0.0
    assert detection_floor(plan, 2, 100).count == 2
