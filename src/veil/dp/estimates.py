"""Estimates and confidence intervals for the collector, and consistent post-processing.

The decoded result is y = a + Z, with a the true aggregate and Z the total noise
(symmetric, mean 0), so y is an unbiased estimate of a. The interval [y - c, y + c],
with c the smallest integer such that P(|Z| <= c) >= 1 - α, covers a with probability
at least 1 - α; c comes from the exact pmf of Z (the convolution of the aggregators'
noises in independent mode, one discrete Laplace in split mode), which depends only on
public parameters (the task's NoisePlan), never on the data.

Post-processing (clamping, projection) cannot weaken DP, but it trades the
unbiasedness of y for smaller error; the functions say which they return.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from veil.dp.errors import InvalidParameter
from veil.dp.mechanisms import Mechanism, NoisePlan

__all__ = [
    "Estimate",
    "clamp",
    "consistent_box",
    "consistent_histogram",
    "estimate",
    "feasible_range",
    "frequencies",
    "mean",
    "noise_half_width",
    "project_histogram",
    "ratio",
    "shares",
    "simultaneous_alpha",
    "total",
]

# The noise pmf tables are exact to ~1e-14 in absolute terms; smaller α would ask for
# more precision than they have.
MIN_ALPHA = 1e-9


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a confidence interval [low, high].

    `coverage` is the exact probability (from the noise pmf) that such an interval
    covers the truth; it is at least `level` and exceeds it only because the noise
    is integer-valued.
    """

    value: Fraction
    low: Fraction
    high: Fraction
    level: float
    coverage: float

    def scaled(self, factor: Fraction) -> Estimate:
        """The estimate of factor · truth (factor > 0), e.g. a mean from a sum."""
        if factor <= 0:
            raise InvalidParameter(f"scale factor must be > 0, got {factor}")
        return Estimate(
            self.value * factor, self.low * factor, self.high * factor, self.level, self.coverage
        )


def noise_half_width(plan: NoisePlan, alpha: float) -> tuple[int, float]:
    """(c, P(|Z| <= c)) for the least integer c with P(|Z| <= c) >= 1 - alpha."""
    if not MIN_ALPHA <= alpha < 1:
        raise InvalidParameter(f"alpha must be in [{MIN_ALPHA}, 1), got {alpha}")
    noise = plan.total_noise()
    # Smallest c with P(|Z| <= c) >= 1 - alpha: double an upper bracket, then bisect
    # (P(|Z| <= c) is non-decreasing in c).
    lo, hi = -1, 1
    while noise.central_mass(hi) < 1 - alpha:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if noise.central_mass(mid) >= 1 - alpha:
            hi = mid
        else:
            lo = mid
    return hi, min(noise.central_mass(hi), 1.0)


def simultaneous_alpha(alpha: float, k: int) -> float:
    """The per-coordinate α whose k intervals cover all at once with probability 1 - α.

    The coordinates' noises are independent and identically distributed (each
    aggregator draws them so), so max_i |Z_i| <= c has probability P(|Z| <= c)**k:
    the exact quantile of the maximum of k is P(|Z| <= c) >= (1 - α)**(1/k)
    (Šidák's correction, exact here, and slightly narrower than Bonferroni's α/k).
    """
    if k < 1:
        raise InvalidParameter(f"k must be >= 1, got {k}")
    if k == 1:
        return alpha
    # -expm1(log1p(-α)/k) = 1 - (1-α)**(1/k) without cancellation for small α.
    per = -math.expm1(math.log1p(-alpha) / k)
    if per < MIN_ALPHA:
        raise InvalidParameter(
            f"simultaneous intervals over {k} coordinates at α = {alpha} need a per-coordinate"
            f" α below {MIN_ALPHA}, finer than the noise tables; choose a larger α"
        )
    return per


def estimate(
    noised: Sequence[int], plan: NoisePlan, alpha: float = 0.05, *, simultaneous: bool = False
) -> list[Estimate]:
    """Unbiased estimates and (1 - alpha) confidence intervals, one per coordinate.

    `noised` is the decoded (centred-lifted) aggregate. With the laplace mechanism
    the values are fixed-point and are divided by 2**fixed_point_bits. By default
    each interval holds marginally for its coordinate; `simultaneous` makes all of
    them hold at once with probability at least 1 - alpha (the exact quantile of the
    maximum of the coordinates' independent noises, `simultaneous_alpha`), and each
    Estimate's `coverage` is then that joint probability.
    """
    k = len(noised)
    if simultaneous and k > 1:
        c, marginal = noise_half_width(plan, simultaneous_alpha(alpha, k))
        coverage = marginal**k
    else:
        c, coverage = noise_half_width(plan, alpha)
    unit = Fraction(1, 1 << plan.config.fixed_point_bits)
    if plan.config.mechanism is not Mechanism.LAPLACE:
        unit = Fraction(1)
    return [Estimate(y * unit, (y - c) * unit, (y + c) * unit, 1 - alpha, coverage) for y in noised]


