"""DP for a text question: Poplar1 heavy hitters, one noised collection per byte.

A text question of `max_bytes` B is a Poplar1 task over 8·B-bit strings. The collector
queries the same batch once per byte, at levels 7, 15, ..., 8B - 1 (draft-irtf-cfrg-vdaf-20
§8: an aggregation parameter is a level and a list of distinct prefixes of that length),
each time with the survivors of the previous level extended by every byte value. Each
aggregator noises every prefix count it releases, exactly as for any other question
(`NoisePlan`: independent mode by default, split where the task opts in). A candidate
whose noisy count falls below the threshold T is dropped before the next level; that is
post-processing of released counts and costs nothing.

What this module states, from public parameters only:

- Sensitivity of one level's prefix-count vector. The prefixes of one level are distinct
  and of equal length, so a string extends at most one of them. Adding or removing a
  report changes one count by 1 (Δ₁ = Δ₂² = 1); replacing it moves 1 from one count to
  another (Δ₁ = 2, Δ₂² = 2). This holds for *any* list of prefixes, whoever chose it.
- Budget. The question's ε (or ρ) is split evenly over its B levels and composed
  sequentially (`HeavyHittersPlan`): B collections of ε/B each are ε-DP in total, with
  the choice of each level's prefixes (from earlier noisy counts) being adaptive
  composition. Every level is charged to both ledgers like any collection.
- Threshold. An answer given by exactly one respondent has count 1 at the last level,
  so it is released with probability at most P(1 + Z ≥ T), Z the total noise of one
  level's count (`release_threshold`, `release_probability`); earlier levels can only
  drop it. T is the least integer that brings this under a target (10⁻³ by default),
  or the operator's `threshold` / `min_share` with the probability it implies.
- Detection. An answer of count c has prefix counts at least c at every level, with
  independent noise per level, so it is recovered with probability at least
  P(c + Z ≥ T)^B, exactly that when no other answer shares its prefixes
  (`recovery_probability`); the detection floor is the least c for which that reaches
  95% (`detection_floor`).
- Estimates. A recovered answer's count is its last level's noisy count, with the
  interval of `veil.dp.estimates` (`count_estimates`, `share_estimates`).

Tail probabilities are computed from the exact distribution of Z: closed forms for one
or two discrete Laplace summands, the exact pmf table for discrete Gaussians (summed in
double precision; no normal or Chernoff approximation). No noise is drawn here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from veil.dp.accounting import Guarantee, Neighbouring, PrivacyStatement, decimal_text
from veil.dp.distributions import DiscreteLaplace
from veil.dp.errors import InvalidParameter
from veil.dp.estimates import MIN_ALPHA, Estimate, estimate, mean, ratio
from veil.dp.mechanisms import (
    DPConfig,
    Mechanism,
    NoisePlan,
    Sensitivity,
    TotalNoise,
)

__all__ = [
    "BITS_PER_LEVEL",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_RELEASE_TARGET",
    "DEFAULT_SPURIOUS_TARGET",
    "DETECTION_PROBABILITY",
    "MAX_TEXT_BYTES",
    "Detection",
    "HeavyHittersPlan",
    "Threshold",
    "count_estimates",
    "detection_floor",
    "level_sensitivity",
    "recovery_probability",
    "release_probability",
    "release_threshold",
    "resolve_threshold",
    "share_estimates",
    "text_levels",
    "upper_tail",
]

# One query per byte: each level extends the survivors by one of 256 byte values.
BITS_PER_LEVEL = 8
DEFAULT_MAX_BYTES = 16
# Every byte is one collection of the batch and takes 1/B of the question's budget: past
# 64 bytes each level's share is so thin that nothing short of a majority is found.
MAX_TEXT_BYTES = 64
# The default probability that an answer given by one respondent is released.
DEFAULT_RELEASE_TARGET = 1e-3
# With candidates given: the expected number of empty prefixes kept at one level.
DEFAULT_SPURIOUS_TARGET = 0.05
# "Found with 95% probability": the confidence of the detection floor.
DETECTION_PROBABILITY = 0.95


def text_levels(max_bytes: int) -> tuple[int, ...]:
    """The Poplar1 levels a text question of `max_bytes` queries: 7, 15, ..., 8B - 1."""
    _check_bytes(max_bytes)
    return tuple(BITS_PER_LEVEL * (k + 1) - 1 for k in range(max_bytes))


def level_sensitivity(neighbouring: Neighbouring | str) -> Sensitivity:
    """How far one report moves one level's vector of prefix counts.

    A report's string extends at most one of a level's distinct, equal-length prefixes.
    add_remove: that one count moves by 1. replace_one: the old string's prefix loses 1
    and the new one's gains 1 (two coordinates by 1; none if they share that prefix).
    """
    relation = _neighbouring(neighbouring)
    if relation is Neighbouring.ADD_REMOVE:
        return Sensitivity(1, 1)
    return Sensitivity(2, 1)


@dataclass(frozen=True)
class HeavyHittersPlan:
    """A text question's budget over its levels, and the noise of each level.

    `config` holds the *question's* whole budget (ε, or ρ for gaussian) with its
    mechanism and noise mode; each of the `max_bytes` levels spends an even share of it
    (`level_config`). `max_prefixes` is the most prefixes one query may ask for (stated,
    not enforced here: both aggregators enforce it). Every field is public.
    """

    config: DPConfig
    max_bytes: int = DEFAULT_MAX_BYTES
    neighbouring: Neighbouring = Neighbouring.REPLACE_ONE
    max_prefixes: int | None = None

    def __post_init__(self) -> None:
        _check_bytes(self.max_bytes)
        object.__setattr__(self, "neighbouring", _neighbouring(self.neighbouring))
        if self.config.mechanism is Mechanism.LAPLACE and self.config.fixed_point_bits:
            raise InvalidParameter(
                "a text question releases integer counts: use mechanism geometric (or laplace"
                " with fixed_point_bits = 0)"
            )
        if self.max_prefixes is not None and (
            isinstance(self.max_prefixes, bool)
            or not isinstance(self.max_prefixes, int)
            or self.max_prefixes < 1
        ):
            raise InvalidParameter(f"max_prefixes must be an int >= 1, got {self.max_prefixes!r}")
        self.level_plan  # noqa: B018 - fails here, not at the first collection

    @property
    def levels(self) -> tuple[int, ...]:
        """The levels queried, in order."""
        return text_levels(self.max_bytes)

    @property
    def level_config(self) -> DPConfig:
        """One level's DPConfig: ε/B (or ρ/B), the same mechanism and mode."""
        c, b = self.config, self.max_bytes
        try:
            if c.mechanism is Mechanism.GAUSSIAN:
                assert c.rho is not None
                return DPConfig(c.mechanism, rho=c.rho / b, mode=c.mode)
            if c.epsilon is not None:
                return DPConfig(c.mechanism, epsilon=c.epsilon / b, mode=c.mode)
        except InvalidParameter as e:
            unit = "ρ" if c.mechanism is Mechanism.GAUSSIAN else "ε"
            raise InvalidParameter(
                f"a text question of max_bytes {b} spends its {unit} over {b} levels: {e}"
            ) from None
        return c

    @property
    def level_plan(self) -> NoisePlan:
        """The noise each aggregator adds to every prefix count of one level."""
        # Poplar1 is no Prio3 type for NoisePlan.for_task: build the plan from the
        # level's sensitivity, with the same check on a split mode's weaker ε.
        return NoisePlan(self.level_config, level_sensitivity(self.neighbouring))._checked()

    @property
    def level_charge(self) -> Fraction | None:
        """What one level's collection costs on each ledger (`NoisePlan.charge`)."""
        return self.level_plan.charge

    @property
    def charge(self) -> Fraction | None:
        """What all B levels cost on each ledger: B · `level_charge` (None: no DP)."""
        one = self.level_charge
        return None if one is None else one * self.max_bytes

    def guarantees(self) -> tuple[Guarantee, Guarantee]:
        """(against the collector, against the collector with one aggregator) over all
        B levels, by sequential composition (ε's add under pure DP, ρ's under zCDP)."""
        plan = self.level_plan
        b = self.max_bytes
        if self.config.mechanism is Mechanism.NONE:
            return Guarantee.no_privacy(), Guarantee.no_privacy()
        if self.config.mechanism is Mechanism.GAUSSIAN:
            assert plan.config.rho is not None
            both = Guarantee.zcdp(plan.config.rho * b)
            return both, both
        assert plan.epsilon is not None and plan.server_epsilon is not None
        return Guarantee.pure(plan.epsilon * b), Guarantee.pure(plan.server_epsilon * b)

    def note(self) -> str:
        """The composition in plain words, for a PrivacyStatement's notes."""
        cfg = self.level_config
        unit = "ρ" if cfg.rho is not None else "ε"
        each = cfg.rho if cfg.rho is not None else cfg.epsilon
        spent = "" if each is None else f", {unit} = {decimal_text(each)} each"
        prefixes = (
            "" if self.max_prefixes is None else f", at most {self.max_prefixes} prefixes each"
        )
        return (
            f"Text answers (up to {self.max_bytes} bytes) are found in {self.max_bytes} "
            f"collections of the same batch, one per byte{prefixes}{spent}; their losses "
            "add up (sequential composition) to the guarantee stated. Which prefixes a "
            "collection asks about does not matter: one report moves at most "
            f"{self.level_plan.sensitivity.coordinates} of a level's counts by 1."
        )

    def statement(self, unit: str) -> PrivacyStatement:
        """The question's PrivacyStatement over all its levels, `unit` its privacy unit."""
        collector, one_aggregator = self.guarantees()
        notes = () if collector.is_none else (self.note(),)
        return PrivacyStatement(unit, self.neighbouring, collector, one_aggregator, notes=notes)


