"""The DP regression guard's statistics: is the noise a collector finds in a
released aggregate drawn at the scale the task's noise plan promises?

The statistic is S = |Z_1| + ... + |Z_n|, the summed absolute total noise of
n coordinates (what the collector decodes minus the known truth). Under the
plan the Z_i are independent, each the sum of `summands` discrete Laplace
draws of the plan's scale b (two in independent mode, one aggregator's each;
one in split mode, whose Pólya shares add up to exactly one), so the law of
S is the n-fold convolution of the law of |Z|. It is computed here from b
and the closed form P(X = k) = tanh(1/(2b)) · exp(-|k|/b) (not from the
samplers' code), by FFT, and the two thresholds come from it:

- too little noise (the privacy side): S <= low, with P(S <= low) <= ALPHA_LOW;
- too much noise (accuracy only): S >= high, with P(S >= high) <= ALPHA_HIGH;

so a correctly scaled release is refused with probability at most
FALSE_ALARM = ALPHA_LOW + ALPHA_HIGH = 1/1,000 by construction. The same
computation at another scale gives the power: `GuardDesign.power`.

The sum of |Z| is the statistic because it is integer valued (so its law is
exact by convolution) and as sharp about the scale as the likelihood ratio
of b against b/1.25: at b = 8, two summands and a false alarm of 1e-3, the
normal approximation asks 411 coordinates of it and 413 of the likelihood
ratio for a power of 0.95, and 509 of the sample variance (Z² has heavier
tails); the exact law gives 0.956 at 400.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt
from scipy.optimize import minimize_scalar

Pmf = npt.NDArray[np.float64]

FALSE_ALARM = 1e-3
ALPHA_LOW = FALSE_ALARM / 2  # too little noise
ALPHA_HIGH = FALSE_ALARM - ALPHA_LOW  # too much noise
# The mis-scale the guard must catch, and how surely (issue 39).
MIS_SCALE = Fraction(5, 4)
REQUIRED_POWER = 0.95
# Each discrete Laplace pmf is cut at 40 scales: P(|X| > K) = 2q**(K+1)/(1+q)
# < 2e-40 ≈ 8.5e-18 a draw, below 1e-13 over every draw of a collection.
TAIL_SCALES = 40


class Verdict(enum.StrEnum):
    TOO_LITTLE = "too little noise"
    AS_PLANNED = "as planned"
    TOO_MUCH = "too much noise"


def laplace_pmf(scale: float) -> Pmf:
    """P(X = k) for k in [-K, K], K = ceil(TAIL_SCALES · scale)."""
    half = math.ceil(TAIL_SCALES * scale)
    k = np.arange(-half, half + 1)
    return math.tanh(1 / (2 * scale)) * np.exp(-np.abs(k) / scale)


def abs_total_pmf(scale: float, summands: int) -> Pmf:
    """P(|Z| = k), k = 0, 1, ..., for Z the sum of `summands` independent
    discrete Laplace draws of `scale`."""
    single = laplace_pmf(scale)
    total = single
    for _ in range(summands - 1):
        total = np.convolve(total, single)
    centre = (total.size - 1) // 2
    folded = total[centre:].copy()
    folded[1:] += total[:centre][::-1]
    return folded


def sum_pmf(pmf: Pmf, n: int) -> Pmf:
    """The pmf of the sum of n independent draws of `pmf` (support 0, 1, ...),
    by FFT on a length that holds the whole support (no wrap-around)."""
    size = n * (pmf.size - 1) + 1
    out = np.fft.irfft(np.fft.rfft(pmf, size) ** n, size)
    return np.clip(out, 0.0, None)


def chernoff_low(pmf: Pmf, n: int, t: int) -> float:
    """A rigorous bound on P(S <= t), S a sum of n draws of `pmf`:
    min over λ > 0 of exp(λt) · E[exp(-λ|Z|)]**n (Markov's inequality)."""
    k = np.arange(pmf.size)

    def log_bound(lam: float) -> float:
        return float(lam * t + n * np.log(np.dot(pmf, np.exp(-lam * k))))

    best = minimize_scalar(log_bound, bounds=(0.0, 5.0), method="bounded")
    return math.exp(min(0.0, float(best.fun)))


@dataclass(frozen=True)
class GuardDesign:
    """The guard for one task: n coordinates of total noise at the plan's
    `scale`, each the sum of `summands` discrete Laplace draws."""

    scale: Fraction
    summands: int
    n: int
    low: int  # S <= low: too little noise
    high: int  # S >= high: too much noise
    false_alarm_low: float  # P(S <= low) at the planned scale
    false_alarm_high: float  # P(S >= high) at the planned scale

    @property
    def false_alarm(self) -> float:
        return self.false_alarm_low + self.false_alarm_high

    def statistic(self, noise: npt.NDArray[np.int64]) -> int:
        if noise.shape != (self.n,):
            raise ValueError(f"the guard takes {self.n} coordinates, got {noise.shape}")
        return int(np.abs(noise).sum())

    def verdict(self, noise: npt.NDArray[np.int64]) -> Verdict:
        s = self.statistic(noise)
        if s <= self.low:
            return Verdict.TOO_LITTLE
        if s >= self.high:
            return Verdict.TOO_MUCH
        return Verdict.AS_PLANNED

    def law(self, scale: Fraction | None = None) -> Pmf:
        """The pmf of S when every draw has `scale` (the plan's by default)."""
        actual = self.scale if scale is None else scale
        return sum_pmf(abs_total_pmf(float(actual), self.summands), self.n)

    def power(self, scale: Fraction) -> tuple[float, float]:
        """(P(S <= low), P(S >= high)) when the noise is drawn at `scale`."""
        law = self.law(scale)
        return float(law[: self.low + 1].sum()), float(law[self.high :].sum())


def design(scale: Fraction, summands: int, n: int) -> GuardDesign:
    """Thresholds for n coordinates from the exact law of S at `scale`."""
    law = sum_pmf(abs_total_pmf(float(scale), summands), n)
    below = np.cumsum(law)  # P(S <= t)
    above = np.cumsum(law[::-1])[::-1]  # P(S >= t)
    low = int(np.searchsorted(below, ALPHA_LOW, side="right")) - 1
    high = int(np.argmax(above <= ALPHA_HIGH))
    if low < 0 or above[high] > ALPHA_HIGH:
        raise ValueError(f"{n} coordinates are too few for a guard at {FALSE_ALARM}")
    return GuardDesign(scale, summands, n, low, high, float(below[low]), float(above[high]))
