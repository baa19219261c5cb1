"""Local randomized response: plausible deniability that survives both aggregators.

The servers' noise (veil.dp.mechanisms) protects a respondent only while one aggregator
is honest: two colluding aggregators add their input shares and read every answer. A
question may therefore also randomize each answer on the respondent's device, before
sharding. Then even everyone together (both aggregators and the collector) sees only
an ε_L-locally-private answer (Warner 1965, "Randomized response"; Kasiviswanathan et
al. 2008, "What can we learn privately?", for the local model).

Channels, one per Prio3 type, all of whose outputs are valid measurements of that type
(so the validity proof holds and the aggregators cannot tell randomized reports apart):

- `KaryResponse` (Prio3Count: k = 2, Prio3Histogram: k = length): keep the true option
  with probability r/(r + k - 1), else report one of the k - 1 others uniformly.
  ε_L-LDP, since any output is at most r ≤ e^ε_L times likelier under one input than
  under another.
- `MultiOptionResponse` (Prio3MultihotCountVec): binary randomized response on each
  option's bit at ε_L/d, with d = min(2·max_choices, options) the most bits in which two
  valid answers can differ; by composition the whole answer is ε_L-LDP. The randomized
  vector can have any weight, so the task's Prio3 `max_weight` must equal its length.
- `BoundedResponse` (Prio3Sum, max M): the binary-output mechanism of Duchi, Jordan,
  Wainwright 2013 ("Local privacy and statistical minimax rates", §4.2.3) on a bounded
  integer: report M with probability (M + x(r - 1))/(M(r + 1)), else 0. Each output's
  probability lies in [1/(r+1), r/(r+1)], so it is ε_L-LDP; the expectation is affine
  in x, so the sum de-biases exactly; and the variance does not grow with the range
  as k-ary response over [0, M] would.
- `VectorResponse` (Prio3SumVec): `BoundedResponse` on each coordinate at ε_L/length
  (composition over coordinates).

Exactness: ε_L is rational, e^ε_L is not. Every channel uses a rational odds r ≤ e^ε_L
(`local_odds`, within 2**-64 relative of e^ε_L), so every probability is a rational
number and is sampled exactly by one uniform integer against an integer threshold: no
floats on the sampling path. The guarantee actually delivered is ln r ≤ ε_L.

Estimates: for each coordinate j of the aggregate, E[Y_j] = a·X_j + b·n with X_j the
true aggregate, n the public report count and (a, b) public (`LocalChannel.affine`),
so (Y_j + Z_j - b·n)/a is unbiased, Z_j being the servers' noise (mean 0).
`local_estimate` gives it with an interval that accounts for both the randomization
and the servers' noise:

- Count, Histogram, MultihotCountVec: exact. Given X_j, the observed coordinate is
  Binom(X_j, p) + Binom(n - X_j, q) + Z_j exactly (independent respondents); that family
  is stochastically increasing in X_j, so the interval is the set of X_j in [0, n] not
  rejected by either one-sided test at α/2 (Neyman's construction, the same as the
  Clopper-Pearson interval), found by bisection on the exact convolution. Coverage is
  at least 1 - α.
- Sum, SumVec: the randomized part is a sum of n independent terms in {0, M} whose law
  depends on every answer, not just on their sum, so a stated conservative bound is
  used instead: Hoeffding's inequality at α/2 for the randomization, the exact noise
  quantile at α/2 for the servers' noise, and the union bound. Coverage ≥ 1 - α.

Randomness: `secrets.SystemRandom()` unless an rng is injected (tests only).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from veil.dp._exact import RandomSource, exp_neg_bounds, randbelow
from veil.dp.errors import InvalidParameter
from veil.dp.estimates import MIN_ALPHA, Estimate, noise_half_width
from veil.dp.mechanisms import MAX_EPSILON, MIN_EPSILON, Mechanism, NoisePlan, parse_budget

__all__ = [
    "BoundedResponse",
    "KaryResponse",
    "LocalChannel",
    "MultiOptionResponse",
    "VectorResponse",
    "breakdown_error",
    "breakdown_estimate",
    "breakdown_half_width",
    "local_channel",
    "local_error",
    "local_estimate",
    "local_odds",
    "parse_local_epsilon",
]

# Precision of the rational odds r ≤ e^ε: r is within 2**-ODDS_BITS (relative) of e^ε.
ODDS_BITS = 64
# Tail mass that the windowed binomial tables leave out: 2·exp(-2·WINDOW_SIGMAS²) by
# Hoeffding's inequality, about 4e-22, far below any α the intervals accept.
_WINDOW_SIGMAS = 5.0


def parse_local_epsilon(
    value: int | float | Fraction | str, what: str = "local_epsilon"
) -> Fraction:
    """ε_L of a whole answer as an exact Fraction in [1/1000, 20], the range of a central
    ε (below it nothing survives); a float is read as the decimal it prints as."""
    return parse_budget(value, what, MAX_EPSILON, MIN_EPSILON)


def _part_epsilon(value: int | float | Fraction | str) -> Fraction:
    # The channels themselves take any ε in (0, 20]: a multi-choice bit or a vector
    # element gets ε_L divided by up to 10**5, far below what a whole answer may have.
    return parse_budget(value, "local_epsilon", MAX_EPSILON)


def local_odds(epsilon: Fraction) -> Fraction:
    """A rational r with e^ε·(1 - 2**-60) < r ≤ e^ε, for ε > 0.

    exp_neg_bounds gives hi ≥ 2**bits·e^-ε, so r = 2**bits/hi ≤ e^ε: the channel built on
    r is ln(r)-LDP with ln(r) ≤ ε, never more. r > 1 for every ε ≥ 2**-60.
    """
    if epsilon <= 0:
        raise InvalidParameter(f"local ε must be > 0, got {epsilon}")
    # 2**bits·e^-ε stays above 2**ODDS_BITS, so rounding hi up costs < 2**-ODDS_BITS.
    bits = ODDS_BITS + math.ceil(epsilon / Fraction(693, 1000))
    _, hi = exp_neg_bounds(epsilon, bits)
    odds = Fraction(1 << bits, hi)
    if odds <= 1:
        raise InvalidParameter(f"local ε = {epsilon} is too small to randomize with any signal")
    return odds


def _rng(rng: RandomSource | None) -> RandomSource:
    return secrets.SystemRandom() if rng is None else rng


class LocalChannel(Protocol):
    """A randomized response channel on the measurements of one Prio3 type."""

    @property
    def epsilon(self) -> Fraction:
        """ε_L that holds for one whole answer (against everyone)."""
        ...

    @property
    def exact_intervals(self) -> bool:
        """Whether `local_estimate` inverts the exact distribution (else: a bound)."""
        ...

    @property
    def scale(self) -> int:
        """Each respondent's randomized coordinate is in {0, scale}."""
        ...

    def randomize(self, measurement: Any, rng: RandomSource | None = None) -> Any:
        """The randomized measurement (a valid measurement of the same Prio3 type)."""
        ...

    def affine(self, coordinate: int) -> tuple[Fraction, Fraction]:
        """(a, b) with E[Y_j] = a·X_j + b·n for coordinate j (Y: randomized aggregate)."""
        ...

    def bit_probabilities(self, coordinate: int) -> tuple[Fraction, Fraction]:
        """(p, q): P(coordinate j reports 1 | true bit 1) and (| true bit 0).

        Only for channels with exact intervals (every coordinate a 0/1 per report).
        """
        ...


