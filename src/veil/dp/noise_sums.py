"""The interval of a weighted sum of independent integer noises: the error of a
reconciled estimate (veil.dp.reconcile) is Σ w·Z over the releases' noises, each
Z an aggregator's discrete Laplace or Gaussian draw (or their sum), whose exact
distributions are public.

`weighted_noise_half_width` puts each distinct weight's noise on a common grid of
step h (each term moved by at most h/2 by the rounding), convolves them by FFT
and reads the least half-width c whose central mass is at least the level; the
interval's half-width is c plus the largest total rounding error, so it covers
at least at its level (up to the pmf tables' 1e-14), and is at most 2% of the
estimate's standard deviation wider than the exact one.

Public parameters only: no I/O, no randomness.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from veil.dp.errors import InvalidParameter
from veil.dp.estimates import MIN_ALPHA
from veil.dp.mechanisms import TotalNoise

__all__ = ["weighted_noise_half_width"]

FloatArray = npt.NDArray[np.float64]

# Grid points per standard deviation of the estimate, per noise term: the
# rounding (s = N·h/2 for N terms) shifts the grid's quantile by at most s and is
# added once more, so the half-width exceeds the exact one by at most 1/_GRID sd.
_GRID = 50
# The grid spans ±_SPAN standard deviations; beyond, every term's mass is below
# P(|Z| > 40σ) (2.6e-25 for one discrete Laplace) and folds back harmlessly.
_SPAN = 40
_MAX_GRID = 1 << 22
# Weights equal to this relative precision are one term of the convolution.
_WEIGHT_DIGITS = 9


def _grid_pmf(noise: TotalNoise, weight: float, step: float, size: int) -> FloatArray:
    """The pmf of weight·Z rounded to the grid (index i for i·step, mod size)."""
    try:
        centre, table = noise.table()
    except InvalidParameter:
        # Only a discrete Gaussian too wide to tabulate gets here (σ > ~300,000): it
        # is N(0, σ²) to double precision (TotalNoise.central_mass says why); its
        # mass over each grid cell comes from the normal's distribution function.
        sd = weight * math.sqrt(noise.variance())
        reach = min(size // 2 - 1, math.ceil(_SPAN * sd / step) + 1)
        edges = (np.arange(-reach, reach + 2) - 0.5) * step / (sd * math.sqrt(2))
        cdf = 0.5 * (1 + np.array([math.erf(e) for e in edges]))
        cells = np.diff(cdf)
        spread = np.bincount(np.arange(-reach, reach + 1) % size, weights=cells, minlength=size)
        return spread.astype(np.float64)
    z = np.arange(-centre, centre + 1, dtype=np.float64)
    at = np.rint(weight * z / step).astype(np.int64) % size
    return np.bincount(at, weights=table, minlength=size).astype(np.float64)


def _integer_sum(noise: TotalNoise, times: int) -> tuple[npt.NDArray[np.int64], FloatArray] | None:
    """(values, pmf) of the sum of `times` independent copies of the noise, exactly
    on the integers (its transform to the power `times`, the grid wide enough that
    past it lies less than the mass beyond 40 standard deviations), or None where
    that grid would be too large."""
    try:
        centre, table = noise.table()
    except InvalidParameter:
        return None
    reach = max(centre, math.ceil(_SPAN * math.sqrt(times * noise.variance())))
    size = 1 << math.ceil(math.log2(2 * reach + 1))
    if size > _MAX_GRID:
        return None
    placed = np.zeros(size)
    placed[np.arange(-centre, centre + 1) % size] = table
    pmf = np.clip(np.fft.irfft(np.fft.rfft(placed) ** times, size), 0.0, None)
    values = np.arange(size, dtype=np.int64)
    values[size // 2 :] -= size
    return values, pmf


def _table_reach(noise: TotalNoise) -> float:
    """The largest |Z| the noise's table holds (inf past tabulable widths)."""
    try:
        centre, _ = noise.table()
    except InvalidParameter:
        return math.inf
    return float(centre)