# --------------------------------------------------------------------------- tails


def upper_tail(noise: TotalNoise, t: int) -> float:
    """P(Z >= t) for the total noise Z of one released count (symmetric about 0).

    One or two discrete Laplace summands in closed form, accurate in relative terms
    however far out; discrete Gaussians from their exact pmf table (absolute error
    about 1e-14), or the normal integral where σ is too large to tabulate.
    """
    if t <= 0:
        return 1.0 - upper_tail(noise, 1 - t)
    if not noise.parts:
        return 0.0
    part = noise.parts[0]
    if isinstance(part, DiscreteLaplace) and len(noise.parts) <= 2:
        x = float(1 / part.scale)
        q = math.exp(-x)
        one_minus_q = -math.expm1(-x)
        if len(noise.parts) == 1:
            # Σ_{z>=t} (1-q)/(1+q) q**z = q**t / (1+q).
            return math.exp(-x * t) / (1 + q)
        # P(Z = z) = c0² q**|z| (|z| + h), h = 1 + 2q²/(1-q²), c0 = (1-q)/(1+q); summed
        # over z >= t >= 1 this is c0² q**t ((h + t)/(1-q) + q/(1-q)²).
        c0 = math.tanh(x / 2)
        h = 1 + 2 * math.exp(-2 * x) / -math.expm1(-2 * x)
        return c0 * c0 * math.exp(-x * t) * ((h + t) / one_minus_q + q / one_minus_q**2)
    return max(0.0, (1.0 - noise.central_mass(t - 1)) / 2)


