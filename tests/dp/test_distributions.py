"""Exact samplers against their exact pmfs (veil.dp.distributions, veil.dp._exact).

Every sampler (the scalar reference and the vectorised path) is checked with a
chi-square goodness-of-fit test on 100,000 seeded draws, tails merged, at α = 1e-3.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest

from veil.dp import (
    DiscreteGaussian,
    DiscreteLaplace,
    InvalidParameter,
    Polya,
    PolyaDifference,
    _exact,
    distributions,
)

GOF_ALPHA = 1e-3
DRAWS = 100_000


def symmetric_support(table: np.ndarray) -> int:
    return -((table.size - 1) // 2)


def check_fit(gof, name: str, samples, start: int, probs: np.ndarray) -> None:
    p = gof(samples, start, probs)
    print(f"GOF {name}: p = {p:.4f}")
    assert p > GOF_ALPHA, f"{name} does not fit its pmf (p = {p:.2e})"


# --------------------------------------------------------------------------- Laplace


@pytest.mark.parametrize("scale", [1, "2.5", "1/3", 10])
def test_discrete_laplace_vector_fits_pmf(gof, scale) -> None:
    dist = DiscreteLaplace(scale)
    samples = dist.sample_array(DRAWS, random.Random(f"dlap-vec-{scale}"))
    table = dist.pmf_table()
    check_fit(gof, f"DiscreteLaplace({scale}) vec", samples, symmetric_support(table), table)


def test_discrete_laplace_scalar_fits_pmf(gof) -> None:
    dist = DiscreteLaplace("3/2")
    rng = random.Random("dlap-scalar")
    samples = [dist.sample(rng) for _ in range(DRAWS)]
    table = dist.pmf_table()
    check_fit(gof, "DiscreteLaplace(3/2) scalar", samples, symmetric_support(table), table)


def test_goodness_of_fit_detects_a_wrong_scale(gof) -> None:
    # The same test must reject a 10% error in the scale, or it proves nothing.
    samples = DiscreteLaplace(2).sample_array(DRAWS, random.Random("wrong-scale"))
    table = DiscreteLaplace("2.2").pmf_table()
    assert gof(samples, symmetric_support(table), table) < GOF_ALPHA


def test_discrete_laplace_moments() -> None:
    dist = DiscreteLaplace(4)
    samples = dist.sample_array(DRAWS, random.Random("dlap-moments")).astype(np.float64)
    q = math.exp(-1 / 4)
    assert dist.pmf(0) == pytest.approx((1 - q) / (1 + q), rel=1e-12)
    assert dist.variance() == pytest.approx(2 * q / (1 - q) ** 2, rel=1e-12)
    p0 = dist.pmf(0)
    assert abs(np.mean(samples == 0) - p0) < 5 * math.sqrt(p0 * (1 - p0) / DRAWS)
    var = dist.variance()
    assert abs(samples.mean()) < 5 * math.sqrt(var / DRAWS)
    # The variance of the sample variance of a discrete Laplace is below 6·var²/n.
    assert abs(samples.var() - var) < 5 * math.sqrt(6 * var**2 / DRAWS)


def test_discrete_laplace_pmf_sums_to_one() -> None:
    for scale in (1, "0.2", 30):
        assert math.fsum(DiscreteLaplace(scale).pmf_table().tolist()) == pytest.approx(1, abs=1e-13)


def test_large_parameters_fall_back_to_the_exact_scalar_path() -> None:
    # Numerator above 2**48: the int64 lanes could overflow, so Python ints take over.
    dist = DiscreteLaplace(Fraction(2**49 + 1, 2**48))
    samples = np.array(dist.sample_vec(3000, random.Random("big")), dtype=np.float64)
    assert abs(samples.var() - dist.variance()) < 0.15 * dist.variance()


# --------------------------------------------------------------------------- Gaussian


@pytest.mark.parametrize("sigma", [1, "3.5", "1/2", 10])
def test_discrete_gaussian_vector_fits_pmf(gof, sigma) -> None:
    dist = DiscreteGaussian(sigma)
    samples = dist.sample_array(DRAWS, random.Random(f"dgauss-vec-{sigma}"))
    table = dist.pmf_table()
    check_fit(gof, f"DiscreteGaussian({sigma}) vec", samples, symmetric_support(table), table)


def test_discrete_gaussian_scalar_fits_pmf(gof) -> None:
    dist = DiscreteGaussian.from_sigma_squared("5/2")  # σ² need not be a square
    rng = random.Random("dgauss-scalar")
    samples = [dist.sample(rng) for _ in range(DRAWS)]
    table = dist.pmf_table()
    check_fit(gof, "DiscreteGaussian(σ²=5/2) scalar", samples, symmetric_support(table), table)


def test_discrete_gaussian_with_big_rationals_fits_pmf(gof) -> None:
    # σ² = 10**9/123456789 (from ρ = 0.123456789): the acceptance test's numbers pass
    # 64 bits and run in object lanes of Python ints.
    dist = DiscreteGaussian.from_sigma_squared(Fraction(10**9, 123456789))
    samples = dist.sample_array(DRAWS, random.Random("dgauss-big-rational"))
    table = dist.pmf_table()
    check_fit(
        gof, "DiscreteGaussian(σ²=10⁹/123456789) vec", samples, symmetric_support(table), table
    )


def test_discrete_gaussian_with_huge_sigma_fits_binned_pmf(gof) -> None:
    # σ ≈ 146543 (Sum with max 2**16 at ρ = 0.1); bins of 4096 values keep every
    # expected count large enough for the chi-square test.
    dist = DiscreteGaussian.from_sigma_squared(Fraction(2**32, 2) / Fraction(1, 10))
    samples = dist.sample_array(DRAWS, random.Random("dgauss-huge"))
    table = dist.pmf_table()
    width = 4096
    start = symmetric_support(table)
    pad = (-table.size) % width
    binned = np.concatenate([table, np.zeros(pad)]).reshape(-1, width).sum(axis=1)
    check_fit(gof, "DiscreteGaussian(σ≈146543) binned", (samples - start) // width, 0, binned)


def test_discrete_gaussian_moments() -> None:
    dist = DiscreteGaussian(3)
    samples = dist.sample_array(DRAWS, random.Random("dgauss-moments")).astype(np.float64)
    # For σ >= 1 the discrete Gaussian's variance is within 1e-8 of σ² (CKS20 Fig. 1).
    assert dist.variance() == pytest.approx(9, rel=1e-6)
    norm = sum(math.exp(-(z**2) / 18) for z in range(-100, 101))
    assert dist.pmf(0) == pytest.approx(1 / norm, rel=1e-12)
    p0 = dist.pmf(0)
    assert abs(np.mean(samples == 0) - p0) < 5 * math.sqrt(p0 * (1 - p0) / DRAWS)
    assert abs(samples.mean()) < 5 * math.sqrt(9 / DRAWS)
    assert abs(samples.var() - 9) < 5 * math.sqrt(2 * 81 / DRAWS)


# --------------------------------------------------------------------------- Polya


@pytest.mark.parametrize("scale", [2, "0.7", 10])
def test_polya_vector_fits_pmf(gof, scale) -> None:
    dist = Polya(scale, 2)
    samples = dist.sample_array(DRAWS, random.Random(f"polya-vec-{scale}"))
    check_fit(gof, f"Polya({scale}, r=1/2) vec", samples, 0, dist.pmf_array())


def test_polya_scalar_fits_pmf(gof) -> None:
    dist = Polya("5/2", 2)
    rng = random.Random("polya-scalar")
    samples = [dist.sample(rng) for _ in range(DRAWS)]
    check_fit(gof, "Polya(5/2, r=1/2) scalar", samples, 0, dist.pmf_array())


def test_polya_three_shares_fits_pmf(gof) -> None:
    # r = 1/3 exercises the general integer n-th root in the CDF bounds.
    dist = Polya(3, 3)
    samples = dist.sample_array(DRAWS, random.Random("polya-3"))
    check_fit(gof, "Polya(3, r=1/3) vec", samples, 0, dist.pmf_array())


@pytest.mark.parametrize("scale", [2, "0.7"])
def test_polya_difference_fits_pmf(gof, scale) -> None:
    dist = PolyaDifference(scale, 2)
    samples = dist.sample_array(DRAWS, random.Random(f"polya-diff-{scale}"))
    table = dist.pmf_table()
    check_fit(gof, f"PolyaDifference({scale}) vec", samples, symmetric_support(table), table)


def test_polya_difference_scalar_fits_pmf(gof) -> None:
    dist = PolyaDifference(3, 2)
    rng = random.Random("polya-diff-scalar")
    samples = [dist.sample(rng) for _ in range(DRAWS)]
    table = dist.pmf_table()
    check_fit(gof, "PolyaDifference(3) scalar", samples, symmetric_support(table), table)


@pytest.mark.parametrize("shares", [2, 3])
def test_split_shares_sum_to_exactly_one_discrete_laplace(gof, shares) -> None:
    scale = Fraction(5, 2)
    rng = random.Random(f"split-{shares}")
    total = sum(
        DiscreteLaplace(scale).split(shares).sample_array(DRAWS, rng) for _ in range(shares)
    )
    table = DiscreteLaplace(scale).pmf_table()
    check_fit(gof, f"sum of {shares} PolyaDifference(5/2)", total, symmetric_support(table), table)


def test_polya_difference_moments() -> None:
    dist = PolyaDifference(4, 2)
    assert dist.variance() == pytest.approx(DiscreteLaplace(4).variance() / 2, rel=1e-12)
    table = dist.pmf_table()
    z = np.arange(table.size) - (table.size - 1) // 2
    assert float(np.dot(z**2, table)) == pytest.approx(dist.variance(), rel=1e-9)
    samples = dist.sample_array(DRAWS, random.Random("pd-moments")).astype(np.float64)
    assert abs(samples.var() - dist.variance()) < 5 * math.sqrt(8 * dist.variance() ** 2 / DRAWS)
    p0 = dist.pmf(0)
    assert abs(np.mean(samples == 0) - p0) < 5 * math.sqrt(p0 * (1 - p0) / DRAWS)


def test_polya_exact_path_beyond_a_tiny_table(gof, monkeypatch) -> None:
    # With a 1-entry table every draw above 0 takes the exact fallback path (lazily
    # refined uniform against tightened bounds); it must fit just as well.
    monkeypatch.setattr(distributions, "_TABLE_MAX", 1)
    distributions._polya_table.cache_clear()
    try:
        dist = Polya(6, 2)
        samples = dist.sample_array(DRAWS // 5, random.Random("polya-fallback"))
        assert np.count_nonzero(samples >= 1) > DRAWS // 10
        check_fit(gof, "Polya(6) via exact fallback", samples, 0, dist.pmf_array())
    finally:
        distributions._polya_table.cache_clear()


def test_polya_cdf_bounds_bracket_the_cdf() -> None:
    x = Fraction(1, 3)
    cdf = np.cumsum(Polya(3, 2).pmf_array())
    for k, (lo, hi) in zip(range(40), distributions._polya_cdf_bounds(2, x, 63), strict=False):
        assert lo <= hi <= lo + 4
        assert lo / 2**63 <= cdf[k] + 1e-12 and cdf[k] - 1e-12 <= hi / 2**63


def test_undecided_comparison_refines_the_uniform() -> None:
    # Put U's first 63 bits exactly at the lower bound of F(0): the table cannot
    # decide, the exact path must draw more bits and still return 0 or 1.
    x = Fraction(1, 2)
    lo, _ = next(distributions._polya_cdf_bounds(2, x, 63))
    results = {
        distributions._polya_exact_from(2, x, lo, 63, 0, random.Random(i)) for i in range(50)
    }
    assert results <= {0, 1} and results


# --------------------------------------------------------------------------- primitives


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(7, 3)])
def test_bernoulli_exp_frequency(gamma) -> None:
    rng = random.Random(f"bexp-{gamma}")
    n = 40_000
    scalar = sum(_exact.bernoulli_exp(gamma, rng) for _ in range(n)) / n
    num = np.full(n, gamma.numerator, dtype=np.int64)
    vector = distributions._bernoulli_exp_fraction_vec(num, gamma.denominator, rng).mean()
    p = math.exp(-gamma)
    tolerance = 5 * math.sqrt(p * (1 - p) / n) + 1e-12
    assert abs(scalar - p) <= tolerance
    assert abs(vector - p) <= tolerance


def test_bernoulli_ratio_for_big_integers() -> None:
    rng = random.Random("ratio")
    den = 3 * 2**80
    num = np.array([2**80] * 30_000, dtype=object)  # p = 1/3 with 82-bit numbers
    freq = _exact.bernoulli_ratio_vec(num, den, rng).mean()
    assert abs(freq - 1 / 3) < 5 * math.sqrt(2 / 9 / 30_000)


def test_ratio_refinement_decides_exactly() -> None:
    # u = floor(2**62 / 3): the first 62 bits cannot decide U < 1/3. The remaining
    # probability is frac(2**62 / 3) = 1/3, which the refinement must reproduce.
    u = 2**62 // 3
    rng = random.Random("refine")
    freq = sum(_exact._refine_ratio(u, 62, 1, 3, rng) for _ in range(6000)) / 6000
    assert abs(freq - 1 / 3) < 5 * math.sqrt(2 / 9 / 6000)


def test_uniform_below_is_uniform(gof) -> None:
    samples = _exact.uniform_below_vec(random.Random("uniform"), 37, DRAWS)
    check_fit(gof, "uniform_below(37)", samples, 0, np.full(37, 1 / 37))
    assert samples.min() == 0 and samples.max() == 36


def test_exp_neg_bounds_bracket_exp() -> None:
    for x in (Fraction(0), Fraction(1, 7), Fraction(1), Fraction(20), Fraction(123, 10)):
        lo, hi = _exact.exp_neg_bounds(x, 80)
        true = Fraction(math.exp(-x))
        assert lo <= hi <= lo + 2
        assert abs(Fraction(lo, 2**80) - true) < Fraction(1, 2**50)


def test_iroot_is_the_floor_root() -> None:
    rng = random.Random("iroot")
    for n in (1, 2, 3, 5):
        for _ in range(200):
            x = rng.getrandbits(rng.randrange(1, 300))
            r = _exact.iroot(x, n)
            assert r**n <= x < (r + 1) ** n


# --------------------------------------------------------------------------- interface


def test_seeded_draws_are_reproducible() -> None:
    for dist in (DiscreteLaplace(3), DiscreteGaussian(2), PolyaDifference(3)):
        assert dist.sample_vec(50, random.Random(7)) == dist.sample_vec(50, random.Random(7))
        assert dist.sample(random.Random(7)) == dist.sample(random.Random(7))


def test_default_rng_is_the_system_rng() -> None:
    values = DiscreteLaplace(2).sample_vec(1000)
    assert len(values) == 1000 and all(isinstance(v, int) for v in values)
    assert isinstance(DiscreteGaussian(2).sample(), int)
    assert isinstance(PolyaDifference(2).sample(), int)


def test_sample_vec_returns_python_ints() -> None:
    values = DiscreteLaplace(2).sample_vec(10, random.Random(1))
    assert len(values) == 10 and all(type(v) is int for v in values)
    assert DiscreteLaplace(2).sample_vec(0, random.Random(1)) == []


@pytest.mark.parametrize("bad", [0, -1, "-0.5", "abc", 0.5, True, None, "inf"])
def test_bad_scale_is_refused(bad) -> None:
    with pytest.raises(InvalidParameter):
        DiscreteLaplace(bad)
    with pytest.raises(InvalidParameter):
        DiscreteGaussian(bad)
    with pytest.raises(InvalidParameter):
        PolyaDifference(bad)


def test_bad_count_and_shares_are_refused() -> None:
    with pytest.raises(InvalidParameter):
        DiscreteLaplace(1).sample_vec(-1)
    with pytest.raises(InvalidParameter):
        Polya(1, 0)
    with pytest.raises(InvalidParameter):
        PolyaDifference(1, 1.5)  # type: ignore[arg-type]


def test_fft_convolution_matches_direct_summation(monkeypatch) -> None:
    table = DiscreteGaussian(300).pmf_table()
    direct = np.convolve(table, table)
    monkeypatch.setattr(distributions, "_DIRECT_CONVOLVE_MAX", 16)
    via_fft = distributions.convolve(table, table)
    assert via_fft.shape == direct.shape
    assert np.abs(via_fft - direct).max() < 1e-15
    assert via_fft.min() >= 0


def test_discrete_gaussian_beyond_64_bits_in_every_part() -> None:
    # Denominators so large that b·t and the acceptance denominator leave int64 even
    # when every proposal is 0; the object lanes must take over, not overflow.
    tiny = DiscreteGaussian.from_sigma_squared(Fraction(1, 2**70))
    assert tiny.sample_vec(200, random.Random(1)) == [0] * 200
    wide = DiscreteGaussian.from_sigma_squared(Fraction(10**12 + 1, 10**6 + 3))
    samples = np.array(wide.sample_vec(4000, random.Random(2)), dtype=np.float64)
    assert abs(samples.var() / wide.variance() - 1) < 0.1
