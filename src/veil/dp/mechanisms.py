"""DP mechanisms per task: configuration, sensitivity, and noise in the field.

A task fixes a `DPConfig` (mechanism, ε or ρ, noise mode, fixed-point bits). Its
Prio3 type fixes the sensitivity under *replacement* of one report (the report count
is published, as in DAP). Together they make a `NoisePlan`, which says what each
aggregator draws, what total noise the collector's result carries, and what privacy
each party gets.

Noise lives in the field: an integer z is added as z mod p to a coordinate of the
aggregate share; the collector undoes the wrap with the centred lift (v >= p/2 means
v - p), which is exact as long as |aggregate + noise| < p/2.
"""

from __future__ import annotations

import enum
import functools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from veil.dp._exact import RandomSource
from veil.dp.distributions import (
    DiscreteGaussian,
    DiscreteLaplace,
    PolyaDifference,
    convolve,
    exact_rational,
)
from veil.dp.errors import InvalidParameter, InvalidSensitivity
from veil.dp.sensitivities import Sensitivity, sensitivity

__all__ = [
    "AGGREGATORS",
    "MAX_EPSILON",
    "MAX_FIXED_POINT_BITS",
    "MAX_RHO",
    "MIN_EPSILON",
    "MIN_RHO",
    "DPConfig",
    "Mechanism",
    "NoiseMode",
    "NoisePlan",
    "Sensitivity",
    "TotalNoise",
    "add_noise",
    "apply_noise",
    "centred_lift",
    "decode",
    "draw_noise",
    "encode_fixed_point",
    "fixed_point_bound",
    "parse_budget",
    "sensitivity",
]

log = logging.getLogger("veil.dp")

# Above ε = 20 the output distributions of neighbours may differ by e**20 ≈ 5·10**8:
# that is no longer a privacy guarantee, so it is refused as a likely mistake.
MAX_EPSILON = Fraction(20)
# Below ε = 1/1000 the noise (scale 1000·Δ per collection) buries any batch a
# deployment can gather: a value such as 1e-30 is a slip, not a choice.
MIN_EPSILON = Fraction(1, 1000)
# ρ is held to the same range of guarantees as ε. ρ-zCDP gives
# (ρ + 2√(ρ·ln(1/δ)), δ)-DP (Bun and Steinke 2016, Prop. 1.3); at δ = 10**-6,
# ρ = 4 gives ε ≈ 18.9, within MAX_EPSILON (ρ = 20 gave ε ≈ 53). A pure ε-DP
# mechanism is (ε²/2)-zCDP (Prop. 1.4), so the ρ of MIN_EPSILON is ε²/2.
MAX_RHO = Fraction(4)
MIN_RHO = MIN_EPSILON**2 / 2
# Granularity 2**-32 is finer than any measurement a bounded Prio3 type can carry
# usefully in Field64; more bits only make Δ (and the noise) larger.
MAX_FIXED_POINT_BITS = 32
# veil runs Prio3 between exactly two aggregators (leader and helper).
AGGREGATORS = 2
# The largest discrete Laplace scale the split mode divides (see NoisePlan).
MAX_SPLIT_SCALE = 1 << 17


class Mechanism(enum.StrEnum):
    """How noise is drawn. `NONE` must be chosen explicitly and is logged as a warning."""

    GEOMETRIC = "geometric"  # discrete Laplace, scale Δ/ε: pure ε-DP (the default)
    LAPLACE = "laplace"  # the same on fixed-point values at granularity 2**-bits
    GAUSSIAN = "gaussian"  # discrete Gaussian, σ² = Δ₂²/(2ρ): ρ-zCDP
    NONE = "none"  # no noise at all: no privacy beyond secret sharing


class NoiseMode(enum.StrEnum):
    """Who adds how much noise."""

    # Each aggregator adds the full noise: ε-DP even against one aggregator that knows
    # its own noise (the default).
    INDEPENDENT = "independent"
    # Each adds a Pólya-difference share, the total being exactly one discrete Laplace:
    # half the variance, but one aggregator alone sees a weaker ε (NoisePlan.server_epsilon).
    SPLIT = "split"


