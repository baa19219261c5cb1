"""Local randomized response (veil.dp.local): the channels, their exact laws, the
ε_L they deliver, and the collector's de-biased estimates with their intervals.

Collections are simulated directly from the exact distributions (the randomized
aggregate of n respondents and the servers' total noise), without servers, so that a
thousand of them take seconds; tests/integration covers the path through real servers.
"""

from __future__ import annotations

import itertools
import math
import random
import secrets
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from tests.dp.conftest import GOF_ALPHA
from tests.support.vdaf import prio3_round_trip as run
from veil.dp import DPConfig, InvalidParameter, NoisePlan
from veil.dp.local import (
    BoundedResponse,
    KaryResponse,
    MultiOptionResponse,
    VectorResponse,
    local_channel,
    local_error,
    local_estimate,
    local_odds,
)
from veil.vdaf import Prio3Count, Prio3Histogram, Prio3MultihotCountVec, Prio3Sum, Prio3SumVec

COLLECTIONS = 1_000


def chi_square(observed: Counter[object], expected: dict[object, Fraction], n: int) -> float:
    keys = sorted(expected, key=repr)
    assert set(observed) <= set(keys), "the channel produced an output of probability 0"
    obs = [observed[k] for k in keys]
    exp = [n * float(expected[k]) for k in keys]
    return float(stats.chisquare(obs, exp).pvalue)


# --------------------------------------------------------------------------- exact law


@pytest.mark.parametrize("epsilon", [Fraction(1, 1000), Fraction(1), Fraction(5, 2), 20])
def test_odds_are_a_tight_lower_bound_of_exp_epsilon(epsilon: Fraction) -> None:
    odds = local_odds(Fraction(epsilon))
    # ln r <= ε is the guarantee; the gap is below 2**-60 in relative terms.
    assert odds <= Fraction(math.exp(float(epsilon))) * (1 + Fraction(1, 2**50))
    assert math.log(odds.numerator) - math.log(odds.denominator) <= float(epsilon) + 1e-12
    assert float(odds) == pytest.approx(math.exp(float(epsilon)), rel=1e-15)


def test_kary_transition_matrix_is_exact_and_stochastic() -> None:
    channel = KaryResponse(4, 1)
    matrix = channel.transition()
    for i, row in enumerate(matrix):
        assert sum(row) == 1
        assert row[i] == channel.odds / (channel.odds + 3)
        # Any output is at most r times likelier under one input than another.
        for j, other in enumerate(matrix):
            if j == i:
                continue
            assert max(a / b for a, b in zip(row, other, strict=True)) == channel.odds


@pytest.mark.parametrize(("k", "epsilon"), [(2, "0.5"), (4, 1), (7, 3)])
def test_kary_channel_fits_its_transition_matrix(k: int, epsilon: object) -> None:
    channel = KaryResponse(k, epsilon)  # type: ignore[arg-type]
    rng = random.Random(f"kary channel {k} {epsilon}")
    n = 20_000
    for true in range(k):
        seen = Counter(channel.randomize(true, rng) for _ in range(n))
        row = dict(enumerate(channel.transition()[true]))
        assert chi_square(seen, row, n) > GOF_ALPHA  # type: ignore[arg-type]


def test_multi_option_channel_fits_its_product_law() -> None:
    channel = MultiOptionResponse(3, 1, 2)
    assert channel.differing_bits == 2
    assert channel.bit.epsilon == 1  # ε_L / min(2·max_choices, options)
    p, q = channel.bit.keep, channel.bit.other
    rng = random.Random("multi")
    n = 20_000
    for answer in ([0, 0, 0], [0, 1, 0]):
        seen = Counter(tuple(channel.randomize(answer, rng)) for _ in range(n))
        law: dict[object, Fraction] = {}
        for out in itertools.product((0, 1), repeat=3):
            prob = Fraction(1)
            for a, o in zip(answer, out, strict=True):
                prob *= (p if o == 1 else q) if a == 1 else (q if o == 1 else p)
            law[out] = prob
        assert sum(law.values()) == 1
        assert chi_square(seen, law, n) > GOF_ALPHA  # type: ignore[arg-type]