def _check_int(value: int, what: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidParameter(f"{what} must be an int >= {low}, got {value!r}")
    return value


@dataclass(frozen=True)
class KaryResponse:
    """k-ary randomized response on an option index in [0, k).

    P(keep) = r/(r + k - 1), P(each other option) = 1/(r + k - 1), with r = local_odds(ε).
    For k = 2 on a 0/1 count this is Warner's randomized response.
    """

    k: int
    epsilon: Fraction
    odds: Fraction

    def __init__(self, k: int, epsilon: int | float | Fraction | str) -> None:
        object.__setattr__(self, "k", _check_int(k, "the number of options", 2))
        eps = _part_epsilon(epsilon)
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "odds", local_odds(eps))

    exact_intervals = True
    scale = 1

    @property
    def keep(self) -> Fraction:
        """P(report the true option)."""
        return self.odds / (self.odds + self.k - 1)

    @property
    def other(self) -> Fraction:
        """P(report one given other option)."""
        return 1 / (self.odds + self.k - 1)

    def sample_index(self, index: int, rng: RandomSource | None = None) -> int:
        """The randomized option index."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.k:
            raise InvalidParameter(f"option index must be an int in [0, {self.k}), got {index!r}")
        top, bottom = self.odds.numerator, self.odds.denominator
        # One uniform integer on [0, top + (k-1)·bottom): the first `top` values keep the
        # answer, each further block of `bottom` values is one other option.
        u = randbelow(_rng(rng), top + (self.k - 1) * bottom)
        if u < top:
            return index
        other = (u - top) // bottom
        return other if other < index else other + 1

    def randomize(self, measurement: Any, rng: RandomSource | None = None) -> Any:
        """A count's 0/1 or a histogram's option index (an int, as Prio3 takes it)."""
        return self.sample_index(measurement, rng)

    def transition(self) -> list[list[Fraction]]:
        """The exact transition matrix: row = true option, column = reported option."""
        return [[self.keep if i == j else self.other for j in range(self.k)] for i in range(self.k)]

    def affine(self, coordinate: int) -> tuple[Fraction, Fraction]:
        return self.keep - self.other, self.other

    def bit_probabilities(self, coordinate: int) -> tuple[Fraction, Fraction]:
        return self.keep, self.other


@dataclass(frozen=True)
class MultiOptionResponse:
    """Binary randomized response on each option of a multi-choice answer.

    Each bit at ε_L/d, d = min(2·max_choices, length): two answers of at most
    max_choices options differ in at most d bits, so the whole answer is ε_L-LDP.
    """

    length: int
    max_choices: int
    epsilon: Fraction
    bit: KaryResponse

    def __init__(
        self, length: int, max_choices: int, epsilon: int | float | Fraction | str
    ) -> None:
        _check_int(length, "the number of options", 1)
        _check_int(max_choices, "max_choices", 1)
        if max_choices > length:
            raise InvalidParameter(f"max_choices ({max_choices}) exceeds the options ({length})")
        eps = _part_epsilon(epsilon)
        object.__setattr__(self, "length", length)
        object.__setattr__(self, "max_choices", max_choices)
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "bit", KaryResponse(2, eps / self.differing_bits))

    exact_intervals = True
    scale = 1

    @property
    def differing_bits(self) -> int:
        """d: the most bits in which two valid answers differ."""
        return min(2 * self.max_choices, self.length)

    def randomize(self, measurement: Any, rng: RandomSource | None = None) -> list[bool]:
        """The bit vector with each bit randomized independently (any weight)."""
        bits = list(measurement)
        if len(bits) != self.length or any(
            not isinstance(b, bool | int) or b not in (0, 1) for b in bits
        ):
            raise InvalidParameter(f"a multi-choice answer is {self.length} bits of 0/1")
        if sum(bits) > self.max_choices:
            raise InvalidParameter(
                f"a multi-choice answer has at most {self.max_choices} options, got {sum(bits)}"
            )
        source = _rng(rng)
        return [self.bit.sample_index(int(b), source) == 1 for b in bits]

    def affine(self, coordinate: int) -> tuple[Fraction, Fraction]:
        return self.bit.affine(0)

    def bit_probabilities(self, coordinate: int) -> tuple[Fraction, Fraction]:
        return self.bit.keep, self.bit.other


@dataclass(frozen=True)
class BoundedResponse:
    """Binary-output randomized response on an integer x in [0, M] (Duchi et al. 2013).

    Reports M with probability (M + x(r - 1))/(M(r + 1)), else 0; E[output] =
    x(r - 1)/(r + 1) + M/(r + 1).
    """

    max_measurement: int
    epsilon: Fraction
    odds: Fraction

    def __init__(self, max_measurement: int, epsilon: int | float | Fraction | str) -> None:
        object.__setattr__(self, "max_measurement", _check_int(max_measurement, "max", 1))
        eps = _part_epsilon(epsilon)
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "odds", local_odds(eps))

    exact_intervals = False

    @property
    def scale(self) -> int:
        return self.max_measurement

    def high_probability(self, x: int) -> Fraction:
        """P(report M | x)."""
        m, r = self.max_measurement, self.odds
        return (m + x * (r - 1)) / (m * (r + 1))

    def sample_value(self, x: int, rng: RandomSource | None = None) -> int:
        m = self.max_measurement
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= m:
            raise InvalidParameter(f"the value must be an int in [0, {m}], got {x!r}")
        top, bottom = self.odds.numerator, self.odds.denominator
        # P(M) = (m·bottom + x(top - bottom)) / (m(top + bottom)), an integer ratio.
        u = randbelow(_rng(rng), m * (top + bottom))
        return m if u < m * bottom + x * (top - bottom) else 0

    def randomize(self, measurement: Any, rng: RandomSource | None = None) -> Any:
        return self.sample_value(measurement, rng)

    def affine(self, coordinate: int) -> tuple[Fraction, Fraction]:
        r = self.odds
        return (r - 1) / (r + 1), self.max_measurement / (r + 1)

    def bit_probabilities(self, coordinate: int) -> tuple[Fraction, Fraction]:
        raise InvalidParameter("bounded response has no per-bit law; its intervals are bounds")


@dataclass(frozen=True)
class VectorResponse:
    """`BoundedResponse` on each of `length` coordinates at ε_L/length."""

    length: int
    max_measurement: int
    epsilon: Fraction
    coordinate: BoundedResponse

    def __init__(
        self, length: int, max_measurement: int, epsilon: int | float | Fraction | str
    ) -> None:
        _check_int(length, "length", 1)
        eps = _part_epsilon(epsilon)
        object.__setattr__(self, "length", length)
        object.__setattr__(self, "max_measurement", _check_int(max_measurement, "max", 1))
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "coordinate", BoundedResponse(max_measurement, eps / length))

    exact_intervals = False

    @property
    def scale(self) -> int:
        return self.max_measurement

    def randomize(self, measurement: Any, rng: RandomSource | None = None) -> list[int]:
        values = list(measurement)
        if len(values) != self.length:
            raise InvalidParameter(f"a vector answer has {self.length} values, got {len(values)}")
        source = _rng(rng)
        return [self.coordinate.sample_value(v, source) for v in values]

    def affine(self, coordinate: int) -> tuple[Fraction, Fraction]:
        return self.coordinate.affine(0)

    def bit_probabilities(self, coordinate: int) -> tuple[Fraction, Fraction]:
        raise InvalidParameter("bounded response has no per-bit law; its intervals are bounds")


def local_channel(
    vdaf: str,
    params: Mapping[str, int],
    epsilon: int | float | Fraction | str,
    max_choices: int | None = None,
) -> LocalChannel:
    """The channel for a Prio3 type (named as in veil.dp.sensitivity) at ε_L.

    For Prio3MultihotCountVec, `max_choices` is how many options a respondent may pick;
    the type's own `max_weight` must be its `length`, since randomized vectors can have
    any weight.
    """

    epsilon = parse_local_epsilon(epsilon)

    def need(name: str) -> int:
        if name not in params:
            raise InvalidParameter(f"{vdaf} needs {name!r} for local randomized response")
        return _check_int(params[name], name, 1)

    if vdaf == "Prio3Count":
        return KaryResponse(2, epsilon)
    if vdaf == "Prio3Histogram":
        return KaryResponse(need("length"), epsilon)
    if vdaf == "Prio3MultihotCountVec":
        length = need("length")
        if need("max_weight") != length:
            raise InvalidParameter(
                "with local randomized response a multi-choice task's max_weight must equal "
                f"its length ({length}): randomized answers can have any number of options"
            )
        return MultiOptionResponse(length, length if max_choices is None else max_choices, epsilon)
    if vdaf == "Prio3Sum":
        return BoundedResponse(need("max_measurement"), epsilon)
    if vdaf.startswith("Prio3SumVec"):
        return VectorResponse(need("length"), need("max_measurement"), epsilon)
    raise InvalidParameter(f"no local randomized response is defined for {vdaf!r}")


# --------------------------------------------------------------------------- estimates


def _binomial_window(trials: int, p: float) -> tuple[int, npt.NDArray[np.float64]]:
    """(start, pmf) of Binom(trials, p) on a window holding all but ~4e-22 of its mass.

    Built from the ratios P(k+1)/P(k) = (trials - k)/(k + 1) · p/(1 - p) in log space
    from the window's start and normalised by their sum: no factorials, so any
    `trials` works and the table has about 10·sqrt(trials) entries.
    """
    if trials == 0 or p == 0.0:
        return 0, np.ones(1)
    if p == 1.0:
        return trials, np.ones(1)
    half = math.ceil(_WINDOW_SIGMAS * math.sqrt(trials)) + 1
    mean = trials * p
    lo = max(0, math.floor(mean) - half)
    hi = min(trials, math.ceil(mean) + half)
    k = np.arange(lo, hi, dtype=np.float64)
    steps = np.log((trials - k) / (k + 1)) + math.log(p / (1 - p))
    logs = np.concatenate(([0.0], np.cumsum(steps)))
    logs -= logs.max()
    weights = np.exp(logs)
    return lo, weights / weights.sum()


def _convolve(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Direct summation while it is cheap, else the FFT (veil.dp.distributions.convolve
    switches on the smaller size only; two tables of a few thousand entries each are
    already faster through the FFT, and its ~1e-16 absolute error is far below α/2)."""
    if a.size * b.size <= 1 << 18:
        return np.convolve(a, b)
    size = a.size + b.size - 1
    padded = 1 << (size - 1).bit_length()
    out = np.fft.irfft(np.fft.rfft(a, padded) * np.fft.rfft(b, padded), padded)[:size]
    result: npt.NDArray[np.float64] = np.clip(out, 0.0, None)
    return result