def feasible_range(vdaf: str, params: Mapping[str, int], report_count: int) -> tuple[int, int]:
    """[low, high] that each coordinate of the true aggregate lies in (public bounds)."""
    if report_count < 0:
        raise InvalidParameter(f"report_count must be >= 0, got {report_count}")
    if vdaf in ("Prio3Count", "Prio3Histogram", "Prio3MultihotCountVec"):
        return 0, report_count
    if vdaf == "Prio3Sum" or vdaf.startswith("Prio3SumVec"):
        if "max_measurement" in params:
            top = params["max_measurement"]
        elif "bits" in params:
            top = (1 << params["bits"]) - 1
        else:
            raise InvalidParameter(f"{vdaf} needs max_measurement for its feasible range")
        return 0, report_count * top
    if vdaf == "Prio3L1BoundSum":
        if "max_value" not in params:
            raise InvalidParameter(f"{vdaf} needs max_value for its feasible range")
        return 0, report_count * params["max_value"]
    raise InvalidParameter(f"no feasible range known for VDAF type {vdaf!r}")


def clamp(
    values: Sequence[Fraction | int], low: Fraction | int, high: Fraction | int
) -> list[Fraction]:
    """Each value clamped to [low, high] (biased towards the interior, smaller error)."""
    if low > high:
        raise InvalidParameter(f"empty range [{low}, {high}]")
    return [Fraction(min(max(v, low), high)) for v in values]


def project_histogram(values: Sequence[Fraction | int], total: int) -> list[Fraction]:
    """The closest point (in L2) to `values` with non-negative entries summing to `total`.

    Exact Euclidean projection onto the scaled simplex (the sort-and-threshold method,
    Held, Wolfe, Crowder 1974; Duchi et al. 2008): x_i = max(v_i - θ, 0) with θ chosen
    so that the sum is `total`. `total` is the published report count.
    """
    if total < 0:
        raise InvalidParameter(f"total must be >= 0, got {total}")
    if not values:
        raise InvalidParameter("cannot project an empty histogram")
    exact = [Fraction(v) for v in values]
    if total == 0:
        return [Fraction(0)] * len(exact)
    ordered = sorted(exact, reverse=True)
    running = Fraction(0)
    theta = Fraction(0)
    for k, v in enumerate(ordered, start=1):
        running += v
        candidate = (running - total) / k
        if v - candidate > 0:
            theta = candidate
    return [max(v - theta, Fraction(0)) for v in exact]


def _into(est: Estimate, value: Fraction, low: Fraction, high: Fraction) -> Estimate:
    """`est` with the point `value`, its interval cut to [low, high] (an interval
    wholly outside collapses onto the nearer end) and widened to hold `value`.

    Whenever the raw interval covers a truth inside [low, high], the cut one does
    too, so coverage is kept; widening can only add to it.
    """
    lo = min(max(est.low, low), high)
    hi = max(min(est.high, high), low)
    return Estimate(value, min(lo, value), max(hi, value), est.level, est.coverage)


def consistent_box(
    estimates: Sequence[Estimate], low: Fraction | int, high: Fraction | int
) -> list[Estimate]:
    """Each estimate projected into the possible range [low, high]: the value
    clamped (the closest possible point), the interval intersected with the range.

    For a count (0 to n), a sum (0 to n·max), each option of a multiple choice.
    Post-processing of public values: free under DP, biased towards the interior,
    never further from the truth than the raw value.
    """
    lo, hi = Fraction(low), Fraction(high)
    if lo > hi:
        raise InvalidParameter(f"empty range [{low}, {high}]")
    return [_into(e, min(max(e.value, lo), hi), lo, hi) for e in estimates]


def consistent_histogram(estimates: Sequence[Estimate], total: int) -> list[Estimate]:
    """A histogram whose buckets add up to the public `total` (one answer per
    report), projected onto what is possible: non-negative values summing to
    `total` (`project_histogram`), each interval intersected with [0, total].

    When all the raw intervals hold at once (simultaneous intervals), the
    projection moves every bucket by at most their common half-width, so each
    projected value lies in its intersected interval; otherwise (probability at
    most α) the interval is widened to hold it rather than show a value outside.
    """
    values = project_histogram([e.value for e in estimates], total)
    return [
        _into(e, v, Fraction(0), Fraction(total)) for e, v in zip(estimates, values, strict=True)
    ]