def test_bounded_channel_fits_its_law_and_is_affine() -> None:
    channel = BoundedResponse(10, 1)
    rng = random.Random("bounded")
    n = 20_000
    a, b = channel.affine(0)
    for x in (0, 3, 10):
        high = channel.high_probability(x)
        assert 10 * high == a * x + b  # E[output | x] is affine in x
        seen = Counter(channel.randomize(x, rng) for _ in range(n))
        assert chi_square(seen, {0: 1 - high, 10: high}, n) > GOF_ALPHA  # type: ignore[arg-type]
    # The extreme inputs give the extreme probabilities 1/(r+1) and r/(r+1).
    assert channel.high_probability(10) / channel.high_probability(0) == channel.odds


def test_a_part_of_an_answer_may_have_less_than_the_minimum() -> None:
    # 1/1000 over 1000 options: each bit at 1/2000000, still a valid channel.
    channel = local_channel(
        "Prio3MultihotCountVec", {"length": 1000, "max_weight": 1000}, "1/1000", 500
    )
    assert isinstance(channel, MultiOptionResponse)
    assert channel.bit.epsilon == Fraction(1, 1_000_000) and channel.bit.odds > 1


def test_vector_channel_spreads_epsilon_over_coordinates() -> None:
    channel = VectorResponse(4, 3, 2)
    assert channel.coordinate.epsilon == Fraction(1, 2)
    out = channel.randomize([0, 1, 2, 3], random.Random("vector"))
    assert len(out) == 4 and set(out) <= {0, 3}


def test_empirical_epsilon_audit_on_one_report() -> None:
    """Run one report's randomization many times from two neighbouring answers and
    bound the privacy loss from the counts (Clopper-Pearson at 1e-3 per output): the
    audit must not find more than ε_L, and must find close to ε_L (no over-noise)."""
    epsilon = 1
    channel = KaryResponse(3, epsilon)
    rng = random.Random("audit")
    n = 200_000
    from_a = Counter(channel.randomize(0, rng) for _ in range(n))
    from_b = Counter(channel.randomize(1, rng) for _ in range(n))
    lowest, highest = 0.0, 0.0
    point = 0.0
    for y in range(3):
        a, b = from_a[y], from_b[y]
        a_lo, a_hi = stats.beta.ppf([5e-4, 1 - 5e-4], [a, a + 1], [n - a + 1, n - a])
        b_lo, b_hi = stats.beta.ppf([5e-4, 1 - 5e-4], [b, b + 1], [n - b + 1, n - b])
        point = max(point, abs(math.log(a / b)))
        lowest = max(lowest, math.log(a_lo / b_hi), math.log(b_lo / a_hi))
        highest = max(highest, math.log(a_hi / b_lo), math.log(b_hi / a_lo))
    print(f"ε_L audit: point {point:.4f}, 99.9% interval [{lowest:.4f}, {highest:.4f}]")
    assert lowest <= epsilon <= highest
    assert highest - lowest < 0.1


def test_randomized_answers_stay_valid_measurements() -> None:
    rng = random.Random("valid")
    cases = [
        (Prio3Count(2), local_channel("Prio3Count", {}, 1), 1),
        (Prio3Histogram(2, 4, 2), local_channel("Prio3Histogram", {"length": 4}, 1), 2),
        (
            Prio3MultihotCountVec(2, 4, 4, 2),
            local_channel("Prio3MultihotCountVec", {"length": 4, "max_weight": 4}, 1, 1),
            [True, False, False, False],
        ),
        (Prio3Sum(2, 7), local_channel("Prio3Sum", {"max_measurement": 7}, 1), 5),
        (
            Prio3SumVec(2, 3, 7, 2),
            local_channel("Prio3SumVec", {"length": 3, "max_measurement": 7}, 1),
            [1, 2, 7],
        ),
    ]
    for vdaf, channel, answer in cases:
        randomized = [channel.randomize(answer, rng) for _ in range(3)]
        run(vdaf, randomized)  # the validity proof accepts every randomized answer


