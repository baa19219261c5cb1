"""An empirical privacy audit: the whole noise path (an aggregate
secret-shared, each aggregator adding its noise mod p, the collector
unsharding and taking the centred lift) run many times on one truth, and a
lower confidence bound on the privacy loss between two such runs on
neighbouring truths. A bound above the configured epsilon is a privacy bug."""

from __future__ import annotations

import math
import random

import numpy as np
from scipy import stats

from veil.dp import NoisePlan, add_noise, apply_noise, decode, draw_noise

FIELD64 = 2**32 * (2**32 - 1) + 1
AUDIT_CONFIDENCE = 1e-3  # total probability that the lower bound is wrong


def run_noise_path(
    plan: NoisePlan, truth: int, trials: int, rng: random.Random, modulus: int = FIELD64
) -> tuple[np.ndarray, np.ndarray]:
    """(collector's decoded result, leader's view = result minus its own noise)."""
    leader = [rng.randrange(modulus) for _ in range(trials)]
    helper = [(truth - s) % modulus for s in leader]
    noise_leader = draw_noise(plan, trials, rng)
    noised_leader = apply_noise(leader, noise_leader, modulus)
    noised_helper = add_noise(helper, modulus, plan, rng)
    combined = [(a + b) % modulus for a, b in zip(noised_leader, noised_helper, strict=True)]
    result = np.array(decode(combined, modulus), dtype=np.int64)
    return result, result - np.array(noise_leader, dtype=np.int64)


def epsilon_lower_bound(x: np.ndarray, y: np.ndarray, window: range) -> float:
    """A lower confidence bound on max_E |ln P(X∈E) - ln P(Y∈E)| over simple events.

    The events, fixed before looking at the data, are {v}, {<= v} and {>= v} for v
    in `window`. Each probability gets a Clopper-Pearson bound at a Bonferroni-
    corrected level, so the result is a valid lower bound on the true privacy loss
    with probability at least 1 - AUDIT_CONFIDENCE.
    """
    events = []
    for v in window:
        for member in (np.equal, np.less_equal, np.greater_equal):
            events.append(
                (int(np.count_nonzero(member(x, v))), int(np.count_nonzero(member(y, v))))
            )
    # Two one-sided bounds for each of two ratio directions per event.
    level = AUDIT_CONFIDENCE / (4 * len(events))
    best = 0.0
    for a, b in events:
        for k_num, n_num, k_den, n_den in ((a, x.size, b, y.size), (b, y.size, a, x.size)):
            if k_num == 0 or k_den == n_den:
                continue  # no evidence of a ratio above 1 in this direction
            p_num_low = stats.beta.ppf(level, k_num, n_num - k_num + 1)
            p_den_high = stats.beta.ppf(1 - level, k_den + 1, n_den - k_den)
            best = max(best, math.log(p_num_low / p_den_high))
    return best
