"""Shared statistical helpers for the veil.dp tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

# Significance level of every goodness-of-fit test (issue 3): a correct sampler
# fails one of them with probability 1e-3, and the seeds are fixed.
GOF_ALPHA = 1e-3
MIN_EXPECTED = 5.0

GoodnessOfFit = Callable[
    [Sequence[int] | npt.NDArray[np.int64], int, npt.NDArray[np.float64]], float
]


def chi_square_p_value(
    samples: Sequence[int] | npt.NDArray[np.int64], start: int, probs: npt.NDArray[np.float64]
) -> float:
    """Pearson chi-square p-value of `samples` against P(start + i) = probs[i].

    Values whose expected count is below 5 are merged into the two tails (everything
    below / above the well-populated range), each tail keeping its exact mass.
    """
    data = np.asarray(samples, dtype=np.int64)
    n = data.size
    expected = n * probs
    good = np.flatnonzero(expected >= MIN_EXPECTED)
    lo, hi = int(good[0]), int(good[-1])
    in_range = data[(data >= start + lo) & (data <= start + hi)] - (start + lo)
    inner_obs = np.bincount(in_range, minlength=hi - lo + 1).astype(np.float64)
    inner_exp = expected[lo : hi + 1]
    left_obs = float(np.count_nonzero(data < start + lo))
    right_obs = float(np.count_nonzero(data > start + hi))
    left_exp = n * float(probs[:lo].sum())
    right_exp = n - left_exp - float(inner_exp.sum())
    obs = list(inner_obs)
    exp = list(inner_exp)
    # Tails too thin for the chi-square approximation join their neighbouring bin.
    if left_exp >= MIN_EXPECTED:
        obs.insert(0, left_obs)
        exp.insert(0, left_exp)
    else:
        obs[0] += left_obs
        exp[0] += left_exp
    if right_exp >= MIN_EXPECTED:
        obs.append(right_obs)
        exp.append(right_exp)
    else:
        obs[-1] += right_obs
        exp[-1] += right_exp
    assert sum(obs) == n
    result = stats.chisquare(obs, exp)
    return float(result.pvalue)


@pytest.fixture
def gof() -> GoodnessOfFit:
    """The chi-square goodness-of-fit p-value function."""
    return chi_square_p_value