def test_injected_rng_replays() -> None:
    channel = KaryResponse(5, 1)

    def draws(seed: int) -> list[int]:
        rng = random.Random(seed)
        return [channel.randomize(2, rng) for _ in range(50)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_default_randomness_is_the_operating_systems(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without an injected rng every channel draws from secrets.SystemRandom
    # (os.urandom): counted here by a SystemRandom that notes each draw.
    drawn: list[int] = []

    class Counting(secrets.SystemRandom):
        def getrandbits(self, k: int) -> int:
            drawn.append(k)
            return super().getrandbits(k)

    monkeypatch.setattr(secrets, "SystemRandom", Counting)
    channels = [
        (KaryResponse(5, 1), 2),
        (MultiOptionResponse(3, 2, 1), [1, 0, 0]),
        (BoundedResponse(5, 1), 3),
        (VectorResponse(2, 5, 1), [1, 4]),
    ]
    for channel, answer in channels:
        drawn.clear()
        channel.randomize(answer)
        assert drawn, f"{type(channel).__name__} drew from something else"
        drawn.clear()
        channel.randomize(answer, random.Random(1))
        assert drawn == []  # an injected rng is the only source


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: KaryResponse(1, 1), "number of options"),
        (lambda: KaryResponse(2, 0), "must be > 0"),
        (lambda: KaryResponse(2, 21), "maximum"),
        (lambda: KaryResponse(2, "nan"), "finite"),
        (lambda: KaryResponse(2, 1).randomize(2), "option index"),
        (lambda: KaryResponse(2, 1).randomize(True), "option index"),
        (lambda: MultiOptionResponse(3, 4, 1), "exceeds"),
        (lambda: MultiOptionResponse(3, 1, 1).randomize([1, 1, 0]), "at most 1"),
        (lambda: MultiOptionResponse(3, 3, 1).randomize([1, 2, 0]), "0/1"),
        (lambda: BoundedResponse(5, 1).randomize(6), r"\[0, 5\]"),
        (lambda: VectorResponse(2, 5, 1).randomize([1]), "2 values"),
        (
            lambda: local_channel("Prio3MultihotCountVec", {"length": 4, "max_weight": 2}, 1),
            "must equal its length",
        ),
        (lambda: local_channel("Prio3Histogram", {}, 1), "'length'"),
        (lambda: local_channel("Prio3Nope", {}, 1), "no local randomized"),
        (lambda: local_channel("Prio3Count", {}, "1/2000"), "below the minimum 1/1000"),
    ],
)
def test_bad_parameters_and_measurements_are_refused(build: object, message: str) -> None:
    with pytest.raises(InvalidParameter, match=message):
        build()  # type: ignore[operator]


# --------------------------------------------------------------------------- estimates


def _noise(plan: NoisePlan, size: int, rng: random.Random) -> np.ndarray:
    noise = plan.server_noise()
    assert noise is not None
    return noise.sample_array(size, rng) + noise.sample_array(size, rng)  # type: ignore[union-attr]


def _check_collections(truths: np.ndarray, estimates: list[list], n: int) -> None:
    """Unbiased (mean within 5 standard errors) and covering (>= 95% less 4 s.e.)."""
    values = np.array([[float(e.value) for e in row] for row in estimates])
    covered = np.array(
        [[e.low <= int(t) <= e.high for e, t in zip(row, truths, strict=True)] for row in estimates]
    )
    runs = len(estimates)
    for j, truth in enumerate(int(t) for t in truths):
        mean, sd = values[:, j].mean(), values[:, j].std(ddof=1)
        rate = covered[:, j].mean()
        print(
            f"coordinate {j}: truth {truth}, mean {mean:.2f} ± {sd / math.sqrt(runs):.2f}, "
            f"coverage {rate:.4f}"
        )
        assert abs(mean - truth) < 5 * sd / math.sqrt(runs)
        assert rate >= 0.95 - 4 * math.sqrt(0.95 * 0.05 / runs)


def test_yes_no_estimates_are_unbiased_and_cover() -> None:
    n, truth = 400, 130
    channel = local_channel("Prio3Count", {}, 1)
    plan = NoisePlan.for_task(DPConfig.geometric(1), "Prio3Count", {})
    p, q = (float(v) for v in channel.bit_probabilities(0))
    gen = np.random.default_rng(19)
    rng = random.Random("yes-no")
    ys = gen.binomial(truth, p, COLLECTIONS) + gen.binomial(n - truth, q, COLLECTIONS)
    ys = ys + _noise(plan, COLLECTIONS, rng)
    estimates = [local_estimate([int(y)], n, channel, plan, 0.05) for y in ys]
    _check_collections(np.array([truth]), estimates, n)


