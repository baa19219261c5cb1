"""Mechanism configuration, sensitivity, and noise through the field (veil.dp.mechanisms).

The ε audit runs the whole noise path (secret-share an aggregate, each aggregator adds
its noise mod p, the collector unshards and takes the centred lift) on two
neighbouring aggregates, once per coordinate of a long aggregate share, and bounds the
privacy loss from below with Clopper-Pearson intervals; that lower bound must not
exceed the configured ε, from the collector's view and from one aggregator's view.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from tests.support.dp_audit import (
    AUDIT_CONFIDENCE,
    FIELD64,
    epsilon_lower_bound,
    run_noise_path,
)
from tests.support.modes import LONG
from veil.dp import (
    DiscreteLaplace,
    DPConfig,
    InvalidParameter,
    InvalidSensitivity,
    Mechanism,
    NoiseMode,
    NoisePlan,
    PolyaDifference,
    Sensitivity,
    TotalNoise,
    add_noise,
    apply_noise,
    centred_lift,
    decode,
    draw_noise,
    encode_fixed_point,
    fixed_point_bound,
    noise_half_width,
    sensitivity,
)
from veil.dp.mechanisms import _shift_loss

FIELD128 = 2**66 * 4611686018427387897 + 1

# Seconds in CI; VEIL_TEST_LONG=1 runs ten times as many (sharper lower bounds).
AUDIT_TRIALS = 2_000_000 if LONG else 200_000
# Events around the two neighbouring truths (10 and 11); noise scales here are <= 2.
AUDIT_HALF_WINDOW = 12


# --------------------------------------------------------------------------- config


def test_default_style_constructors() -> None:
    config = DPConfig.geometric("0.5")
    assert config.mechanism is Mechanism.GEOMETRIC
    assert config.epsilon == Fraction(1, 2)
    assert config.mode is NoiseMode.INDEPENDENT
    assert DPConfig.geometric(0.1).epsilon == Fraction(1, 10)  # the decimal meant
    assert DPConfig.laplace(1, 8).fixed_point_bits == 8
    assert DPConfig.gaussian("1/8").rho == Fraction(1, 8)
    assert DPConfig.parse("geometric", epsilon="2", mode="split").mode is NoiseMode.SPLIT


@pytest.mark.parametrize(
    "epsilon", [0, -1, "-0.1", float("inf"), float("nan"), "inf", "NaN", 21, "20.000001"]
)
def test_bad_epsilon_is_refused(epsilon) -> None:
    with pytest.raises(InvalidParameter, match="epsilon"):
        DPConfig.geometric(epsilon)
    with pytest.raises(InvalidParameter, match="epsilon"):
        DPConfig.parse("laplace", epsilon=epsilon)


def test_epsilon_twenty_is_the_maximum() -> None:
    assert DPConfig.geometric(20).epsilon == 20


def test_mechanism_combinations_are_checked() -> None:
    with pytest.raises(InvalidParameter, match="rho"):
        DPConfig(Mechanism.GAUSSIAN)
    with pytest.raises(InvalidParameter, match="rho"):
        DPConfig.parse("gaussian", epsilon=1)
    with pytest.raises(InvalidParameter, match="epsilon"):
        DPConfig(Mechanism.GEOMETRIC)
    with pytest.raises(InvalidParameter, match="rho"):
        DPConfig(Mechanism.GEOMETRIC, epsilon=Fraction(1), rho=Fraction(1))
    with pytest.raises(InvalidParameter, match="split"):
        DPConfig(Mechanism.GAUSSIAN, rho=Fraction(1), mode=NoiseMode.SPLIT)
    with pytest.raises(InvalidParameter, match="fixed_point_bits"):
        DPConfig(Mechanism.GEOMETRIC, epsilon=Fraction(1), fixed_point_bits=4)
    with pytest.raises(InvalidParameter, match="fixed_point_bits"):
        DPConfig.laplace(1, 33)
    with pytest.raises(InvalidParameter, match="no noise"):
        DPConfig(Mechanism.NONE, epsilon=Fraction(1))
    with pytest.raises(InvalidParameter, match="unknown DP mechanism"):
        DPConfig.parse("laplacian", epsilon=1)
    with pytest.raises(InvalidParameter, match="unknown DP mechanism"):
        DPConfig.parse("", epsilon=1)
    with pytest.raises(InvalidParameter, match="mechanism must be"):
        DPConfig("geometric", epsilon=Fraction(1))  # type: ignore[arg-type]


def test_config_is_frozen() -> None:
    config = DPConfig.geometric(1)
    with pytest.raises(AttributeError):
        config.epsilon = Fraction(5)  # type: ignore[misc]


# --------------------------------------------------------------------------- sensitivity


@pytest.mark.parametrize(
    ("vdaf", "params", "l1", "l2_squared"),
    [
        ("Prio3Count", {}, 1, 1),
        ("Prio3Sum", {"max_measurement": 255}, 255, 255**2),
        ("Prio3SumVec", {"length": 10, "max_measurement": 3, "chunk_length": 4}, 30, 90),
        ("Prio3SumVec", {"length": 10, "bits": 2, "chunk_length": 4}, 30, 90),
        ("Prio3SumVecField64MultiproofHmacSha256Aes128", {"length": 4, "max_measurement": 1}, 4, 4),
        ("Prio3Histogram", {"length": 7, "chunk_length": 3}, 2, 2),
        ("Prio3Histogram", {"length": 1, "chunk_length": 1}, 1, 1),
        ("Prio3MultihotCountVec", {"length": 10, "max_weight": 3, "chunk_length": 2}, 6, 6),
        ("Prio3MultihotCountVec", {"length": 4, "max_weight": 3, "chunk_length": 2}, 4, 4),
        ("Prio3L1BoundSum", {"length": 10, "max_value": 240, "chunk_length": 9}, 480, 2 * 240**2),
        ("Prio3L1BoundSum", {"length": 1, "max_value": 7}, 7, 49),
    ],
)
def test_sensitivity_per_type(vdaf, params, l1, l2_squared) -> None:
    derived = sensitivity(vdaf, params)
    assert (derived.l1, derived.l2_squared) == (l1, l2_squared)


@pytest.mark.parametrize(
    ("vdaf", "params"),
    [
        ("Prio3Sum", {}),
        ("Prio3Sum", {"max_measurement": 0}),
        ("Prio3SumVec", {"length": 3}),
        ("Prio3Histogram", {"length": True}),
        ("Prio3MultihotCountVec", {"length": 2, "max_weight": 3}),
        ("Prio3Nope", {}),
    ],
)
def test_sensitivity_refuses_bad_types(vdaf, params) -> None:
    with pytest.raises(InvalidSensitivity):
        sensitivity(vdaf, params)


def test_declared_sensitivity_must_fit_the_type() -> None:
    config = DPConfig.geometric(1)
    with pytest.raises(InvalidSensitivity, match="does not fit"):
        NoisePlan.for_task(config, "Prio3Histogram", {"length": 4}, declared_l1=1)
    with pytest.raises(InvalidSensitivity, match="multiple"):
        NoisePlan.for_task(config, "Prio3Histogram", {"length": 4}, declared_l1=3)
    with pytest.raises(InvalidSensitivity):
        NoisePlan.for_task(config, "Prio3Count", {}, declared_l1=0)
    wider = NoisePlan.for_task(config, "Prio3Histogram", {"length": 4}, declared_l1=4)
    assert wider.sensitivity == Sensitivity(2, 2)
    assert wider.scale == 4


def test_plan_parameters() -> None:
    plan = NoisePlan.for_task(DPConfig.geometric("0.5"), "Prio3Sum", {"max_measurement": 3})
    assert plan.scale == 6
    gauss = NoisePlan.for_task(DPConfig.gaussian("1/2"), "Prio3Histogram", {"length": 3})
    assert gauss.sigma_squared == 2  # Δ₂² / (2ρ) = 2 / 1
    assert gauss.scale is None and gauss.epsilon is None and gauss.server_rho == Fraction(1, 2)


def test_split_mode_reports_a_weaker_server_epsilon() -> None:
    independent = NoisePlan.for_task(DPConfig.geometric(1), "Prio3Count", {})
    split = NoisePlan.for_task(
        DPConfig.geometric(1, NoiseMode.SPLIT), "Prio3Histogram", {"length": 5}
    )
    assert independent.server_epsilon == 1
    assert split.epsilon == 1
    assert split.server_epsilon is not None
    # Between ε and the rigorous bound ε + Δ·ln 2 for the Pólya(1/2) difference.
    assert 1 < split.server_epsilon <= 1 + 2 * math.log(2) + 1e-6


def _within(length: int, bound: int) -> list[tuple[int, ...]]:
    """Every vector of `length` non-negative ints summing to at most `bound`."""
    if length == 0:
        return [()]
    return [(v, *rest) for v in range(bound + 1) for rest in _within(length - 1, bound - v)]


@pytest.mark.parametrize(("length", "bound"), [(1, 3), (2, 2), (3, 2), (4, 3), (5, 2)])
@pytest.mark.parametrize("scale", ["1/2", 3])
def test_l1_bound_sum_sensitivity_is_the_worst_pair(length: int, bound: int, scale) -> None:
    """Prio3L1BoundSum's Δ₁, Δ₂² and split-mode loss against one aggregator are
    the largest over every pair of valid answers (replaced) and over every answer
    against none (added or removed), found by brute force."""
    answers = _within(length, bound)
    noise = PolyaDifference(Fraction(scale), 2)
    loss = {m: _shift_loss(noise, m) for m in range(2 * bound + 1)}
    for neighbouring, pairs in (
        ("replace_one", [(x, y) for x in answers for y in answers]),
        ("add_remove", [(x, (0,) * length) for x in answers]),
    ):
        deltas = [[abs(a - b) for a, b in zip(x, y, strict=True)] for x, y in pairs]
        derived = sensitivity(
            "Prio3L1BoundSum", {"length": length, "max_value": bound}, neighbouring
        )
        assert derived.l1 == max(sum(d) for d in deltas)
        assert derived.l2_squared == max(sum(m * m for m in d) for d in deltas)
        worst = max(sum(loss[m] for m in d) for d in deltas)
        # The plan's ε against one aggregator in split mode at the scale Δ₁/ε.
        epsilon = Fraction(derived.l1) / Fraction(scale)
        plan = NoisePlan(DPConfig.geometric(epsilon, NoiseMode.SPLIT), derived)
        assert plan.scale == Fraction(scale)
        assert plan.server_epsilon is not None
        assert worst <= float(plan.server_epsilon) <= worst + 2e-6, neighbouring


def test_l1_bound_sum_declared_sensitivity() -> None:
    params = {"length": 6, "max_value": 10}
    config = DPConfig.geometric(1)
    with pytest.raises(InvalidSensitivity, match="move the aggregate by 20 in L1"):
        NoisePlan.for_task(config, "Prio3L1BoundSum", params, declared_l1=19)
    wider = NoisePlan.for_task(config, "Prio3L1BoundSum", params, declared_l1=25)
    assert wider.scale == 25 and wider.sensitivity.l1 == 25
    assert (
        wider.sensitivity.l2_squared == 25**2 >= sensitivity("Prio3L1BoundSum", params).l2_squared
    )


# --------------------------------------------------------------------------- field


@pytest.mark.parametrize("modulus", [FIELD64, FIELD128])
def test_negative_noise_wraps_and_decodes_back(modulus) -> None:
    assert apply_noise([0], [-3], modulus) == [modulus - 3]
    assert decode(apply_noise([0], [-3], modulus), modulus) == [-3]
    assert apply_noise([modulus - 1], [2], modulus) == [1]
    rng = random.Random(f"wrap-{modulus}")
    truth = [0, 1, 5, 1000, 0, 0, 7, 2**20]
    leader = [rng.randrange(modulus) for _ in truth]
    helper = [(t - s) % modulus for t, s in zip(truth, leader, strict=True)]
    plan = NoisePlan.for_task(DPConfig.geometric("0.1"), "Prio3Count", {})
    noise_l = draw_noise(plan, len(truth), rng)
    noise_h = draw_noise(plan, len(truth), rng)
    assert any(z < 0 for z in noise_l + noise_h)
    noised_l = apply_noise(leader, noise_l, modulus)
    noised_h = apply_noise(helper, noise_h, modulus)
    combined = [(a + b) % modulus for a, b in zip(noised_l, noised_h, strict=True)]
    expected = [t + a + b for t, a, b in zip(truth, noise_l, noise_h, strict=True)]
    assert decode(combined, modulus) == expected
    assert any(v < 0 for v in expected)


def test_centred_lift_boundary() -> None:
    p = FIELD64
    assert centred_lift((p - 1) // 2, p) == (p - 1) // 2
    assert centred_lift((p + 1) // 2, p) == (p + 1) // 2 - p
    assert centred_lift(0, p) == 0
    assert centred_lift(p - 1, p) == -1
    with pytest.raises(InvalidParameter):
        centred_lift(p, p)
    with pytest.raises(InvalidParameter):
        centred_lift(-1, p)


def test_add_noise_returns_a_new_list_in_the_field() -> None:
    plan = NoisePlan.for_task(DPConfig.geometric(1), "Prio3Histogram", {"length": 100})
    share = [5] * 100
    noised = add_noise(share, FIELD64, plan, random.Random(3))
    assert share == [5] * 100
    assert len(noised) == 100 and all(0 <= v < FIELD64 for v in noised)
    assert noised != share
    with pytest.raises(InvalidParameter, match="not in"):
        add_noise([FIELD64], FIELD64, plan)
    with pytest.raises(InvalidParameter, match="coordinates"):
        apply_noise([1, 2], [0], FIELD64)
    with pytest.raises(InvalidParameter, match="modulus"):
        apply_noise([1], [0], 1)


def test_none_mechanism_adds_nothing_and_warns(caplog) -> None:
    plan = NoisePlan.for_task(DPConfig.none(), "Prio3Count", {})
    with caplog.at_level(logging.WARNING, logger="veil.dp"):
        assert add_noise([1, 2, 3], FIELD64, plan) == [1, 2, 3]
    assert any("'none'" in record.message for record in caplog.records)


def test_noise_does_not_depend_on_the_share() -> None:
    # Same rng state, different data: identical noise (drawn from public length only).
    plan = NoisePlan.for_task(DPConfig.geometric(1), "Prio3Count", {})
    a = add_noise([0] * 50, FIELD64, plan, random.Random(9))
    b = add_noise([10] * 50, FIELD64, plan, random.Random(9))
    assert [(y - x) % FIELD64 for x, y in zip(a, b, strict=True)] == [10] * 50


# --------------------------------------------------------------------------- noise path


def audit(plan: NoisePlan, seed: str) -> tuple[float, float]:
    """Lower bounds on the privacy loss seen by (the collector, the leader)."""
    rng = random.Random(seed)
    result_a, view_a = run_noise_path(plan, 10, AUDIT_TRIALS, rng)
    result_b, view_b = run_noise_path(plan, 11, AUDIT_TRIALS, rng)
    window = range(10 - AUDIT_HALF_WINDOW, 11 + AUDIT_HALF_WINDOW + 1)
    return (
        epsilon_lower_bound(result_a, result_b, window),
        epsilon_lower_bound(view_a, view_b, window),
    )


@pytest.mark.parametrize("epsilon", ["1", "0.5"])
def test_epsilon_audit_independent_mode(epsilon) -> None:
    plan = NoisePlan.for_task(DPConfig.geometric(epsilon), "Prio3Count", {})
    collector, leader = audit(plan, f"audit-{epsilon}")
    print(f"audit independent ε={epsilon}: collector LCB {collector:.4f}, leader LCB {leader:.4f}")
    assert collector <= float(plan.epsilon)
    assert leader <= float(plan.server_epsilon)
    # The leader's view carries one discrete Laplace, whose loss is exactly ε: a
    # sharp audit gets close, which shows it could detect an overspend.
    assert leader > 0.9 * float(plan.epsilon)


def test_epsilon_audit_split_mode() -> None:
    plan = NoisePlan.for_task(DPConfig.geometric(1, NoiseMode.SPLIT), "Prio3Count", {})
    collector, leader = audit(plan, "audit-split")
    print(
        f"audit split ε=1: collector LCB {collector:.4f} (ε 1), "
        f"leader LCB {leader:.4f} (reported server ε {float(plan.server_epsilon):.4f})"
    )
    assert collector <= 1
    assert leader <= float(plan.server_epsilon)
    # Split mode really is weaker against one aggregator: the audit sees more than ε.
    assert leader > 1


def test_epsilon_audit_detects_too_little_noise() -> None:
    # Noise calibrated for ε = 2 audited against a claimed ε = 1 must be caught.
    too_little = NoisePlan.for_task(DPConfig.geometric(2), "Prio3Count", {})
    _, leader = audit(too_little, "audit-broken")
    print(f"audit control (noise for ε=2, claimed ε=1): leader LCB {leader:.4f}")
    assert leader > 1


@pytest.mark.parametrize(
    "config",
    [
        DPConfig.geometric("0.7"),
        DPConfig.geometric("0.7", NoiseMode.SPLIT),
        DPConfig.gaussian("0.2"),
    ],
    ids=["geometric-independent", "geometric-split", "gaussian-independent"],
)
def test_total_noise_through_the_field_fits_the_published_pmf(gof, config) -> None:
    plan = NoisePlan.for_task(config, "Prio3Count", {})
    result, _ = run_noise_path(plan, 3, 100_000, random.Random(f"total-{config}"), FIELD128)
    centre, table = plan.total_noise_pmf()
    p = gof(result - 3, -centre, table)
    print(f"GOF total noise {config.mechanism}/{config.mode}: p = {p:.4f}")
    assert p > 1e-3


# --------------------------------------------------------------------------- total noise


def test_total_noise_closed_forms_match_the_convolution() -> None:
    single = DiscreteLaplace(3)
    two = TotalNoise((single, single))
    table = np.convolve(single.pmf_table(), single.pmf_table())
    centre = (table.size - 1) // 2
    for z in (0, 1, -1, 5, 40):
        assert two.pmf(z) == pytest.approx(table[centre + z], rel=1e-9)
    for c in (0, 3, 10, 50):
        assert two.central_mass(c) == pytest.approx(
            table[centre - c : centre + c + 1].sum(), abs=1e-12
        )
    one = TotalNoise((single,))
    assert one.central_mass(4) == pytest.approx(sum(single.pmf(z) for z in range(-4, 5)), abs=1e-14)
    assert two.variance() == pytest.approx(2 * single.variance())


def test_large_scales_need_no_tables() -> None:
    # Δ = 2**16 at ε = 0.5: scale 131072; closed forms keep this instantaneous.
    for mode in NoiseMode:
        plan = NoisePlan.for_task(
            DPConfig.laplace("0.5", 16, mode), "Prio3Sum", {"max_measurement": 2**16}
        )
        noise = plan.total_noise()
        c, coverage = noise_half_width(plan, 0.05)
        assert coverage >= 0.95 > noise.central_mass(c - 1)
        assert c > 100_000
    split = NoisePlan.for_task(
        DPConfig.geometric("0.5", NoiseMode.SPLIT), "Prio3Sum", {"max_measurement": 2**16}
    )
    # One coordinate moving by m = 2**16: the loss is ε plus at most ln(1/c_m), where
    # c_m = Γ(m + 1/2)/(Γ(1/2) m!) is the NB(1/2) coefficient (about 1/sqrt(π m)).
    m = 2**16
    log_inv_c = math.lgamma(0.5) + math.lgamma(m + 1) - math.lgamma(m + 0.5)
    assert 0.5 < float(split.server_epsilon) <= 0.5 + log_inv_c + 1e-6


@pytest.mark.parametrize(("scale", "shift"), [(1, 1), ("0.4", 1), (3, 2), (10, 7)])
def test_split_shift_loss_is_attained_at_zero(scale, shift) -> None:
    # The supremum over all windows, found by brute force on the table, is the value
    # at d = 0 that server_epsilon uses (log-convexity argument in _shift_loss).
    noise = PolyaDifference(scale, 2)
    table = noise.pmf_table()
    half = (table.size - 1) // 2
    logs = np.log(table[half - half // 2 : half + half // 2 + 1])
    brute = float(np.max(np.abs(logs[shift:] - logs[:-shift])))
    assert _shift_loss(noise, shift) == pytest.approx(brute, rel=1e-9)


# --------------------------------------------------------------------------- fixed point


def test_fixed_point_encoding_scales_the_sensitivity() -> None:
    assert encode_fixed_point("1.5", 8) == 384
    assert encode_fixed_point("0.001", 8) == 0  # below the granularity
    assert encode_fixed_point(Fraction(3, 512), 8) == 2  # 1.5 rounds to even
    bound = fixed_point_bound("1.5", 8)
    assert bound == 384 and fixed_point_bound("0.0001", 8) == 1
    plan = NoisePlan.for_task(DPConfig.laplace(1, 8), "Prio3Sum", {"max_measurement": bound})
    assert plan.scale == 384  # Δ = 1.5 · 2**8, noise still an integer
    with pytest.raises(InvalidParameter):
        encode_fixed_point(1, 33)
    with pytest.raises(InvalidParameter):
        fixed_point_bound(0, 8)


def joint_lower_bound(x: np.ndarray, y: np.ndarray, window: range) -> float:
    """epsilon_lower_bound for 2-coordinate outputs, over point events {(v1, v2)}."""
    width = len(window)
    base = window.start

    def cell(points: np.ndarray) -> np.ndarray:
        inside = np.all((points >= base) & (points < base + width), axis=1)
        flat = (points[inside, 0] - base) * width + (points[inside, 1] - base)
        return np.bincount(flat, minlength=width * width)

    cx, cy = cell(x), cell(y)
    level = AUDIT_CONFIDENCE / (4 * cx.size)
    best = 0.0
    n = x.shape[0]
    for a, b in zip(cx.tolist(), cy.tolist(), strict=True):
        for k_num, k_den in ((a, b), (b, a)):
            if k_num == 0:
                continue
            p_num_low = stats.beta.ppf(level, k_num, n - k_num + 1)
            p_den_high = stats.beta.ppf(1 - level, k_den + 1, n - k_den)
            best = max(best, math.log(p_num_low / p_den_high))
    return best


@pytest.mark.parametrize("mode", list(NoiseMode))
def test_epsilon_audit_histogram_from_one_aggregator(mode) -> None:
    # Neighbours [5, 3] and [4, 4]: one report moved between buckets, Δ₁ = 2, so two
    # coordinates move at once; the split mode's per-server ε composes over both.
    plan = NoisePlan.for_task(DPConfig.geometric(1, mode), "Prio3Histogram", {"length": 2})
    rng = random.Random(f"audit-histogram-{mode}")
    trials = 150_000
    views = []
    for truth in ((5, 3), (4, 4)):
        # Each bucket goes through the noise path on its own (the aggregators' noise
        # is independent per coordinate), `trials` times.
        _, view_first = run_noise_path(plan, truth[0], trials, rng)
        _, view_second = run_noise_path(plan, truth[1], trials, rng)
        views.append(np.stack([view_first, view_second], axis=1))
    bound = joint_lower_bound(views[0], views[1], range(-2, 12))
    print(
        f"audit histogram {mode}: leader LCB {bound:.4f}, server ε {float(plan.server_epsilon):.4f}"
    )
    assert bound <= float(plan.server_epsilon)
    assert bound > 0.85 * float(plan.server_epsilon)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([FIELD64, FIELD128]), st.data())
def test_centred_lift_inverts_reduction(modulus, data) -> None:
    half = (modulus - 1) // 2
    value = data.draw(st.integers(min_value=-half, max_value=half))
    assert centred_lift(value % modulus, modulus) == value
    noise = data.draw(st.integers(min_value=-(2**40), max_value=2**40))
    share = data.draw(st.integers(min_value=0, max_value=modulus - 1))
    rest = (value - share) % modulus
    combined = (apply_noise([share], [noise], modulus)[0] + rest) % modulus
    if abs(value + noise) <= half:
        assert centred_lift(combined, modulus) == value + noise


def test_a_plan_with_one_noising_aggregator() -> None:
    """The noise of a task whose other aggregator adds none (a DAP peer): one
    draw of the same distribution, the same charge; split mode refused."""
    both = NoisePlan.for_task(DPConfig.geometric(1), "Prio3Count", {})
    one = dataclasses.replace(both, noising=1)
    assert one.total_noise() == TotalNoise((DiscreteLaplace(Fraction(1)),))
    assert both.total_noise() == TotalNoise((DiscreteLaplace(Fraction(1)),) * 2)
    assert one.charge == both.charge == 1
    for bad in (0, 3, -1, True, 1.0, "1"):
        with pytest.raises(InvalidParameter, match="noising must be an int in \\[1, 2\\]"):
            dataclasses.replace(both, noising=bad)
    split = NoisePlan.for_task(DPConfig.geometric(1, NoiseMode.SPLIT), "Prio3Count", {})
    with pytest.raises(InvalidParameter, match="with only one adding noise use independent"):
        dataclasses.replace(split, noising=1)