# --------------------------------------------------------------------------- threshold


@dataclass(frozen=True)
class Threshold:
    """A release threshold T and what it implies, per level, for one candidate.

    `release_probability`: an answer given by exactly one respondent is released at
    most this often (P(1 + Z >= T)). `spurious_probability`: a candidate nobody gave
    survives a level this often (P(Z >= T)); times the number of candidates queried, it
    is the expected number of empty prefixes kept. `source`: "target", "threshold" or
    "min_share", what fixed T.
    """

    value: int
    release_probability: float
    spurious_probability: float
    source: str


def release_probability(plan: HeavyHittersPlan, threshold: int) -> float:
    """P(1 + Z >= T): the most often an answer given once is released at threshold T."""
    _check_threshold(threshold)
    return upper_tail(plan.level_plan.total_noise(), threshold - 1)


def release_threshold(
    plan: HeavyHittersPlan,
    target: float = DEFAULT_RELEASE_TARGET,
    *,
    candidates: int | None = None,
    spurious_target: float = DEFAULT_SPURIOUS_TARGET,
) -> Threshold:
    """The least T with P(1 + Z >= T) <= target, and that probability.

    With `candidates` (the most prefixes one level queries, e.g. `max_prefixes`), T is
    also high enough that candidates · P(Z >= T), the expected number of prefixes nobody
    gave kept at a level, is at most `spurious_target`: otherwise a level with thousands
    of candidates keeps a few empty ones, and the last level releases them as answers.
    """
    _check_probability(target, "the release target")
    noise = plan.level_plan.total_noise()
    # The threshold keeps a count of 1 (and, with candidates, of 0) below its target.
    bounds = [(1, target)]
    if candidates is not None:
        if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1:
            raise InvalidParameter(f"candidates must be an int >= 1, got {candidates!r}")
        _check_probability(spurious_target, "the spurious target")
        bounds.append((0, spurious_target / candidates))
    value = max(_least_threshold(noise, count, bound) for count, bound in bounds)
    return _threshold(plan, value, "target")


