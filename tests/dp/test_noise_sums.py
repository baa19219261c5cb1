"""The interval of a weighted sum of independent integer noises
(veil.dp.noise_sums): exact for one noise up to two hundredths of a standard
deviation, a convolution for several, covering as its mass says."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest

from veil.dp import DiscreteGaussian, DiscreteLaplace, InvalidParameter, TotalNoise
from veil.dp.noise_sums import weighted_noise_half_width


def _exact_half_width(noise: TotalNoise, alpha: float) -> int:
    c = 0
    while noise.central_mass(c) < 1 - alpha:
        c += 1
    return c


def _laplace(scale: int | Fraction, parts: int = 2) -> TotalNoise:
    return TotalNoise((DiscreteLaplace(scale),) * parts)


def _gaussian(sigma2: int | Fraction) -> TotalNoise:
    return TotalNoise((DiscreteGaussian.from_sigma_squared(sigma2),) * 2)


@pytest.mark.parametrize(
    "noise",
    [_laplace(3, 1), _laplace(Fraction(7, 2)), _gaussian(40)],
    ids=["one-laplace", "two-laplace", "two-gaussian"],
)
@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_one_noise_gets_its_exact_interval_and_two_hundredths_of_sd_more(
    noise: TotalNoise, alpha: float
) -> None:
    exact = _exact_half_width(noise, alpha)
    sd = math.sqrt(noise.variance())
    c, mass = weighted_noise_half_width([(noise, [1.0])], alpha)
    assert exact <= c <= exact + 0.021 * sd
    assert mass >= 1 - alpha and mass == pytest.approx(noise.central_mass(exact), abs=1e-9)
    # Scaling the noise scales the interval: the lattice halves with the weight.
    half, _ = weighted_noise_half_width([(noise, [0.5])], alpha)
    assert exact / 2 <= half <= exact / 2 + 0.021 * sd


def test_two_copies_are_their_convolution() -> None:
    one, two = _laplace(3, 1), _laplace(3, 2)
    for alpha in (0.05, 0.2, 0.001):
        exact = _exact_half_width(two, alpha)
        c, _ = weighted_noise_half_width([(one, [1.0, -1.0])], alpha)
        assert exact <= c <= exact + 0.021 * math.sqrt(two.variance())


def test_noises_too_wide_to_tabulate_are_rounded_copy_by_copy() -> None:
    """A discrete Gaussian past its table (σ > ~300,000) is normal to double
    precision; two copies at one weight, whose exact sum is not tabulated either,
    get the normal quantile of their sum, and at most 2% of σ more."""
    wide = TotalNoise((DiscreteGaussian.from_sigma_squared(10**11),))
    sd = math.sqrt(2 * wide.variance())
    c, mass = weighted_noise_half_width([(wide, [1.0, 1.0])], 0.05)
    exact = 1.959964 * sd
    assert exact - 1 <= c <= exact + 0.021 * sd and mass >= 0.95


def test_a_weighted_sum_covers_as_its_mass_says() -> None:
    """Irrational weights on noises of three laws, drawn with the real samplers."""
    lap, wide, gauss = DiscreteLaplace(4), DiscreteLaplace(Fraction(25, 2)), DiscreteGaussian(6)
    terms = [
        (TotalNoise((lap, lap)), [math.sqrt(0.5), 0.1, 0.1, 0.1]),
        (TotalNoise((wide,)), [1 / math.pi]),
        (TotalNoise((gauss, gauss)), [0.3, -0.3]),
    ]
    c, mass = weighted_noise_half_width(terms, 0.1)
    rng = random.Random("weighted")
    runs = 4000
    held = 0
    for _ in range(runs):
        x = sum(
            w * sum(part.sample(rng) for part in noise.parts)
            for noise, weights in terms
            for w in weights
        )
        held += abs(x) <= c
    # The stated mass, within sampling error (4 standard errors either side).
    se = math.sqrt(mass * (1 - mass) / runs)
    assert abs(held / runs - mass) <= 4 * se, (held / runs, mass)


def test_no_noise_and_refused_weights() -> None:
    assert weighted_noise_half_width([(TotalNoise(()), [1.0, 2.0])], 0.05) == (0.0, 1.0)
    with pytest.raises(InvalidParameter, match="finite"):
        weighted_noise_half_width([(_laplace(2), [1.0, math.nan])], 0.05)
    with pytest.raises(InvalidParameter, match="alpha"):
        weighted_noise_half_width([(_laplace(2), [1.0])], 1.0)