def weighted_noise_half_width(
    terms: Sequence[tuple[TotalNoise, Sequence[float] | FloatArray]], alpha: float
) -> tuple[float, float]:
    """(c, mass): P(|X| ≤ c) ≥ mass ≥ 1 - alpha for X = Σ w·Z over the terms, each
    (noise, weights) a release's noise and the weights on its independent coordinates.

    The k copies of one noise at one |w| (to 9 digits) are summed exactly on the
    integers (S, its transform to the power k), and w·S is put on a grid of step
    h, rounded to the nearest multiple, moved by at most h/2 (where S's grid
    would be too large, each copy is rounded, moved by at most min(h/2, |w|·M),
    M the table's reach). The rounded sum's pmf is the product of the groups'
    transforms; its least central half-width at 1 - alpha, plus every group's
    largest rounding and the weights' own rounding, is c. h is the standard
    deviation over 50 times the number of roundings, so c exceeds the exact
    half-width by at most 2% of a standard deviation.
    """
    if not MIN_ALPHA <= alpha < 1:
        raise InvalidParameter(f"alpha must be in [{MIN_ALPHA}, 1), got {alpha}")
    grouped: dict[tuple[TotalNoise, float], int] = {}
    weight_slack = 0.0
    variance = 0.0
    largest = max((float(np.max(np.abs(w), initial=0.0)) for n, w in terms if n.parts), default=0.0)
    if largest == 0.0:
        return 0.0, 1.0
    for noise, weights in terms:
        if not noise.parts:
            continue
        w = np.abs(np.asarray(weights, dtype=np.float64))
        if not np.all(np.isfinite(w)):
            raise InvalidParameter("the weights of a noise sum must be finite")
        rounded = np.round(w / largest, _WEIGHT_DIGITS) * largest
        reach = _table_reach(noise)
        moved = float(np.sum(np.abs(w - rounded)))
        weight_slack += moved * reach if moved else 0.0
        var = noise.variance()
        variance += float(np.sum(rounded**2)) * var
        for value, count in zip(*np.unique(rounded, return_counts=True), strict=True):
            if value > 0:
                grouped[(noise, float(value))] = grouped.get((noise, float(value)), 0) + int(count)
    if variance == 0.0:
        return weight_slack, 1.0
    sd = math.sqrt(variance)
    # Copies of one noise at one weight are summed exactly first, where their sum's
    # grid is small enough, and rounded once; otherwise each copy is rounded.
    sums = {
        key: _integer_sum(key[0], times) if times > 1 else None for key, times in grouped.items()
    }
    count = sum(1 if sums[key] is not None else times for key, times in grouped.items())
    step = sd / (_GRID * count)
    size = 1 << max(4, math.ceil(math.log2(2 * _SPAN * sd / step + 1)))
    if size > _MAX_GRID:
        size = _MAX_GRID
        step = 2 * _SPAN * sd / (size - 1)
    spectrum = np.ones(size // 2 + 1, dtype=np.complex128)
    slack = weight_slack
    for (noise, weight), times in grouped.items():
        exact = sums[(noise, weight)]
        reach = _table_reach(noise)
        if exact is None:
            spectrum *= np.fft.rfft(_grid_pmf(noise, weight, step, size)) ** times
            slack += times * min(step / 2, weight * reach)
            continue
        values, pmf = exact
        at = np.rint(weight * values / step).astype(np.int64) % size
        spectrum *= np.fft.rfft(np.bincount(at, weights=pmf, minlength=size))
        slack += min(step / 2, weight * reach * times)
    pmf = np.clip(np.fft.irfft(spectrum, size), 0.0, None)
    half = size // 2
    # mass[m] = P(|X_grid| ≤ m·h), for m = 0 .. half - 1.
    mass = pmf[0] + np.concatenate(([0.0], np.cumsum(pmf[1:half] + pmf[size - 1 : half : -1])))
    reached = np.flatnonzero(mass >= 1 - alpha)
    if reached.size == 0:  # pragma: no cover - the grid spans ±40 standard deviations
        raise InvalidParameter("the noise sum's interval does not fit its grid")
    m = int(reached[0])
    return m * step + slack, min(float(mass[m]), 1.0)