def _least_threshold(noise: TotalNoise, count: int, bound: float) -> int:
    """The least T >= 1 with P(count + Z >= T) <= bound (it falls as T grows)."""
    if upper_tail(noise, 1 - count) <= bound:
        return 1
    lo, hi = 1, 2  # P(count + Z >= lo) > bound throughout
    while upper_tail(noise, hi - count) > bound:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if upper_tail(noise, mid - count) <= bound:
            hi = mid
        else:
            lo = mid
    return hi


def resolve_threshold(
    plan: HeavyHittersPlan,
    *,
    threshold: int | None = None,
    min_share: Fraction | None = None,
    respondents: int | None = None,
    target: float = DEFAULT_RELEASE_TARGET,
    candidates: int | None = None,
) -> Threshold:
    """The threshold a question uses: the operator's `threshold`, or `min_share` of the
    expected `respondents` (rounded up), or else the least meeting `target` (and the
    spurious bound for `candidates`, see `release_threshold`)."""
    if threshold is not None and min_share is not None:
        raise InvalidParameter("give a text question `threshold` or `min_share`, not both")
    if threshold is not None:
        _check_threshold(threshold)
        return _threshold(plan, threshold, "threshold")
    if min_share is not None:
        share = Fraction(min_share)
        if not 0 < share <= 1:
            raise InvalidParameter(f"min_share must be in (0, 1], got {min_share}")
        n = _check_respondents(respondents)
        value = max(1, math.ceil(share * n))
        return _threshold(plan, value, "min_share")
    return release_threshold(plan, target, candidates=candidates)


def _threshold(plan: HeavyHittersPlan, value: int, source: str) -> Threshold:
    noise = plan.level_plan.total_noise()
    return Threshold(value, upper_tail(noise, value - 1), upper_tail(noise, value), source)


# --------------------------------------------------------------------------- detection


