"""Exact samplers for integer-valued noise.

- `DiscreteLaplace(scale)`: P(z) ∝ exp(-|z|/scale) (the two-sided geometric), sampled
  with Canonne, Kamath, Steinke 2020 (CKS20, arXiv:2004.00010) Algorithm 2.
- `DiscreteGaussian(sigma)`: P(z) ∝ exp(-z²/(2σ²)), CKS20 Algorithm 3 (rejection from
  a discrete Laplace).
- `Polya(scale, shares)` and `PolyaDifference(scale, shares)`: the negative binomial
  NB(r = 1/shares, q = exp(-1/scale)) and the difference of two independent copies.
  Summing `shares` independent `PolyaDifference` draws gives exactly one
  `DiscreteLaplace(scale)`, because a geometric variable is the sum of `shares`
  independent NB(1/shares, q) variables (infinite divisibility); this is how the
  `split` noise mode divides one discrete Laplace between the aggregators.

No sampler uses floating point (Mironov 2012). Each `pmf` evaluates the closed form
in double precision; it is for analysis (tests, confidence intervals) and never feeds
back into sampling.

Parameters are exact rationals: pass an `int`, a `Fraction` or a decimal string
("0.25"); floats are refused because their binary value is rarely the number meant.
"""

from __future__ import annotations

import functools
import math
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

import numpy as np
import numpy.typing as npt

from veil.dp._exact import (
    INT64_SAFE,
    BoolArray,
    IntArray,
    ObjArray,
    RandomSource,
    bernoulli_exp,
    bernoulli_exp_one_vec,
    bernoulli_exp_vec,
    exp_neg_bounds,
    iroot,
    randbelow,
    random_words,
    uniform_below_vec,
)
from veil.dp.errors import InvalidParameter

__all__ = [
    "DiscreteGaussian",
    "DiscreteLaplace",
    "NoiseDistribution",
    "Polya",
    "PolyaDifference",
    "RandomSource",
    "convolve",
    "exact_rational",
]

# Tail mass left out of pmf tables used for confidence intervals and ε accounting.
PMF_TAIL = 1e-15

# The NumPy lanes keep every intermediate below 2**62. With t <= 2**48 the products
# t·K and t·V (K, V loop counters, geometric with means below 2) stay in range until a
# counter passes 2**13, which has probability below 1e-1000; it is checked anyway.
_VEC_MAX_PARAM = 1 << 48
# The largest pmf table built for analysis (confidence intervals, ε accounting):
# 2**23 doubles, 64 MiB. A distribution wider than that is handled in closed form.
TABLE_MAX = 1 << 23
# Discrete Laplace tables serve only the local-randomization estimates (intervals
# of plain Laplace noise have a closed form); they may be larger, not unbounded.
LAPLACE_TABLE_MAX = 1 << 26


def _int64_array(values: list[int]) -> IntArray:
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        raise InvalidParameter(
            "a draw does not fit in 64 bits: use sample_vec, which returns Python ints"
        ) from None


# Below this many entries np.convolve (exact summation) is cheap; above, FFT.
_DIRECT_CONVOLVE_MAX = 1 << 13