class _ExactFamily:
    """W_X = Binom(X, p) + Binom(n - X, q) + Z for X in [0, n]: tail probabilities."""

    def __init__(self, n: int, p: float, q: float, plan: NoisePlan) -> None:
        self.n, self.p, self.q = n, p, q
        centre, table = plan.total_noise_pmf()
        self.noise_start = -centre
        # cdf[i] = P(Z <= i - centre)
        self.noise_cdf = np.minimum(np.cumsum(table), 1.0)

    def _noise_cdf_at(self, t: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        idx = t - self.noise_start
        out = np.where(idx < 0, 0.0, self.noise_cdf[np.clip(idx, 0, self.noise_cdf.size - 1)])
        return np.asarray(out, dtype=np.float64)

    def at_most(self, x: int, w: int) -> float:
        """P(W_X <= w)."""
        s1, b1 = _binomial_window(x, self.p)
        s2, b2 = _binomial_window(self.n - x, self.q)
        rr = _convolve(b1, b2)
        values = np.arange(s1 + s2, s1 + s2 + rr.size, dtype=np.int64)
        return float(np.dot(rr, self._noise_cdf_at(w - values)))

    def at_least(self, x: int, w: int) -> float:
        """P(W_X >= w)."""
        return 1.0 - self.at_most(x, w - 1)


def _exact_interval(family: _ExactFamily, w: int, alpha: float) -> tuple[int, int]:
    """The X in [0, n] that neither one-sided test at alpha/2 rejects (bisection).

    P(W_X >= w) increases with X and P(W_X <= w) decreases, so each bound is one
    bisection. If a test rejects every X (w far outside), the interval is the end
    of [0, n] nearest to w, which only adds coverage.
    """
    n, half = family.n, alpha / 2
    # Lower: least X with P(W_X >= w) > alpha/2.
    if family.at_least(n, w) <= half:
        return n, n
    lo, hi = -1, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if family.at_least(mid, w) > half:
            hi = mid
        else:
            lo = mid
    low = hi
    # Upper: greatest X with P(W_X <= w) > alpha/2.
    if family.at_most(0, w) <= half:
        return 0, 0
    lo, hi = 0, n + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if family.at_most(mid, w) > half:
            lo = mid
        else:
            hi = mid
    return low, lo


def local_estimate(
    noised: Sequence[int],
    report_count: int,
    channel: LocalChannel,
    plan: NoisePlan,
    alpha: float = 0.05,
) -> list[Estimate]:
    """De-biased per-coordinate estimates with (1 - alpha) intervals.

    `noised` is the decoded aggregate (randomized answers plus the servers' noise),
    `report_count` the public number of reports in it. The value is unbiased; the
    interval accounts for both the randomization and the servers' noise (exactly for
    0/1 coordinates, by a stated bound for sums: see the module docstring), covers
    with probability at least 1 - alpha, and lies within the feasible range. As with
    `estimate`, pass alpha/k for simultaneous coverage of k coordinates.
    """
    if not MIN_ALPHA <= alpha < 1:
        raise InvalidParameter(f"alpha must be in [{MIN_ALPHA}, 1), got {alpha}")
    _check_int(report_count, "report_count", 0)
    n = report_count
    unit = Fraction(1)
    if plan.config.mechanism is Mechanism.LAPLACE:
        unit = Fraction(1, 1 << plan.config.fixed_point_bits)
    top = n * channel.scale
    out: list[Estimate] = []
    bound_width: Fraction | None = None
    for j, y in enumerate(noised):
        a, b = channel.affine(j)
        value = (y - b * n) / a
        if channel.exact_intervals:
            p, q = channel.bit_probabilities(j)
            low, high = _exact_interval(_ExactFamily(n, float(p), float(q), plan), y, alpha)
            out.append(Estimate(value * unit, low * unit, high * unit, 1 - alpha, 1 - alpha))
            continue
        if bound_width is None:
            # Hoeffding: P(|T - E T| >= t) <= 2 exp(-2t²/n) for T a sum of n
            # independent [0, 1] terms; the randomized sum is scale·T.
            t = math.sqrt(n * math.log(4 / alpha) / 2)
            c, _ = noise_half_width(plan, alpha / 2)
            rr_part = Fraction(math.ceil(t * 1e9 * channel.scale), 10**9)
            bound_width = (rr_part + c) / a
        low_v = max(value - bound_width, Fraction(0))
        high_v = min(value + bound_width, Fraction(top))
        out.append(Estimate(value * unit, low_v * unit, high_v * unit, 1 - alpha, 1 - alpha))
    return out


def local_error(
    channel: LocalChannel | None, plan: NoisePlan, report_count: int
) -> tuple[float, float]:
    """(rms error per coordinate with the channel, without it), in the aggregate's units.

    Without: the servers' noise alone, sqrt(Var Z). With: the worst case over the data
    of sqrt(Var RR + Var Z)/a, where each respondent's randomized coordinate is
    scale·Bernoulli(π): π is p or q for 0/1 coordinates, anywhere in
    [1/(r+1), r/(r+1)] for bounded values (so π(1-π) <= 1/4).
    """
    _check_int(report_count, "report_count", 0)
    # Everything in the aggregate's own (encoded) units, converted at the end.
    unit = 1.0
    if plan.config.mechanism is Mechanism.LAPLACE:
        unit = 2.0**-plan.config.fixed_point_bits
    noise_var = plan.total_noise().variance()
    without = math.sqrt(noise_var) * unit
    if channel is None:
        return without, without
    a, _ = channel.affine(0)
    if channel.exact_intervals:
        # Each report's coordinate is Bernoulli(p) (true bit 1) or Bernoulli(q).
        p, q = (float(v) for v in channel.bit_probabilities(0))
        per_report = max(p * (1 - p), q * (1 - q))
    else:
        # Bernoulli(π) with π anywhere in [1/(r+1), r/(r+1)], which holds 1/2.
        per_report = 0.25
    rr_var = report_count * per_report * channel.scale**2
    return math.sqrt(rr_var + noise_var) / float(a) * unit, without


def breakdown_estimate(
    noised: Sequence[int],
    report_count: int,
    shape: tuple[int, int],
    channels: tuple[KaryResponse | None, KaryResponse | None],
    plan: NoisePlan,
    top: int = 1,
    alpha: float = 0.05,
) -> list[Estimate]:
    """De-biased estimates of a breakdown's cells, all with (1 - alpha) intervals at once.

    The cells are `shape` = (groups, categories), row by row; `channels` the k-ary
    randomized response of the group question and of the question counted (None where
    it is not randomized: a breakdown sends the question's randomized answer, never a
    second draw). The expected cells are (A_G ⊗ A_Q)·X for the true cells X, each A a
    channel's transition matrix (identity without one), and A⁻¹ = (I - other·J)/(keep -
    other) exactly, since keep + (k - 1)·other = 1: so X̂ = (A_G⁻¹ ⊗ A_Q⁻¹)·Y is
    unbiased, Y being the noisy aggregate, and needs no group's count (which the
    breakdown does not carry). `top` is the most one report adds to a cell (1 for
    counts; a number's max).

    The interval is a stated bound, as the sums' of `local_estimate`: X̂ - X is the
    randomization's part, a sum over the n reports of independent terms, each within a
    range of width w = top·(max - min of the entries of A_G⁻¹ ⊗ A_Q⁻¹ and 0), bounded by
    Hoeffding's inequality at alpha/2 shared over the cells (Bonferroni), plus the
    servers' noise passed through the same matrix, at most max|Z|·Σ|entries of a row|
    with max|Z| over every cell bounded at alpha/2 (union bound). Coverage ≥ 1 - alpha
    for every cell at once.
    """
    if not MIN_ALPHA <= alpha < 1:
        raise InvalidParameter(f"alpha must be in [{MIN_ALPHA}, 1), got {alpha}")
    n = _check_int(report_count, "report_count", 0)
    groups, categories = shape
    if len(noised) != groups * categories:
        raise InvalidParameter(f"{len(noised)} cells, not {groups} x {categories}")
    unit = Fraction(1)
    if plan.config.mechanism is Mechanism.LAPLACE:
        unit = Fraction(1, 1 << plan.config.fixed_point_bits)

    (dg, og), (dq, oq) = _inverse(channels[0], groups), _inverse(channels[1], categories)
    cells = [
        [Fraction(noised[g * categories + c]) for c in range(categories)] for g in range(groups)
    ]
    # A_G⁻¹·Y, then ·A_Q⁻¹ (both symmetric): each is (diag - off)·Y + off·(the column's,
    # then the row's, sum).
    columns = [sum(cells[g][c] for g in range(groups)) for c in range(categories)]
    mixed = [
        [(dg - og) * cells[g][c] + og * columns[c] for c in range(categories)]
        for g in range(groups)
    ]
    values: list[Fraction] = []
    for g in range(groups):
        total = sum(mixed[g], Fraction(0))
        values.extend((dq - oq) * mixed[g][c] + oq * total for c in range(categories))
    half = breakdown_half_width(n, shape, channels, plan, top, alpha) / unit
    upper = Fraction(n * top) / unit
    return [
        Estimate(
            v * unit,
            max(v - half, Fraction(0)) * unit,
            min(v + half, upper) * unit,
            1 - alpha,
            1 - alpha,
        )
        for v in values
    ]


def _inverse(channel: KaryResponse | None, k: int) -> tuple[Fraction, Fraction]:
    """(diagonal, off-diagonal) of a channel's A⁻¹ over k options (of I without one)."""
    if channel is None:
        return Fraction(1), Fraction(0)
    if channel.k != k:
        raise InvalidParameter(f"a channel over {channel.k} options for {k} cells")
    gap = channel.keep - channel.other
    return (1 - channel.other) / gap, -channel.other / gap


def breakdown_half_width(
    report_count: int,
    shape: tuple[int, int],
    channels: tuple[KaryResponse | None, KaryResponse | None],
    plan: NoisePlan,
    top: int = 1,
    alpha: float = 0.05,
) -> Fraction:
    """The half-width of every cell's interval in `breakdown_estimate` (before it is cut
    to the possible range), in the answers' units: it depends on public parameters only."""
    groups, categories = shape
    (dg, og), (dq, oq) = _inverse(channels[0], groups), _inverse(channels[1], categories)
    entries = {a * b for a in (dg, og, Fraction(0)) for b in (dq, oq, Fraction(0))}
    width = top * (max(entries) - min(entries))
    rows = (dg + (groups - 1) * abs(og)) * (dq + (categories - 1) * abs(oq))
    k = groups * categories
    t = float(width) * math.sqrt(report_count * math.log(4 * k / alpha) / 2)
    unit = Fraction(1)
    if plan.config.mechanism is Mechanism.LAPLACE:
        unit = Fraction(1, 1 << plan.config.fixed_point_bits)
    noise = Fraction(0)
    if plan.server_noise() is not None:
        c, _ = noise_half_width(plan, min(alpha / (2 * k), 0.5))
        noise = c * rows * unit
    return Fraction(math.ceil(t * 1e9), 10**9) + noise


def breakdown_error(
    report_count: int,
    shape: tuple[int, int],
    channels: tuple[KaryResponse | None, KaryResponse | None],
    plan: NoisePlan,
    top: int = 1,
) -> float:
    """The root mean square error of one cell of `breakdown_estimate`, at its worst over
    the answers, in the answers' units: each report's randomized term has a variance of
    at most w²/4 (w as there), and the servers' noise passes through a row of the
    matrix, Var Z times the sum of its squared entries."""
    groups, categories = shape
    (dg, og), (dq, oq) = _inverse(channels[0], groups), _inverse(channels[1], categories)
    entries = {a * b for a in (dg, og, Fraction(0)) for b in (dq, oq, Fraction(0))}
    width = float(top * (max(entries) - min(entries)))
    squares = float((dg * dg + (groups - 1) * og * og) * (dq * dq + (categories - 1) * oq * oq))
    noise, _ = local_error(None, plan, report_count)
    return math.sqrt(report_count * width * width / 4 + noise * noise * squares)