def consistent_bounded_sum(estimates: Sequence[Estimate], total: int) -> list[Estimate]:
    """Non-negative values whose sum is at most the public `total` (each respondent's
    points add up to at most theirs, so every option's sum and all of them together
    are at most n times it), the closest such point in L2: the values clamped at 0
    when those add up to at most `total`, else the projection onto the simplex of
    `total` (`project_histogram`). Each interval is intersected with [0, total].

    When all the raw intervals hold at once, the projection's shift θ is at most
    their common half-width c (the truth's entries are at least v_i - c and add up
    to at most `total`), so each value stays in its interval; otherwise it is
    widened to hold the value, as in `consistent_histogram`.
    """
    clamped = [max(Fraction(e.value), Fraction(0)) for e in estimates]
    values = clamped if sum(clamped) <= total else project_histogram(clamped, total)
    return [
        _into(e, v, Fraction(0), Fraction(total)) for e, v in zip(estimates, values, strict=True)
    ]


def mean(sum_estimate: Estimate, report_count: int) -> Estimate:
    """Mean (sum / n) with its interval; the report count n is public and exact."""
    if report_count < 1:
        raise InvalidParameter(f"a mean needs report_count >= 1, got {report_count}")
    return sum_estimate.scaled(Fraction(1, report_count))


def frequencies(counts: Sequence[Estimate], report_count: int) -> list[Estimate]:
    """Per-bucket frequencies (count / n) with their intervals."""
    return [mean(c, report_count) for c in counts]


# ----------------------------------------------- ratios (add/remove neighbouring)
#
# Under add/remove neighbouring the report count n is noised like everything else and
# the collector never learns it exactly, so a mean or a proportion is a ratio of two
# noisy quantities. Given intervals that hold *simultaneously* for numerator and
# denominator (`estimate(..., simultaneous=True)` over all coordinates), the ratio's
# true value lies between the extreme ratios of the two boxes whenever they all hold:
# its interval covers with at least their joint coverage, which it keeps.


def ratio(num: Estimate, den: Estimate, low: Fraction, high: Fraction) -> Estimate:
    """num / den (a mean, or a share of the count), within the public range [low, high].

    The truths are num >= 0 and den >= 1, so on the event that both intervals hold,
    num/den lies in [num.low⁺ / den.high, num.high / den.low⁺] (clipped to the range).
    The point estimate is the ratio of the noisy values, clipped the same way.
    """
    n_lo, n_hi = max(num.low, Fraction(0)), max(num.high, Fraction(0))
    d_lo, d_hi = max(den.low, Fraction(1)), max(den.high, Fraction(1))
    value = min(max(max(num.value, Fraction(0)) / max(den.value, Fraction(1)), low), high)
    lo = min(max(n_lo / d_hi, low), high)
    hi = max(min(n_hi / d_lo, high), low)
    return Estimate(value, lo, hi, num.level, min(num.coverage, den.coverage))


def shares(counts: Sequence[Estimate]) -> list[Estimate]:
    """Each bucket's share of the total, a_i / Σ_j a_j, for a histogram whose buckets
    add up to the (noisy) report count. With every a_j in its interval, a_i/Σa grows
    with a_i and falls with the others, so its extremes are at the boxes' corners."""
    lows = [max(c.low, Fraction(0)) for c in counts]
    highs = [max(c.high, Fraction(0)) for c in counts]
    values = [max(c.value, Fraction(0)) for c in counts]
    total_low, total_high, total = sum(lows), sum(highs), sum(values)
    out = []
    for i, c in enumerate(counts):
        others_high = total_high - highs[i]
        others_low = total_low - lows[i]
        lo = lows[i] / (lows[i] + others_high) if lows[i] + others_high > 0 else Fraction(0)
        hi = highs[i] / (highs[i] + others_low) if highs[i] + others_low > 0 else Fraction(1)
        value = values[i] / total if total > 0 else Fraction(0)
        out.append(Estimate(value, lo, hi, c.level, c.coverage))
    return out


def total(counts: Sequence[Estimate]) -> Estimate:
    """Σ_j a_j with the interval [Σ lows, Σ highs] (valid when all hold at once)."""
    return Estimate(
        sum((c.value for c in counts), Fraction(0)),
        max(sum((c.low for c in counts), Fraction(0)), Fraction(0)),
        sum((c.high for c in counts), Fraction(0)),
        counts[0].level,
        min(c.coverage for c in counts),
    )