def parse_budget(
    value: int | float | Fraction | str,
    what: str,
    maximum: Fraction,
    minimum: Fraction | None = None,
) -> Fraction:
    """An ε or ρ as an exact Fraction in (0, maximum], and at least `minimum` if given.

    A float is taken as the decimal it prints as (0.1 means 1/10, not the binary
    double nearest to it), which is the number its writer meant.
    """
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidParameter(f"{what} must be finite, got {value}")
        value = repr(value)
    if isinstance(value, str) and value.strip().lower().lstrip("+-") in {"inf", "infinity", "nan"}:
        raise InvalidParameter(f"{what} must be finite, got {value!r}")
    exact = exact_rational(value, what)
    if exact <= 0:
        raise InvalidParameter(f"{what} must be > 0, got {exact}")
    if minimum is not None and exact < minimum:
        raise InvalidParameter(
            f"{what} = {exact} is below the minimum {minimum}: the noise would bury any "
            f"result; choose {what} >= {minimum}"
        )
    if exact > maximum:
        raise InvalidParameter(
            f"{what} = {exact} is above the maximum {maximum}: that is no meaningful "
            f"privacy guarantee; choose {what} <= {maximum}"
        )
    return exact


@dataclass(frozen=True)
class DPConfig:
    """The DP parameters of one task (immutable, validated on construction).

    Use the constructors `geometric`, `laplace`, `gaussian`, `none` or `parse`
    (for untyped task definitions); all refuse bad input with `InvalidParameter`.
    """

    mechanism: Mechanism
    epsilon: Fraction | None = None
    rho: Fraction | None = None
    mode: NoiseMode = NoiseMode.INDEPENDENT
    fixed_point_bits: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.mechanism, Mechanism):
            raise InvalidParameter(f"mechanism must be a Mechanism, got {self.mechanism!r}")
        if not isinstance(self.mode, NoiseMode):
            raise InvalidParameter(f"mode must be a NoiseMode, got {self.mode!r}")
        bits = self.fixed_point_bits
        if isinstance(bits, bool) or not isinstance(bits, int):
            raise InvalidParameter(f"fixed_point_bits must be an int, got {bits!r}")
        for name in ("epsilon", "rho"):
            value = getattr(self, name)
            if value is not None:
                maximum = MAX_EPSILON if name == "epsilon" else MAX_RHO
                minimum = MIN_EPSILON if name == "epsilon" else MIN_RHO
                object.__setattr__(self, name, parse_budget(value, name, maximum, minimum))
        mech = self.mechanism
        if mech in (Mechanism.GEOMETRIC, Mechanism.LAPLACE):
            if self.epsilon is None:
                raise InvalidParameter(f"mechanism {mech} needs epsilon")
            if self.rho is not None:
                raise InvalidParameter(f"mechanism {mech} takes epsilon, not rho")
        elif mech is Mechanism.GAUSSIAN:
            if self.rho is None:
                raise InvalidParameter(
                    "mechanism gaussian needs rho (the zCDP parameter); for pure ε-DP use geometric"
                )
            if self.epsilon is not None:
                raise InvalidParameter("mechanism gaussian takes rho, not epsilon")
        elif self.epsilon is not None or self.rho is not None:
            raise InvalidParameter("mechanism none adds no noise and takes no epsilon or rho")
        if self.mode is NoiseMode.SPLIT and mech not in (Mechanism.GEOMETRIC, Mechanism.LAPLACE):
            raise InvalidParameter(
                f"split mode divides a discrete Laplace between the aggregators; "
                f"mechanism {mech} supports only independent mode"
            )
        if mech is Mechanism.LAPLACE:
            if not 0 <= bits <= MAX_FIXED_POINT_BITS:
                raise InvalidParameter(
                    f"fixed_point_bits must be in [0, {MAX_FIXED_POINT_BITS}], got {bits}"
                )
        elif bits != 0:
            raise InvalidParameter(
                f"fixed_point_bits applies to mechanism laplace only, not {mech}"
            )

    @classmethod
    def geometric(
        cls, epsilon: int | float | Fraction | str, mode: NoiseMode = NoiseMode.INDEPENDENT
    ) -> DPConfig:
        """Discrete Laplace with scale Δ/ε: pure ε-DP (the default mechanism)."""
        return cls(
            Mechanism.GEOMETRIC,
            epsilon=parse_budget(epsilon, "epsilon", MAX_EPSILON, MIN_EPSILON),
            mode=mode,
        )

    @classmethod
    def laplace(
        cls,
        epsilon: int | float | Fraction | str,
        fixed_point_bits: int,
        mode: NoiseMode = NoiseMode.INDEPENDENT,
    ) -> DPConfig:
        """Discrete Laplace on fixed-point values encoded as round(x · 2**bits).

        The Prio3 parameters (e.g. Sum's max_measurement = fixed_point_bound(M, bits))
        are in encoded units, so the sensitivity and the scale Δ/ε are 2**bits times
        those of the real values; the noise stays an exact integer, and the collector's
        estimates are divided by 2**bits.
        """
        return cls(
            Mechanism.LAPLACE,
            epsilon=parse_budget(epsilon, "epsilon", MAX_EPSILON, MIN_EPSILON),
            mode=mode,
            fixed_point_bits=fixed_point_bits,
        )

    @classmethod
    def gaussian(cls, rho: int | float | Fraction | str) -> DPConfig:
        """Discrete Gaussian with σ² = Δ₂²/(2ρ): ρ-zCDP."""
        return cls(Mechanism.GAUSSIAN, rho=parse_budget(rho, "rho", MAX_RHO, MIN_RHO))

    @classmethod
    def none(cls) -> DPConfig:
        """No noise. Only for tests and deployments that accept no DP; logged as a warning."""
        return cls(Mechanism.NONE)

    @classmethod
    def parse(
        cls,
        mechanism: str,
        epsilon: int | float | Fraction | str | None = None,
        rho: int | float | Fraction | str | None = None,
        mode: str = "independent",
        fixed_point_bits: int = 0,
    ) -> DPConfig:
        """From untyped task settings; the mechanism must be named (no silent default)."""
        try:
            mech = Mechanism(mechanism)
        except ValueError:
            known = ", ".join(m.value for m in Mechanism)
            raise InvalidParameter(
                f"unknown DP mechanism {mechanism!r}; choose one of {known}"
            ) from None
        try:
            noise_mode = NoiseMode(mode)
        except ValueError:
            known = ", ".join(m.value for m in NoiseMode)
            raise InvalidParameter(f"unknown noise mode {mode!r}; choose one of {known}") from None
        return cls(
            mech,
            epsilon=None
            if epsilon is None
            else parse_budget(epsilon, "epsilon", MAX_EPSILON, MIN_EPSILON),
            rho=None if rho is None else parse_budget(rho, "rho", MAX_RHO, MIN_RHO),
            mode=noise_mode,
            fixed_point_bits=fixed_point_bits,
        )