def recovery_probability(plan: HeavyHittersPlan, count: int, threshold: int) -> float:
    """P(an answer given by `count` respondents survives all B levels) at threshold T.

    Its prefix at every level has count at least `count`, and the levels' noises are
    independent, so this is at least P(count + Z >= T)**B, with equality when no other
    answer shares its prefixes. (The union bound 1 - B·P(count + Z < T) is below it.)
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise InvalidParameter(f"count must be an int >= 0, got {count!r}")
    _check_threshold(threshold)
    survive = upper_tail(plan.level_plan.total_noise(), threshold - count)
    return survive**plan.max_bytes


@dataclass(frozen=True)
class Detection:
    """The detection floor: the least `count` found with `probability` >= `target`
    (`share` = count / respondents)."""

    count: int
    share: Fraction
    probability: float
    target: float
    respondents: int


def detection_floor(
    plan: HeavyHittersPlan,
    threshold: int,
    respondents: int,
    target: float = DETECTION_PROBABILITY,
) -> Detection:
    """The least count (and share of `respondents`) recovered with probability >= target."""
    n = _check_respondents(respondents)
    if not 0 < target < 1:
        raise InvalidParameter(f"the detection target must be in (0, 1), got {target}")
    _check_threshold(threshold)
    lo, hi = -1, max(threshold, 1)
    while recovery_probability(plan, hi, threshold) < target:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if recovery_probability(plan, mid, threshold) >= target:
            hi = mid
        else:
            lo = mid
    return Detection(hi, Fraction(hi, n), recovery_probability(plan, hi, threshold), target, n)


# --------------------------------------------------------------------------- estimates


def count_estimates(
    noised: Sequence[int],
    plan: HeavyHittersPlan,
    alpha: float = 0.05,
    *,
    simultaneous: bool = False,
) -> list[Estimate]:
    """Each recovered answer's count from its last level's noisy count, with the
    (1 - alpha) interval of that level's noise (`veil.dp.estimates.estimate`).

    The interval is the unconditional one: an answer near the threshold was kept
    because its noise was high, so its estimate leans upward (selection); well above
    the detection floor that effect vanishes.
    """
    return estimate(noised, plan.level_plan, alpha, simultaneous=simultaneous)


def share_estimates(counts: Sequence[Estimate], respondents: int | Estimate) -> list[Estimate]:
    """Each answer's share of the respondents: count / n with n exact (replace_one,
    where the report count is public), or count / n̂ with both intervals (`ratio`)
    when the count is itself an estimate (add_remove)."""
    if isinstance(respondents, Estimate):
        return [ratio(c, respondents, Fraction(0), Fraction(1)) for c in counts]
    n = _check_respondents(respondents)
    return [mean(c, n) for c in counts]


# --------------------------------------------------------------------------- checks


def _check_bytes(max_bytes: int) -> None:
    if (
        isinstance(max_bytes, bool)
        or not isinstance(max_bytes, int)
        or not 1 <= max_bytes <= MAX_TEXT_BYTES
    ):
        raise InvalidParameter(
            f"max_bytes must be an int in [1, {MAX_TEXT_BYTES}], got {max_bytes!r}"
        )


def _check_threshold(threshold: int) -> None:
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise InvalidParameter(f"the threshold must be an int >= 1, got {threshold!r}")


def _check_probability(value: float, what: str) -> None:
    if not MIN_ALPHA <= value < 0.5:
        raise InvalidParameter(f"{what} must be in [{MIN_ALPHA}, 0.5), got {value}")


def _check_respondents(respondents: int | None) -> int:
    if isinstance(respondents, bool) or not isinstance(respondents, int) or respondents < 1:
        raise InvalidParameter(f"respondents must be an int >= 1, got {respondents!r}")
    return respondents


def _neighbouring(value: Neighbouring | str) -> Neighbouring:
    try:
        return Neighbouring(value)
    except ValueError:
        raise InvalidParameter(
            f"neighbouring must be replace_one or add_remove, got {value!r}"
        ) from None
