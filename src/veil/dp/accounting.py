"""What a privacy budget means: ε, ρ and the (ε, δ) a ρ implies, and privacy statements.

- Pure ε-DP (the geometric and laplace mechanisms) composes by adding ε's.
- ρ-zCDP (the gaussian mechanism) composes by adding ρ's, and implies (ε, δ)-DP for
  every δ > 0. veil converts with the tight bound of Canonne, Kamath, Steinke 2020
  ("The Discrete Gaussian for Differential Privacy", Corollary 13):

      δ = inf_{α > 1}  exp((α - 1)(αρ - ε)) / (α - 1) · (1 - 1/α)**α

  rather than the looser ε = ρ + 2√(ρ ln(1/δ)) of Bun and Steinke 2016.
- ε-DP implies ε²/2-zCDP (Bun and Steinke 2016, Proposition 1.4), which is how a
  survey that mixes both kinds of question is composed: under zCDP.

The conversions use floating point (they are public arithmetic on public parameters,
not noise), and every rounding is made in the direction that keeps the claim true:
a ρ solved from (ε, δ) is rounded down, an ε implied by ρ is rounded up.

A `PrivacyStatement` says, for one task or a survey, what is protected (the privacy
unit and the neighbouring relation) and the guarantee against each kind of observer:
the collector (and everyone downstream), the collector together with one aggregator,
and, once local randomized response exists, everyone including both aggregators.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from veil.dp.errors import InvalidParameter

__all__ = [
    "DEFAULT_DELTA",
    "Guarantee",
    "Neighbouring",
    "PrivacyStatement",
    "decimal_text",
    "pure_to_rho",
    "zcdp_delta",
    "zcdp_epsilon",
    "zcdp_rho",
]

# The δ at which a ρ is shown as (ε, δ) when the task or survey names none. It must be
# far below 1/n for any realistic number of respondents n.
DEFAULT_DELTA = Fraction(1, 10**6)
# Significant digits kept when a conversion is rounded (down for ρ, up for ε).
_DIGITS = 6


class Neighbouring(enum.StrEnum):
    """Which datasets DP makes indistinguishable: what "one person's data" means."""

    # One report replaced by any other valid report; the number of reports is
    # published exactly (DAP's model). Participation itself is not protected.
    REPLACE_ONE = "replace_one"
    # One report added or removed; the count is noised like everything else and the
    # exact count is never sent to the collector, so taking part is protected too.
    ADD_REMOVE = "add_remove"

    @property
    def words(self) -> str:
        """The relation in plain words."""
        if self is Neighbouring.REPLACE_ONE:
            return (
                "replacing it by any other valid data (the number of reports is "
                "published exactly, so taking part is not hidden)"
            )
        return "adding or removing it (the number of reports is noised too)"


def _check_delta(delta: Fraction) -> None:
    if not 0 < delta < 1:
        raise InvalidParameter(f"delta must be in (0, 1), got {delta}")


def _log_delta(rho: float, epsilon: float) -> float:
    """ln δ(ρ, ε) of Corollary 13, minimised over α > 1.

    f(α) = (α-1)(αρ-ε) - ln(α-1) + α ln(1-1/α) is convex on α > 1 (its second
    derivative is 2ρ + 1/(α(α-1)) > 0), hence unimodal in t = ln(α-1): a ternary
    search finds the minimum. Any α gives a valid δ, so an imprecise minimum only
    makes δ larger (safe).
    """

    def f(t: float) -> float:
        a = 1.0 + math.exp(t)
        return (a - 1) * (a * rho - epsilon) - t + a * math.log1p(-1 / a)

    lo, hi = -30.0, 30.0
    for _ in range(200):
        m1 = lo + (hi - lo) / 3
        m2 = hi - (hi - lo) / 3
        if f(m1) < f(m2):
            hi = m2
        else:
            lo = m1
    return min(f((lo + hi) / 2), 0.0)


def zcdp_delta(rho: Fraction, epsilon: Fraction) -> float:
    """The smallest δ such that ρ-zCDP implies (ε, δ)-DP (CKS20, Corollary 13)."""
    if rho <= 0 or epsilon < 0:
        raise InvalidParameter(f"need rho > 0 and epsilon >= 0, got {rho}, {epsilon}")
    return math.exp(_log_delta(float(rho), float(epsilon)))


def _round(value: float, up: bool) -> Fraction:
    """value rounded to _DIGITS significant digits, up or down."""
    if value <= 0:
        return Fraction(0)
    exponent = math.floor(math.log10(value)) - _DIGITS + 1
    step = Fraction(10) ** exponent
    scaled = Fraction(value) / step
    whole = math.ceil(scaled) if up else math.floor(scaled)
    return whole * step


def zcdp_epsilon(rho: Fraction, delta: Fraction = DEFAULT_DELTA) -> Fraction:
    """The smallest ε with ρ-zCDP ⇒ (ε, δ)-DP, rounded up to 6 significant digits."""
    _check_delta(delta)
    if rho <= 0:
        raise InvalidParameter(f"rho must be > 0, got {rho}")
    r, target = float(rho), math.log(delta)
    # ε = ρ + 2√(ρ ln(1/δ)) always suffices (Bun and Steinke 2016): an upper bracket.
    lo, hi = 0.0, r + 2 * math.sqrt(r * -target) + 1e-9
    for _ in range(200):
        mid = (lo + hi) / 2
        if _log_delta(r, mid) <= target:
            hi = mid
        else:
            lo = mid
    # A relative margin well above the float error of f keeps the rounding safe.
    return _round(hi * (1 + 1e-9) + 1e-12, up=True)


def zcdp_rho(epsilon: Fraction, delta: Fraction) -> Fraction:
    """The largest ρ with ρ-zCDP ⇒ (ε, δ)-DP, rounded down to 6 significant digits."""
    _check_delta(delta)
    if epsilon <= 0:
        raise InvalidParameter(f"epsilon must be > 0, got {epsilon}")
    e, target = float(epsilon), math.log(delta)
    # δ(ρ, ε) increases with ρ: double an upper bracket until it fails, then bisect.
    lo, hi = 0.0, e
    while _log_delta(hi, e) <= target - 1e-9:
        lo, hi = hi, 2 * hi
        if hi > 1e6:
            raise InvalidParameter(f"(ε = {epsilon}, δ = {delta}) allows any ρ: choose a smaller δ")
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid > 0 and _log_delta(mid, e) <= target - 1e-9:
            lo = mid
        else:
            hi = mid
    if lo <= 0:
        raise InvalidParameter(f"no ρ > 0 gives (ε = {epsilon}, δ = {delta})-DP")
    return _round(lo * (1 - 1e-9), up=False)


def pure_to_rho(epsilon: Fraction) -> Fraction:
    """ε-DP implies ε²/2-zCDP (Bun and Steinke 2016, Proposition 1.4)."""
    return epsilon * epsilon / 2


def decimal_text(value: Fraction) -> str:
    """A Fraction as a short decimal string (exact when it terminates, else 6 digits up)."""
    if value == 0:
        return "0"
    d = value.denominator
    while d % 2 == 0:
        d //= 2
    while d % 5 == 0:
        d //= 5
    if d == 1:
        text = format(Decimal(value.numerator) / Decimal(value.denominator), "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    return decimal_text(_round(float(value), up=True))


@dataclass(frozen=True)
class Guarantee:
    """One DP guarantee: pure ε-DP, ρ-zCDP (shown with the (ε, δ) it implies), or none.

    For zCDP, `epsilon` is the ε implied at `delta`; for pure DP `delta` is 0; with no
    DP at all (mechanism none) every field is None.
    """

    epsilon: Fraction | None
    delta: Fraction | None = None
    rho: Fraction | None = None

    @classmethod
    def pure(cls, epsilon: Fraction) -> Guarantee:
        return cls(epsilon, Fraction(0))

    @classmethod
    def zcdp(cls, rho: Fraction, delta: Fraction = DEFAULT_DELTA) -> Guarantee:
        return cls(zcdp_epsilon(rho, delta), delta, rho)

    @classmethod
    def no_privacy(cls) -> Guarantee:
        return cls(None)

    @property
    def is_zcdp(self) -> bool:
        return self.rho is not None

    @property
    def is_none(self) -> bool:
        return self.epsilon is None

    def to_json(self) -> dict[str, str] | None:
        """{"epsilon", "delta"} (pure), {"rho", "epsilon", "delta"} (zCDP), or None.

        Numbers are decimal strings: exact for pure ε, ρ and δ; an implied ε is
        rounded up.
        """
        if self.epsilon is None:
            return None
        out: dict[str, str] = {}
        if self.rho is not None:
            out["rho"] = decimal_text(self.rho)
        out["epsilon"] = decimal_text(self.epsilon)
        out["delta"] = decimal_text(self.delta or Fraction(0))
        return out

    def text(self) -> str:
        """E.g. "ε = 1 (pure ε-DP)" or "ρ = 0.5 zCDP, which implies (ε = 5.2216, δ = 1e-06)-DP"."""
        if self.epsilon is None:
            return "no differential privacy (exact values are released)"
        if self.rho is None:
            return f"ε = {decimal_text(self.epsilon)} (pure ε-DP)"
        assert self.delta is not None
        return (
            f"ρ = {decimal_text(self.rho)} zCDP, which implies "
            f"(ε = {float(self.epsilon):.5g}, δ = {float(self.delta):.3g})-DP"
        )


@dataclass(frozen=True)
class PrivacyStatement:
    """What privacy a task or survey gives, and to whom.

    `unit` is what one protected "individual" is (one report); `neighbouring` says
    what may change about it. The guarantees cover the whole budget (every collection
    the ledgers allow), not one collection. `against_everyone` is None unless reports
    are randomized on the respondent's device (local randomized response), which would
    protect them even from both aggregators colluding with the collector.
    """

    unit: str
    neighbouring: Neighbouring
    against_collector: Guarantee
    against_collector_and_one_aggregator: Guarantee
    against_everyone: Guarantee | None = None
    charged: str = "against_collector_and_one_aggregator"
    notes: tuple[str, ...] = ()
    # The aggregator roles that add noise: both, or one when the other runs an
    # implementation that adds none (a DAP peer); `against_collector` then holds
    # against the collector with the other one too, and
    # `against_collector_and_one_aggregator` (the worse of the two) is none.
    noise_added_by: tuple[str, ...] = ("leader", "helper")

    def to_json(self) -> dict[str, Any]:
        """The `privacy` object of `veil task new --json` (see docs/DEPLOYING.md)."""
        out: dict[str, Any] = {
            "unit": self.unit,
            "neighbouring": self.neighbouring.value,
            "against_collector": self.against_collector.to_json(),
            "against_collector_and_one_aggregator": (
                self.against_collector_and_one_aggregator.to_json()
            ),
        }
        if self.against_everyone is not None:
            out["against_everyone"] = self.against_everyone.to_json()
        out["ledgers_charge"] = self.charged
        if len(self.noise_added_by) == 1:
            (silent,) = {"leader", "helper"} - set(self.noise_added_by)
            out["noise_added_by"] = list(self.noise_added_by)
            out[f"against_collector_and_{silent}"] = self.against_collector.to_json()
            out[f"against_collector_and_{self.noise_added_by[0]}"] = (
                self.against_collector_and_one_aggregator.to_json()
            )
        out.update(self._scope())
        return out

    def _scope(self) -> dict[str, Any]:
        """What each guarantee covers, what is released exactly, and what an
        aggregator sees whatever the guarantees (docs/OBSERVATIONS.md)."""
        add_remove = self.neighbouring is Neighbouring.ADD_REMOVE
        noised = not self.against_collector.is_none
        covers: dict[str, list[str]] = {
            "against_collector": (["values", "participation"] if add_remove else ["values"])
            if noised
            else [],
            # An aggregator sees each report arrive: values only, in either relation.
            "against_collector_and_one_aggregator": (
                ["values"] if noised and len(self.noise_added_by) > 1 else []
            ),
        }
        if self.against_everyone is not None:
            covers["against_everyone"] = ["values"]
        return {
            "covers": covers,
            "released_exactly": (
                ["batch_floor_reached"] if add_remove else ["report_count", "batch_floor_reached"]
            ),
            "each_aggregator_sees": ["report_arrivals", "report_count"],
        }

    def lines(self) -> list[str]:
        """The statement in plain words, one sentence a line."""
        if self.against_collector.is_none:
            return [
                "No differential privacy: the collector receives exact aggregates. "
                "Individual values stay hidden only inside the aggregate, as long as one "
                "aggregator is honest."
            ]
        out = [
            f"Privacy unit: {self.unit}; what is protected is {self.neighbouring.words}.",
            f"Against the collector and anyone who sees the results: "
            f"{self.against_collector.text()}.",
        ]
        if len(self.noise_added_by) == 1:
            (noising,) = self.noise_added_by
            (silent,) = {"leader", "helper"} - {noising}
            out += [
                f"Against the collector together with the {silent} (which adds no noise): "
                f"{self.against_collector.text()}.",
                f"Against the collector together with the {noising} (which adds all of it): "
                f"{self.against_collector_and_one_aggregator.text()}.",
            ]
        else:
            out.append(
                f"Against the collector together with one of the two aggregators: "
                f"{self.against_collector_and_one_aggregator.text()}."
            )
        if self.against_everyone is not None:
            out.append(
                f"Against everyone, including both aggregators together: "
                f"{self.against_everyone.text()}."
            )
        else:
            out.append(
                "Against both aggregators colluding: none (they could together "
                "reconstruct every report)."
            )
        out.extend(self.notes)
        return out

    def text(self) -> str:
        return "\n".join(self.lines())