def test_choice_estimates_are_unbiased_and_cover() -> None:
    n, truths = 300, np.array([150, 90, 45, 15])
    channel = local_channel("Prio3Histogram", {"length": 4}, 2)
    plan = NoisePlan.for_task(DPConfig.geometric(1), "Prio3Histogram", {"length": 4})
    assert isinstance(channel, KaryResponse)
    matrix = np.array([[float(v) for v in row] for row in channel.transition()])
    gen = np.random.default_rng(20)
    rng = random.Random("choice")
    counts = sum(gen.multinomial(t, matrix[c], COLLECTIONS) for c, t in enumerate(truths))
    noise = _noise(plan, 4 * COLLECTIONS, rng).reshape(COLLECTIONS, 4)
    observed = counts + noise
    estimates = [local_estimate([int(v) for v in row], n, channel, plan, 0.05) for row in observed]
    _check_collections(truths, estimates, n)


def test_sum_estimates_are_unbiased_and_the_bound_covers() -> None:
    n, runs = 200, 300
    channel = local_channel("Prio3Sum", {"max_measurement": 10}, 2)
    plan = NoisePlan.for_task(DPConfig.geometric(1), "Prio3Sum", {"max_measurement": 10})
    assert isinstance(channel, BoundedResponse)
    answers = [i % 11 for i in range(n)]
    probs = np.array([float(channel.high_probability(x)) for x in answers])
    gen = np.random.default_rng(21)
    rng = random.Random("sum")
    ys = 10 * (gen.random((runs, n)) < probs).sum(axis=1) + _noise(plan, runs, rng)
    estimates = [local_estimate([int(y)], n, channel, plan, 0.05) for y in ys]
    _check_collections(np.array([sum(answers)]), estimates, n)


def test_exact_interval_is_never_wider_than_needed_nor_outside_the_range() -> None:
    channel = local_channel("Prio3Count", {}, 1)
    plan = NoisePlan.for_task(DPConfig.geometric(1), "Prio3Count", {})
    (far_low,) = local_estimate([-1_000], 100, channel, plan)
    (far_high,) = local_estimate([10_000], 100, channel, plan)
    assert (far_low.low, far_low.high) == (0, 0)
    assert (far_high.low, far_high.high) == (100, 100)
    (middle,) = local_estimate([50], 100, channel, plan)
    assert 0 < middle.low < middle.value < middle.high < 100
    assert middle.value == 50  # symmetric channel: 50 of 100 is the centre


def test_without_servers_noise_the_interval_is_the_randomization_alone() -> None:
    channel = local_channel("Prio3Count", {}, 3)
    plan = NoisePlan.for_task(DPConfig.none(), "Prio3Count", {})
    (est,) = local_estimate([60], 100, channel, plan)
    with_noise = NoisePlan.for_task(DPConfig.geometric("0.1"), "Prio3Count", {})
    (wider,) = local_estimate([60], 100, channel, with_noise)
    assert est.low <= est.value <= est.high
    assert wider.high - wider.low > est.high - est.low


def test_error_with_the_local_layer_exceeds_the_error_without() -> None:
    plan = NoisePlan.for_task(DPConfig.geometric(1), "Prio3Count", {})
    errors = [local_error(local_channel("Prio3Count", {}, e), plan, 1_000) for e in (1, 2, 4)]
    without = errors[0][1]
    assert without == pytest.approx(math.sqrt(2 * 2 * math.exp(-1) / (1 - math.exp(-1)) ** 2))
    withs = [w for w, _ in errors]
    assert withs[0] > withs[1] > withs[2] > without
    # ε_L = 1, k = 2: p = e/(e+1), p - q = (e-1)/(e+1); each report's variance p(1-p).
    p = math.e / (math.e + 1)
    rr = math.sqrt(1_000 * p * (1 - p)) / ((math.e - 1) / (math.e + 1))
    assert withs[0] == pytest.approx(
        math.sqrt(rr**2 + (without * (math.e + 1) / (math.e - 1)) ** 2), rel=1e-6
    )
    assert local_error(None, plan, 1_000) == (without, without)


def test_bad_estimate_arguments_are_refused() -> None:
    channel = local_channel("Prio3Count", {}, 1)
    plan = NoisePlan.for_task(DPConfig.geometric(1), "Prio3Count", {})
    with pytest.raises(InvalidParameter, match="alpha"):
        local_estimate([1], 10, channel, plan, alpha=0)
    with pytest.raises(InvalidParameter, match="report_count"):
        local_estimate([1], -1, channel, plan)