def encode_fixed_point(value: int | Fraction | str, bits: int) -> int:
    """The integer a client submits for `value` at granularity 2**-bits.

    round(value · 2**bits), ties to even. With the laplace mechanism the Prio3 type's
    parameters are in these units, so its sensitivity is already scaled by 2**bits;
    `fixed_point_bound` turns a real bound into such a parameter.
    """
    _check_bits(bits)
    return round(exact_rational(value, "value") * (1 << bits))


def fixed_point_bound(real_max: int | Fraction | str, bits: int) -> int:
    """ceil(real_max · 2**bits): the max_measurement that admits every encoded value."""
    _check_bits(bits)
    exact = exact_rational(real_max, "real_max")
    if exact <= 0:
        raise InvalidParameter(f"real_max must be > 0, got {exact}")
    scaled = exact * (1 << bits)
    return -((-scaled.numerator) // scaled.denominator)


def _check_bits(bits: int) -> None:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 0 <= bits <= MAX_FIXED_POINT_BITS:
        raise InvalidParameter(
            f"fixed-point bits must be an int in [0, {MAX_FIXED_POINT_BITS}], got {bits!r}"
        )


# --------------------------------------------------------------------------- total noise


@dataclass(frozen=True)
class TotalNoise:
    """The sum of independent noises, all the same distribution (or none at all).

    `central_mass(c)` = P(|Z| <= c) is what confidence intervals need; for discrete
    Laplace summands it has a closed form, so no table is built for them however
    large the scale.
    """

    parts: tuple[DiscreteLaplace | DiscreteGaussian, ...]

    def __post_init__(self) -> None:
        if len(set(self.parts)) > 1:
            raise InvalidParameter("TotalNoise sums copies of one distribution")

    def _laplace(self) -> tuple[float, int] | None:
        """(x, count) with x = 1/scale, for one or two discrete Laplace summands.

        Everything below is written in x with expm1, never 1 - exp(-x): at a scale
        of 1e16, q = exp(-x) is 1.0 in double precision and 1 - q is 0."""
        if self.parts and isinstance(self.parts[0], DiscreteLaplace) and len(self.parts) <= 2:
            x = float(1 / self.parts[0].scale)
            if x == 0.0:
                digits = len(str(int(self.parts[0].scale)))
                raise InvalidParameter(
                    f"a discrete Laplace scale of {digits} digits is beyond double precision:"
                    " no interval can be computed"
                )
            return x, len(self.parts)
        return None

    def pmf(self, z: int) -> float:
        """P(Z = z)."""
        laplace = self._laplace()
        if laplace is not None:
            x, count = laplace
            c0 = math.tanh(x / 2)  # (1 - q) / (1 + q)
            q_z = math.exp(-x * abs(z))
            if count == 1:
                return c0 * q_z
            # Σ_k q**(|k| + |z-k|) = q**|z| · (|z| + 1 + 2q²/(1-q²)).
            return c0 * c0 * q_z * (abs(z) + 1 + 2 * math.exp(-2 * x) / -math.expm1(-2 * x))
        if not self._tabulable:
            return self._normal_pmf(z)
        table = self._table
        centre = (table.size - 1) // 2
        return float(table[z + centre]) if abs(z) <= centre else 0.0

    def central_mass(self, c: int) -> float:
        """P(|Z| <= c) for an integer c >= 0."""
        if not self.parts:
            return 1.0
        laplace = self._laplace()
        if laplace is not None:
            x, count = laplace
            q = math.exp(-x)
            if count == 1:
                return 1 - 2 * math.exp(-x * (c + 1)) / (1 + q)
            # P(Z >= z) for z >= 1 from the pmf above, summed in closed form.
            z = c + 1
            one_minus_q = -math.expm1(-x)
            c0 = math.tanh(x / 2)
            h = 1 + 2 * math.exp(-2 * x) / -math.expm1(-2 * x)
            tail = (
                c0
                * c0
                * math.exp(-x * z)
                * (h / one_minus_q + (z * one_minus_q + q) / one_minus_q**2)
            )
            return 1 - 2 * tail
        if not self._tabulable:
            # Discrete Gaussians too wide to tabulate (σ > ~300,000): their sum is
            # N(0, kσ²) to double precision at every integer (Poisson summation),
            # and summing the density over [-c, c] is its integral over
            # [-c - 1/2, c + 1/2] (midpoint rule: 1.4e-9 off at σ = 2000, and the
            # error shrinks as 1/σ²).
            return math.erf((c + 0.5) / math.sqrt(2 * self._sigma_squared_total))
        mass = self._central_masses
        return float(mass[min(c, mass.size - 1)])

    @property
    def _tabulable(self) -> bool:
        part = self.parts[0] if self.parts else None
        return not isinstance(part, DiscreteGaussian) or part.tabulable

    @property
    def _sigma_squared_total(self) -> float:
        part = self.parts[0]
        assert isinstance(part, DiscreteGaussian)
        return float(part.sigma_squared) * len(self.parts)

    def _normal_pmf(self, z: int) -> float:
        s2 = self._sigma_squared_total
        return math.exp(-(z * z) / (2 * s2)) / math.sqrt(2 * math.pi * s2)

    @functools.cached_property
    def _central_masses(self) -> npt.NDArray[np.float64]:
        # mass[c] = P(|Z| <= c), accumulated from the centre outwards (symmetric Z).
        centre, table = self.table()
        outward = table[centre:].copy()
        outward[1:] += table[:centre][::-1]
        return np.minimum(np.cumsum(outward), 1.0)

    def variance(self) -> float:
        """The sum of the summands' variances."""
        return sum((part.variance() for part in self.parts), 0.0)

    def table(self) -> tuple[int, npt.NDArray[np.float64]]:
        """(M, p): p[i] = P(Z = i - M), tail mass beyond M below 1e-14."""
        table = self._table
        return (table.size - 1) // 2, table.copy()

    @functools.cached_property
    def _table(self) -> npt.NDArray[np.float64]:
        if not self.parts:
            return np.ones(1)
        if not self._tabulable:
            raise InvalidParameter(
                "the total noise is too wide for a pmf table (discrete Gaussian with"
                f" sigma^2 = {self._sigma_squared_total:.3g})"
            )
        single = self.parts[0].pmf_table()
        table = single
        for _ in self.parts[1:]:
            table = convolve(table, single)
        return table


# --------------------------------------------------------------------------- noise plan


@dataclass(frozen=True)
class NoisePlan:
    """What noise a task's aggregators add, and what privacy that buys.

    Build it with `NoisePlan.for_task`; every field is public (the collector uses the
    same plan to compute confidence intervals from public parameters only).
    """

    config: DPConfig
    sensitivity: Sensitivity
    # How many aggregators draw `server_noise`: both, unless the other one is an
    # implementation that adds none (a DAP peer; only independent mode then).
    noising: int = AGGREGATORS

    def __post_init__(self) -> None:
        noising = self.noising
        whole = isinstance(noising, int) and not isinstance(noising, bool)
        if not whole or not 1 <= noising <= AGGREGATORS:
            raise InvalidParameter(f"noising must be an int in [1, {AGGREGATORS}], got {noising!r}")
        if noising != AGGREGATORS and self.config.mode is NoiseMode.SPLIT:
            raise InvalidParameter(
                "split mode divides the noise between both aggregators; with only one"
                " adding noise use independent mode"
            )
        # The split mode's Pólya sampler tabulates its CDF once per scale, in time
        # linear in the scale (about 7 s at 1e5, minutes past 1e6), and walks the
        # CDF past the table: a larger scale would stall the noise pool.
        scale = self.scale
        if self.config.mode is NoiseMode.SPLIT and scale is not None and scale > MAX_SPLIT_SCALE:
            raise InvalidParameter(
                f"split mode draws Pólya noise of scale at most {MAX_SPLIT_SCALE}; this task's"
                f" is {float(scale):.4g} (sensitivity / epsilon): use independent mode, a"
                " larger epsilon or a smaller max_measurement"
            )

    @classmethod
    def for_task(
        cls,
        config: DPConfig,
        vdaf: str,
        params: Mapping[str, int],
        declared_l1: int | None = None,
        neighbouring: str = "replace_one",
    ) -> NoisePlan:
        """The plan for a task; a declared Δ₁ must be at least what the type allows.

        A declared sensitivity below the type's would under-noise (and so break the
        ε promise); above it is allowed (more noise, same coordinates shape), e.g. to
        share one scale across several tasks.
        """
        derived = sensitivity(vdaf, params, neighbouring)
        if declared_l1 is None:
            return cls(config, derived)._checked()
        if isinstance(declared_l1, bool) or not isinstance(declared_l1, int) or declared_l1 < 1:
            raise InvalidSensitivity(
                f"a declared sensitivity must be an int >= 1, got {declared_l1!r}"
            )
        if declared_l1 < derived.l1:
            raise InvalidSensitivity(
                f"declared sensitivity {declared_l1} does not fit {vdaf} with {dict(params)}: "
                f"one report can move the aggregate by {derived.l1} in L1"
            )
        if derived.total is not None:
            # An L1 ball of the declared radius holds the type's.
            return cls(
                config, Sensitivity(derived.coordinates, declared_l1, declared_l1)
            )._checked()
        if declared_l1 % derived.coordinates:
            raise InvalidSensitivity(
                f"declared sensitivity {declared_l1} does not fit {vdaf}: it must be a "
                f"multiple of the {derived.coordinates} coordinates one report can change"
            )
        return cls(
            config, Sensitivity(derived.coordinates, declared_l1 // derived.coordinates)
        )._checked()

    def _checked(self) -> NoisePlan:
        """Refuse a split plan whose guarantee against one aggregator means nothing."""
        server = self.server_epsilon
        if self.config.mode is NoiseMode.SPLIT and server is not None and server > MAX_EPSILON:
            raise InvalidParameter(
                f"split mode at ε = {self.config.epsilon} gives only ε = {float(server):.4g} "
                f"against the collector with one aggregator (above {MAX_EPSILON}); use "
                "independent mode"
            )
        return self

    @property
    def scale(self) -> Fraction | None:
        """The discrete Laplace scale Δ₁/ε of the total noise (None unless Laplace)."""
        if self.config.epsilon is None or self.config.mechanism is Mechanism.GAUSSIAN:
            return None
        return self.sensitivity.l1 / self.config.epsilon

    @property
    def sigma_squared(self) -> Fraction | None:
        """σ² = Δ₂²/(2ρ) of each aggregator's discrete Gaussian (None unless Gaussian)."""
        if self.config.rho is None:
            return None
        return self.sensitivity.l2_squared / (2 * self.config.rho)

    def server_noise(self) -> DiscreteLaplace | DiscreteGaussian | PolyaDifference | None:
        """The distribution each aggregator draws, per coordinate (None: no noise)."""
        mech = self.config.mechanism
        if mech is Mechanism.NONE:
            return None
        if mech is Mechanism.GAUSSIAN:
            assert self.sigma_squared is not None
            return DiscreteGaussian.from_sigma_squared(self.sigma_squared)
        assert self.scale is not None
        if self.config.mode is NoiseMode.SPLIT:
            return PolyaDifference(self.scale, AGGREGATORS)
        return DiscreteLaplace(self.scale)

    def total_noise(self) -> TotalNoise:
        """The noise in the collector's combined result (public: no data enters it).

        Independent mode: the sum of the noises of the `noising` aggregators; split
        mode: exactly one discrete Laplace of scale Δ₁/ε.
        """
        noise = self.server_noise()
        if noise is None:
            return TotalNoise(())
        if isinstance(noise, PolyaDifference):
            return TotalNoise((DiscreteLaplace(noise.scale),))
        return TotalNoise((noise,) * self.noising)

    def total_noise_pmf(self) -> tuple[int, npt.NDArray[np.float64]]:
        """(M, p): p[i] = P(total noise = i - M), tail mass beyond M below 1e-14."""
        return self.total_noise().table()

    @property
    def epsilon(self) -> Fraction | None:
        """ε against the collector and everyone downstream (None for Gaussian/none)."""
        return self.config.epsilon

    @property
    def server_epsilon(self) -> Fraction | None:
        """ε against one aggregator that knows its own noise (None for Gaussian/none).

        Independent mode: ε itself, since the other aggregator's noise alone is a full
        discrete Laplace. Split mode: the other aggregator's share X is a Pólya
        difference, and the privacy loss of a shift by m is
        L(m) = max_d |ln P(X=d) - ln P(X=d+m)| = ln P(X=0) - ln P(X=m) (see
        `_shift_loss`). The noise is independent per coordinate, so losses add; at most
        `coordinates` coordinates move, each by at most `per_coordinate`, and L is
        increasing, so the worst case is coordinates · L(per_coordinate). Under a
        `total` (an L1 ball), L being concave (ln P is convex, see `_shift_loss`), the
        worst case spreads the total evenly (`Sensitivity.shifts`). L is evaluated in
        double precision and rounded up to a multiple of 10**-6.
        """
        if self.config.epsilon is None:
            return None
        if self.config.mode is NoiseMode.INDEPENDENT:
            return self.config.epsilon
        assert self.scale is not None
        noise = PolyaDifference(self.scale, AGGREGATORS)
        total = sum(n * _shift_loss(noise, m) for m, n in self.sensitivity.shifts().items())
        return Fraction(math.ceil(total * 1e6 * (1 + 1e-9)), 10**6)

    @property
    def charge(self) -> Fraction | None:
        """What one collection costs on the ledgers: the weaker guarantee, in its unit.

        Pure mechanisms: `server_epsilon` (ε against the collector with one aggregator),
        which is ε in independent mode and more than ε in split mode; gaussian: ρ;
        none: None (nothing is charged, nothing is promised).
        """
        if self.config.mechanism is Mechanism.GAUSSIAN:
            return self.config.rho
        return self.server_epsilon

    @property
    def server_rho(self) -> Fraction | None:
        """ρ against one aggregator (Gaussian mechanism, independent mode): ρ itself."""
        return self.config.rho


def _shift_loss(noise: PolyaDifference, shift: int) -> float:
    """max_d |ln P(d) - ln P(d+m)| for the Pólya difference `noise` and m = shift.

    The NB(r, q) pmf c_k q**k (r <= 1) is log-convex, and so is the mixture
    P(d) = Σ_j p(j) p(j+d) on d >= 0 (sums of log-convex sequences are log-convex).
    With P symmetric and decreasing in |d|, every window [d, d+m] therefore loses at
    most ln P(0) - ln P(m): that is the supremum, attained at d = 0.

    Also, c_k is decreasing, so P(0)/P(m) <= q**-m / c_m; that rigorous bound is
    used where P(m) underflows, and caps the floating-point value.
    """
    r = 1 / noise.shares
    bound = shift / float(noise.scale) + (
        math.lgamma(r) + math.lgamma(shift + 1) - math.lgamma(shift + r)
    )
    at_shift = noise.pmf(shift)
    if at_shift <= 0.0:
        return bound
    return min(bound, math.log(noise.pmf(0)) - math.log(at_shift))


# --------------------------------------------------------------------------- field noise


def draw_noise(plan: NoisePlan, length: int, rng: RandomSource | None = None) -> list[int]:
    """This aggregator's noise for an aggregate share of `length` coordinates.

    Depends only on the plan and the (public) length, never on the data, so it can
    be drawn ahead of the collection request: then the request's timing says nothing
    about the noise. Independent draws per coordinate.
    """
    noise = plan.server_noise()
    if noise is None:
        log.warning(
            "DP mechanism 'none': this aggregate share leaves the aggregator without "
            "differential-privacy noise"
        )
        return [0] * length
    return noise.sample_vec(length, rng)


def apply_noise(share: Sequence[int], noise: Sequence[int], modulus: int) -> list[int]:
    """share + noise mod p, coordinate by coordinate (negative noise wraps around)."""
    _check_modulus(modulus)
    if len(share) != len(noise):
        raise InvalidParameter(
            f"aggregate share has {len(share)} coordinates but the noise has {len(noise)}"
        )
    out = [(x + z) % modulus for x, z in zip(share, noise, strict=True)]
    return out


def add_noise(
    share: Sequence[int], modulus: int, plan: NoisePlan, rng: RandomSource | None = None
) -> list[int]:
    """A new list: the aggregate share with this aggregator's noise added mod p."""
    for x in share:
        if not 0 <= x < modulus:
            raise InvalidParameter(f"aggregate share coordinate {x} is not in [0, {modulus})")
    return apply_noise(share, draw_noise(plan, len(share), rng), modulus)


def centred_lift(value: int, modulus: int) -> int:
    """The integer in (-p/2, p/2) congruent to value: v >= p/2 means v - p."""
    _check_modulus(modulus)
    if not 0 <= value < modulus:
        raise InvalidParameter(f"field element {value} is not in [0, {modulus})")
    return value - modulus if 2 * value >= modulus else value


def decode(aggregate: Sequence[int], modulus: int) -> list[int]:
    """The centred lift of every coordinate of an unsharded (noised) aggregate."""
    return [centred_lift(v, modulus) for v in aggregate]


def _check_modulus(modulus: int) -> None:
    if isinstance(modulus, bool) or not isinstance(modulus, int) or modulus < 3:
        raise InvalidParameter(f"the field modulus must be an int >= 3, got {modulus!r}")