def convolve(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The pmf of the sum of two independent variables given by pmf tables a and b.

    Small tables are summed directly; large ones go through the FFT, whose absolute
    error (~1e-16 times the peak) is far below what quantiles at α >= 1e-9 need.
    """
    if min(a.size, b.size) <= _DIRECT_CONVOLVE_MAX:
        return np.convolve(a, b)
    size = a.size + b.size - 1
    padded = 1 << (size - 1).bit_length()  # pocketfft is slowest on sizes with big primes
    out = np.fft.irfft(np.fft.rfft(a, padded) * np.fft.rfft(b, padded), padded)[:size]
    result: npt.NDArray[np.float64] = np.clip(out, 0.0, None)
    return result


def exact_rational(value: int | Fraction | str, what: str) -> Fraction:
    """`value` as an exact Fraction; refuses floats and bools, names `what` on error."""
    if isinstance(value, bool) or not isinstance(value, int | Fraction | str):
        raise InvalidParameter(
            f"{what} must be an int, a Fraction or a decimal string, "
            f"not {type(value).__name__} ({value!r}); floats are refused because their "
            "binary value is rarely the number meant (write '0.1', not 0.1)"
        )
    try:
        result = Fraction(value)
    except (ValueError, ZeroDivisionError) as exc:
        raise InvalidParameter(f"{what} is not a number: {value!r}") from exc
    return result


def _default_rng(rng: RandomSource | None) -> RandomSource:
    return secrets.SystemRandom() if rng is None else rng


class NoiseDistribution(Protocol):
    """A symmetric integer noise distribution with an exact sampler."""

    def sample(self, rng: RandomSource | None = None) -> int: ...

    def sample_vec(self, n: int, rng: RandomSource | None = None) -> list[int]: ...

    def pmf(self, z: int) -> float: ...

    def variance(self) -> float: ...

    def pmf_table(self) -> npt.NDArray[np.float64]:
        """pmf on [-M, M] (index i is z = i - M), with tail mass beyond M < 1e-15."""
        ...


def _check_count(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidParameter(f"the number of samples must be an int >= 0, got {n!r}")


# --------------------------------------------------------------------------- Laplace


def _dlap_scalar(t: int, s: int, rng: RandomSource) -> int:
    """One DLap(t/s) draw: CKS20 Algorithm 2, literally."""
    while True:
        u = randbelow(rng, t)
        if not bernoulli_exp(Fraction(u, t), rng):
            continue
        v = 0
        while bernoulli_exp(Fraction(1), rng):
            v += 1
        y = (u + t * v) // s
        negative = rng.getrandbits(1) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def _dlap_vec(t: int, s: int, n: int, rng: RandomSource) -> IntArray:
    """n DLap(t/s) draws: CKS20 Algorithm 2 on NumPy lanes (t, s <= 2**40)."""
    parts: list[IntArray] = []
    need = n
    while need > 0:
        # About 60% of proposals survive both rejection steps; draw a few extra.
        m = need + need // 2 + 32
        u = uniform_below_vec(rng, t, m)
        u = u[bernoulli_exp_vec(u, t, rng)]
        v = np.zeros(u.size, dtype=np.int64)
        alive = np.arange(u.size)
        while alive.size:
            alive = alive[bernoulli_exp_one_vec(alive.size, rng)]
            v[alive] += 1
        if u.size and t * (int(v.max()) + 1) > INT64_SAFE:  # pragma: no cover
            # V is geometric with mean 0.58; exceeding 2**22 has probability e**-(2**22).
            parts.append(np.array([_dlap_scalar(t, s, rng) for _ in range(need)]))
            break
        y = (u + t * v) // s
        negative = uniform_below_vec(rng, 2, y.size) == 1
        keep = ~(negative & (y == 0))
        z = np.where(negative, -y, y)[keep][:need]
        parts.append(z.astype(np.int64))
        need -= z.size
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class DiscreteLaplace:
    """Discrete Laplace (two-sided geometric): P(z) = tanh(1/(2·scale)) · exp(-|z|/scale).

    Adding it with scale Δ/ε to an integer query of L1 sensitivity Δ is ε-DP
    (Ghosh, Roughgarden, Sundararajan 2009; CKS20 §2). Sampling is exact (CKS20 Alg. 2).
    """

    scale: Fraction

    def __init__(self, scale: int | Fraction | str) -> None:
        value = exact_rational(scale, "scale")
        if value <= 0:
            raise InvalidParameter(f"the discrete Laplace scale must be > 0, got {value}")
        object.__setattr__(self, "scale", value)

    def sample(self, rng: RandomSource | None = None) -> int:
        """One exact draw."""
        return _dlap_scalar(self.scale.numerator, self.scale.denominator, _default_rng(rng))

    def _vectorised(self) -> bool:
        return self.scale.numerator <= _VEC_MAX_PARAM and self.scale.denominator <= INT64_SAFE

    def sample_array(self, n: int, rng: RandomSource | None = None) -> IntArray:
        """n independent exact draws as an int64 array (InvalidParameter if a draw
        does not fit in 64 bits, possible only past the NumPy lanes' range)."""
        _check_count(n)
        rng = _default_rng(rng)
        if self._vectorised():
            return _dlap_vec(self.scale.numerator, self.scale.denominator, n, rng)
        return _int64_array(self.sample_vec(n, rng))

    def sample_vec(self, n: int, rng: RandomSource | None = None) -> list[int]:
        """n independent exact draws, as Python ints: a scale past the NumPy
        lanes' range (2**48) draws one by one, and its draws may exceed 64 bits."""
        _check_count(n)
        rng = _default_rng(rng)
        t, s = self.scale.numerator, self.scale.denominator
        if self._vectorised():
            return [int(z) for z in _dlap_vec(t, s, n, rng).tolist()]
        return [_dlap_scalar(t, s, rng) for _ in range(n)]

    @property
    def decay(self) -> float:
        """q = exp(-1/scale), the ratio of successive probabilities."""
        return math.exp(-float(1 / self.scale))

    def pmf(self, z: int) -> float:
        """P(Z = z) = (1-q)/(1+q) · q**|z|, evaluated in double precision."""
        inv = 1 / float(self.scale)
        return math.tanh(inv / 2) * math.exp(-abs(z) * inv)

    def variance(self) -> float:
        """2q/(1-q)², with 1 - q = -expm1(-1/scale) (exact to double precision
        however large the scale)."""
        x = float(1 / self.scale)
        return 2 * math.exp(-x) / math.expm1(-x) ** 2

    def pmf_table(self) -> npt.NDArray[np.float64]:
        """pmf on [-M, M] with P(|Z| > M) = 2q**(M+1)/(1+q) < 1e-15 (InvalidParameter
        past LAPLACE_TABLE_MAX entries: a scale above about 950,000)."""
        inv = float(1 / self.scale)
        bound = math.ceil(math.log(PMF_TAIL / 2) / -inv)
        if 2 * bound + 1 > LAPLACE_TABLE_MAX:
            raise InvalidParameter(
                f"a pmf table of the discrete Laplace of scale {float(self.scale):.3g} would"
                f" hold {2 * bound + 1} entries (at most {LAPLACE_TABLE_MAX})"
            )
        z = np.arange(-bound, bound + 1)
        table: npt.NDArray[np.float64] = np.tanh(inv / 2) * np.exp(-np.abs(z) * inv)
        return table

    def split(self, shares: int = 2) -> PolyaDifference:
        """The per-share distribution: `shares` independent draws sum to this one."""
        return PolyaDifference(self.scale, shares)


# --------------------------------------------------------------------------- Gaussian


def _dgauss_accept(y: int, sigma2: Fraction, t: int, rng: RandomSource) -> bool:
    return bernoulli_exp((abs(y) - sigma2 / t) ** 2 / (2 * sigma2), rng)


def _dgauss_scalar(sigma2: Fraction, rng: RandomSource) -> int:
    """One N_Z(0, σ²) draw: CKS20 Algorithm 3 (proposal DLap(t), t = floor(σ) + 1)."""
    t = _gauss_proposal_scale(sigma2)
    while True:
        y = _dlap_scalar(t, 1, rng)
        if _dgauss_accept(y, sigma2, t, rng):
            return y


def _gauss_proposal_scale(sigma2: Fraction) -> int:
    # floor(sqrt(x)) == isqrt(floor(x)), so floor(σ) is exact without a square root.
    return math.isqrt(sigma2.numerator // sigma2.denominator) + 1


def _dgauss_vec(sigma2: Fraction, n: int, rng: RandomSource) -> IntArray:
    """n N_Z(0, σ²) draws: CKS20 Algorithm 3 on NumPy lanes."""
    t = _gauss_proposal_scale(sigma2)
    a, b = sigma2.numerator, sigma2.denominator
    # Acceptance exponent (|y| - σ²/t)² / (2σ²) = (|y|·b·t - a)² / (2·a·b·t²) = num/den.
    den = 2 * a * b * t * t
    parts: list[IntArray] = []
    need = n
    while need > 0:
        # Acceptance is at least ~0.5 for the CKS20 choice of t; oversample.
        m = 2 * need + 32
        y = _dlap_vec(t, 1, m, rng)
        top = int(np.abs(y).max()) if y.size else 0
        num: IntArray | ObjArray
        # max(top, 1) keeps b·t itself in range too; den must fit for num // den.
        if (max(top, 1) * b * t + a) ** 2 > INT64_SAFE or den > INT64_SAFE:
            # Past 64 bits: the same arithmetic on Python ints in object lanes.
            num = (np.abs(y).astype(object) * (b * t) - a) ** 2
        else:
            num = (np.abs(y) * (b * t) - a) ** 2
        accept = _bernoulli_exp_fraction_vec(num, den, rng)
        z = y[accept][:need]
        parts.append(z)
        need -= z.size
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _bernoulli_exp_fraction_vec(num: IntArray | ObjArray, den: int, rng: RandomSource) -> BoolArray:
    """Lane-wise Bernoulli(exp(-num/den)) for any num >= 0 (CKS20 Alg. 1, γ > 1 case)."""
    whole = num // den
    ok = np.ones(num.size, dtype=np.bool_)
    # exp(-γ) = exp(-1)**floor(γ) · exp(-frac(γ)): every factor must succeed.
    rounds = int(whole.max()) if num.size else 0
    for j in range(1, rounds + 1):
        lanes = np.flatnonzero(ok & np.asarray(whole >= j, dtype=np.bool_))
        if not lanes.size:
            break
        ok[lanes] = bernoulli_exp_one_vec(lanes.size, rng)
    lanes = np.flatnonzero(ok)
    ok[lanes] = bernoulli_exp_vec(num[lanes] - whole[lanes] * den, den, rng)
    return ok


@dataclass(frozen=True)
class DiscreteGaussian:
    """Discrete Gaussian N_Z(0, σ²): P(z) ∝ exp(-z²/(2σ²)) (CKS20).

    Adding it to an integer query of L2 sensitivity Δ₂ is (Δ₂²/(2σ²))-zCDP (CKS20
    Theorem 4). Only σ² enters the algorithm, so σ² is what is kept; a rational σ² is
    all that is needed (and `from_sigma_squared` builds one from Δ₂²/(2ρ) exactly).
    """

    sigma_squared: Fraction

    def __init__(self, sigma: int | Fraction | str) -> None:
        value = exact_rational(sigma, "sigma")
        if value <= 0:
            raise InvalidParameter(f"the discrete Gaussian sigma must be > 0, got {value}")
        object.__setattr__(self, "sigma_squared", value * value)

    @classmethod
    def from_sigma_squared(cls, sigma_squared: int | Fraction | str) -> DiscreteGaussian:
        """The discrete Gaussian with variance parameter σ² (need not be a square)."""
        value = exact_rational(sigma_squared, "sigma_squared")
        if value <= 0:
            raise InvalidParameter(f"sigma_squared must be > 0, got {value}")
        self = cls.__new__(cls)
        object.__setattr__(self, "sigma_squared", value)
        return self

    def sample(self, rng: RandomSource | None = None) -> int:
        """One exact draw."""
        return _dgauss_scalar(self.sigma_squared, _default_rng(rng))

    def _vectorised(self) -> bool:
        return _gauss_proposal_scale(self.sigma_squared) <= _VEC_MAX_PARAM

    def sample_array(self, n: int, rng: RandomSource | None = None) -> IntArray:
        """n independent exact draws as an int64 array (InvalidParameter if a draw
        does not fit in 64 bits, possible only past the NumPy lanes' range)."""
        _check_count(n)
        rng = _default_rng(rng)
        if self._vectorised():
            return _dgauss_vec(self.sigma_squared, n, rng)
        return _int64_array(self.sample_vec(n, rng))

    def sample_vec(self, n: int, rng: RandomSource | None = None) -> list[int]:
        """n independent exact draws, as Python ints (one by one past σ = 2**48)."""
        _check_count(n)
        rng = _default_rng(rng)
        if self._vectorised():
            return [int(z) for z in _dgauss_vec(self.sigma_squared, n, rng).tolist()]
        return [_dgauss_scalar(self.sigma_squared, rng) for _ in range(n)]

    def _bound(self) -> int:
        # Past M the unnormalised terms are below exp(-M²/(2σ²)) = 1e-40 and decay
        # faster than geometrically; the normaliser is >= 1.
        return math.ceil(math.sqrt(2 * float(self.sigma_squared) * 40 * math.log(10))) + 1

    @property
    def tabulable(self) -> bool:
        """Whether the pmf table (2M + 1 doubles) stays within TABLE_MAX entries:
        σ up to about 300,000. Past it, the closed forms serve instead."""
        return 2 * self._bound() + 1 <= TABLE_MAX

    @functools.cached_property
    def _table(self) -> npt.NDArray[np.float64]:
        if not self.tabulable:
            raise InvalidParameter(
                "a pmf table of the discrete Gaussian with sigma^2 ="
                f" {float(self.sigma_squared):.3g} would hold {2 * self._bound() + 1} entries"
                f" (at most {TABLE_MAX})"
            )
        bound = self._bound()
        z = np.arange(-bound, bound + 1, dtype=np.float64)
        weights = np.exp(-(z**2) / (2 * float(self.sigma_squared)))
        return weights / math.fsum(weights.tolist())

    def pmf(self, z: int) -> float:
        """exp(-z²/(2σ²)) / Σ_y exp(-y²/(2σ²)), the sum truncated below 1e-17
        (past the table's size, the normaliser is √(2π)σ: by Poisson summation
        the two differ by a factor 1 + 2·exp(-2π²σ²) + ..., which is 1 in double
        precision for σ > 2)."""
        bound = self._bound()
        if abs(z) > bound:
            return 0.0
        if not self.tabulable:
            s2 = float(self.sigma_squared)
            return math.exp(-(z * z) / (2 * s2)) / math.sqrt(2 * math.pi * s2)
        return float(self._table[z + bound])

    def variance(self) -> float:
        """Σ z² P(z) (slightly below σ², CKS20 Corollary 9; σ² itself where the
        difference is below double precision, past the table's size)."""
        if not self.tabulable:
            return float(self.sigma_squared)
        table = self._table
        z = np.arange(table.size) - (table.size - 1) // 2
        return float(np.dot(z.astype(np.float64) ** 2, table))

    def pmf_table(self) -> npt.NDArray[np.float64]:
        """pmf on [-M, M] with tail mass beyond M < 1e-15."""
        return self._table.copy()


# --------------------------------------------------------------------------- Polya


#
# NB(r, q) with r = 1/shares has P(k) = c_k (1-q)**r q**k, c_k = Π_{i=1..k} (i-1+r)/i.
# With q = exp(-1/scale) irrational there is no exact rational pmf to invert, so the
# sampler is an inverse CDF on *rigorous bounds*: U is a uniform real revealed a few
# bits at a time, F(k) is bracketed by integers at 2**-prec from interval bounds on
# q (exp_neg_bounds), and a comparison U < F(k) is only decided when the bracket of
# F(k) lies entirely on one side of U's known bits. Undecided comparisons draw more
# bits of U and tighten F(k); both happen with probability ~2**-60 per draw. Every
# decision is therefore exactly the comparison with the real F(k): the samples are
# distributed exactly as NB(r, q), with no floating point anywhere.
#
# For speed, bounds for the first F(k) at 2**-63 are tabulated once per parameter,
# and a 63-bit U is located in the table with a binary search; lanes that the table
# cannot decide (or that fall in the tail beyond it) finish on the exact path.

_TABLE_PREC = 63
_TABLE_MAX = 1 << 20
_TABLE_TAIL = (1 << _TABLE_PREC) - (1 << 23)  # stop once the tail is below 2**-40


def _polya_cdf_bounds(shares: int, x: Fraction, prec: int) -> Iterator[tuple[int, int]]:
    """Yield (lo, hi) with lo <= 2**prec · F(k) <= hi for k = 0, 1, 2, ...

    F is the CDF of NB(1/shares, exp(-x)). Fixed-point arithmetic at w bits, with
    every rounding directed outwards, keeps lo and hi rigorous; w - prec = 64 guard
    bits keep hi - lo at a few units for any k below 2**50.
    """
    n = shares
    w = prec + 64
    one = 1 << w
    q_lo, q_hi = exp_neg_bounds(x, w)
    term_lo = term_hi = one  # c_k q**k at scale 2**w
    sum_lo = sum_hi = 0
    # F = ((1-q) · S**n) ** (1/n); at scale 2**prec that is (A / 2**e) ** (1/n).
    e = w * (n + 1) - n * prec
    k = 0
    while True:
        sum_lo += term_lo
        sum_hi += term_hi
        a_lo = (one - q_hi) * sum_lo**n
        a_hi = (one - q_lo) * sum_hi**n
        yield iroot(a_lo >> e, n), iroot(-((-a_hi) >> e), n) + 1
        k += 1
        num, den = n * (k - 1) + 1, (n * k) << w  # c_k / c_{k-1} = (k-1+1/n)/k
        term_lo = (term_lo * q_lo * num) // den
        term_hi = -((-term_hi * q_hi * num) // den)


def _polya_exact_from(
    shares: int, x: Fraction, u: int, bits: int, k_start: int, rng: RandomSource
) -> int:
    """The least k >= k_start with U < F(k), where U's first `bits` bits are u.

    Precondition: U >= F(k) is already known for every k < k_start.
    """
    while True:
        prec = bits + 32
        u_lo, u_hi = u << 32, (u + 1) << 32
        k = 0
        for k, (lo, hi) in enumerate(_polya_cdf_bounds(shares, x, prec)):
            if k < k_start:
                continue
            if u_hi <= lo:
                return k  # U < u_hi / 2**prec <= F(k)
            if u_lo < hi:
                break  # undecided: reveal more of U and tighten F
            # Otherwise U >= u_lo / 2**prec >= F(k): try the next k.
        k_start = k
        u = (u << 32) | rng.getrandbits(32)
        bits += 32


@functools.lru_cache(maxsize=64)
def _polya_table(shares: int, x: Fraction) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    los: list[int] = []
    his: list[int] = []
    for lo, hi in _polya_cdf_bounds(shares, x, _TABLE_PREC):
        los.append(lo)
        his.append(hi)
        if lo >= _TABLE_TAIL or len(los) >= _TABLE_MAX:
            break
    lo_arr = np.array(los, dtype=np.uint64)
    hi_arr = np.array(his, dtype=np.uint64)
    lo_arr.flags.writeable = False
    hi_arr.flags.writeable = False
    return lo_arr, hi_arr


def _polya_vec(shares: int, x: Fraction, n: int, rng: RandomSource) -> IntArray:
    lo, hi = _polya_table(shares, x)
    u = random_words(rng, n) >> np.uint64(64 - _TABLE_PREC)
    # k_lo: first k with lo_k >= u + 1, where U < F(k) is certain.
    # k_hi: first k with hi_k > u; U >= F(k) is certain for every k below it.
    k_lo = np.searchsorted(lo, u + np.uint64(1), side="left")
    k_hi = np.searchsorted(hi, u, side="right")
    out = k_lo.astype(np.int64)
    for i in np.flatnonzero((k_lo != k_hi) | (k_lo >= lo.size)).tolist():
        out[i] = _polya_exact_from(shares, x, int(u[i]), _TABLE_PREC, int(k_hi[i]), rng)
    return out


def _check_shares(shares: int) -> int:
    if isinstance(shares, bool) or not isinstance(shares, int) or shares < 1:
        raise InvalidParameter(f"shares must be an int >= 1, got {shares!r}")
    return shares


def _positive_scale(scale: int | Fraction | str) -> Fraction:
    value = exact_rational(scale, "scale")
    if value <= 0:
        raise InvalidParameter(f"the scale must be > 0, got {value}")
    return value


@dataclass(frozen=True)
class Polya:
    """Negative binomial (Pólya) NB(r = 1/shares, q = exp(-1/scale)).

    P(k) = Γ(k+r)/(Γ(r) k!) · (1-q)**r · q**k for k >= 0. `shares` independent copies
    sum to a geometric variable with P(k) = (1-q) q**k. Sampled exactly by inverse CDF
    against rigorous bounds (see the comment above `_polya_cdf_bounds`).
    """

    scale: Fraction
    shares: int

    def __init__(self, scale: int | Fraction | str, shares: int = 2) -> None:
        object.__setattr__(self, "scale", _positive_scale(scale))
        object.__setattr__(self, "shares", _check_shares(shares))

    @property
    def _x(self) -> Fraction:
        return 1 / self.scale

    def sample(self, rng: RandomSource | None = None) -> int:
        """One exact draw, by the untabulated exact path (the reference)."""
        rng = _default_rng(rng)
        return _polya_exact_from(self.shares, self._x, rng.getrandbits(63), 63, 0, rng)

    def sample_array(self, n: int, rng: RandomSource | None = None) -> IntArray:
        """n independent exact draws as an int64 array (tabulated path)."""
        _check_count(n)
        return _polya_vec(self.shares, self._x, n, _default_rng(rng))

    def sample_vec(self, n: int, rng: RandomSource | None = None) -> list[int]:
        """n independent exact draws."""
        return [int(k) for k in self.sample_array(n, rng).tolist()]

    def variance(self) -> float:
        """r q / (1-q)², r = 1/shares."""
        q = math.exp(-1 / float(self.scale))
        return q / (self.shares * (1 - q) ** 2)

    @functools.cached_property
    def _pmf_array(self) -> npt.NDArray[np.float64]:
        return self.pmf_array()

    def pmf_array(self) -> npt.NDArray[np.float64]:
        """P(0), P(1), ..., P(K) with the tail beyond K below 1e-17."""
        x = 1 / float(self.scale)
        r = 1 / self.shares
        log_q = -x
        bound = math.ceil((math.log(1e-17) + math.log(-math.expm1(-x))) / log_q) + 1
        k = np.arange(bound + 1, dtype=np.float64)
        # ln c_k = Σ_{i=1..k} ln((i - 1 + r) / i), accumulated (log1p keeps each term
        # accurate: (i-1+r)/i = 1 - (1-r)/i).
        steps = np.log1p(-(1 - r) / k[1:])
        log_c = np.concatenate(([0.0], np.cumsum(steps)))
        table: npt.NDArray[np.float64] = np.exp(log_c + r * math.log(-math.expm1(-x)) + k * log_q)
        return table

    def pmf(self, k: int) -> float:
        """P(K = k) in double precision."""
        if k < 0:
            return 0.0
        x = 1 / float(self.scale)
        r = 1 / self.shares
        log_p = math.lgamma(k + r) - math.lgamma(r) - math.lgamma(k + 1)
        return math.exp(log_p + r * math.log(-math.expm1(-x)) - k * x)


@dataclass(frozen=True)
class PolyaDifference:
    """X - Y for independent X, Y ~ NB(1/shares, exp(-1/scale)).

    The sum of `shares` independent copies is exactly DiscreteLaplace(scale): this is
    one aggregator's share of the noise in the `split` mode.
    """

    scale: Fraction
    shares: int

    def __init__(self, scale: int | Fraction | str, shares: int = 2) -> None:
        object.__setattr__(self, "scale", _positive_scale(scale))
        object.__setattr__(self, "shares", _check_shares(shares))

    @property
    def polya(self) -> Polya:
        """The distribution of each of the two terms."""
        return Polya(self.scale, self.shares)

    def sample(self, rng: RandomSource | None = None) -> int:
        """One exact draw."""
        rng = _default_rng(rng)
        return self.polya.sample(rng) - self.polya.sample(rng)

    def sample_array(self, n: int, rng: RandomSource | None = None) -> IntArray:
        """n independent exact draws as an int64 array."""
        both = self.polya.sample_array(2 * n, rng)
        return both[:n] - both[n:]

    def sample_vec(self, n: int, rng: RandomSource | None = None) -> list[int]:
        """n independent exact draws."""
        return [int(z) for z in self.sample_array(n, rng).tolist()]

    @functools.cached_property
    def _polya_pmf(self) -> npt.NDArray[np.float64]:
        return self.polya.pmf_array()

    @functools.cached_property
    def _table(self) -> npt.NDArray[np.float64]:
        p = self._polya_pmf
        return convolve(p, p[::-1])

    def pmf(self, z: int) -> float:
        """P(X - Y = z) = Σ_j P(j) P(j + |z|), summed directly in double precision.

        Every term is positive, so the result is accurate in relative terms even far
        in the tail (which the privacy-loss computation of the split mode relies on).
        """
        p = self._polya_pmf
        d = abs(z)
        if d >= p.size:
            return 0.0
        return float(np.dot(p[: p.size - d], p[d:]))

    def variance(self) -> float:
        """2 r q / (1-q)², r = 1/shares."""
        q = math.exp(-1 / float(self.scale))
        return 2 * q / (self.shares * (1 - q) ** 2)

    def pmf_table(self) -> npt.NDArray[np.float64]:
        """pmf on [-K, K] with tail mass beyond K below 1e-15."""
        return self._table.copy()
