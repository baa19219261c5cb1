"""The numbers a text question states, for the issue's case and at several sizes.

The case (issue 27's must-show): n respondents, 500 of whom each give an answer nobody
else gives, the rest drawn from a Zipf distribution (exponent 1) over 50 answers;
max_bytes 16. Everything here is computed from veil.dp.heavy_hitters (exact tails of
the level noise); nothing is sampled. `scripts/hh_plan.py` prints it (docs/ACCURACY.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from veil.dp.accounting import Neighbouring
from veil.dp.heavy_hitters import (
    HeavyHittersPlan,
    Threshold,
    detection_floor,
    recovery_probability,
    release_threshold,
)
from veil.dp.mechanisms import DPConfig, NoiseMode

# The example survey's total ε and its questions' weights (src/veil/data/example_survey.toml:
# five questions, weights 1, 2, 1, 1, 1); a text question of weight 1 added to it gets
# 2 · 1/7 of the budget.
EXAMPLE_TOTAL = Fraction(2)
EXAMPLE_WEIGHTS = (1, 2, 1, 1, 1)


def default_text_epsilon() -> Fraction:
    """A weight-1 text question's ε in the example survey with that question added."""
    return EXAMPLE_TOTAL / (sum(EXAMPLE_WEIGHTS) + 1)


def zipf_counts(respondents: int, answers: int = 50, once: int = 500) -> list[int]:
    """Expected counts of the Zipf(1) answers, largest first: (n - once) · (1/k) / H."""
    harmonic = sum(Fraction(1, k) for k in range(1, answers + 1))
    rest = respondents - once
    return [round(rest * Fraction(1, k) / harmonic) for k in range(1, answers + 1)]


@dataclass(frozen=True)
class CaseRow:
    config: DPConfig
    neighbouring: Neighbouring
    noise: str  # per aggregator and level: "DLap(scale)" or "N_Z(σ²)"
    threshold: Threshold
    floor_count: int
    floor_share: Fraction
    recovered: int  # Zipf answers at or above the floor
    worst_two_percent: float  # least recovery probability among answers >= 2% of n


def case_row(
    config: DPConfig,
    neighbouring: Neighbouring,
    respondents: int,
    max_bytes: int = 16,
    candidates: int | None = None,
) -> CaseRow:
    plan = HeavyHittersPlan(config, max_bytes, neighbouring)
    threshold = release_threshold(plan, candidates=candidates)
    floor = detection_floor(plan, threshold.value, respondents)
    counts = zipf_counts(respondents)
    two_percent = [c for c in counts if 50 * c >= respondents]
    worst = min(recovery_probability(plan, c, threshold.value) for c in two_percent)
    level = plan.level_plan
    if level.scale is not None:
        noise = f"DLap({float(level.scale):g})"
    else:
        assert level.sigma_squared is not None
        noise = f"N_Z(σ² = {float(level.sigma_squared):.4g})"
    return CaseRow(
        config,
        neighbouring,
        noise,
        threshold,
        floor.count,
        floor.share,
        sum(c >= floor.count for c in counts),
        worst,
    )


def _budget(config: DPConfig) -> str:
    if config.rho is not None:
        return f"ρ = {float(config.rho):.4g}"
    assert config.epsilon is not None
    return f"ε = {float(config.epsilon):.4g}"


def least_epsilon_for_share(
    share: Fraction,
    neighbouring: Neighbouring,
    mode: NoiseMode,
    respondents: int,
    max_bytes: int = 16,
    step: Fraction = Fraction(1, 20),
) -> Fraction:
    """The least ε (a multiple of `step`) whose detection floor is at most `share`."""
    epsilon = step
    while True:
        plan = HeavyHittersPlan(DPConfig.geometric(epsilon, mode), max_bytes, neighbouring)
        threshold = release_threshold(plan)
        if detection_floor(plan, threshold.value, respondents).share <= share:
            return epsilon
        epsilon += step


def floor_table(
    epsilons: Sequence[Fraction], sizes: Sequence[int], max_bytes: int = 16
) -> list[tuple[Fraction, Neighbouring, NoiseMode, int, list[Fraction]]]:
    """(ε, relation, mode, floor count, [floor share at each size]) at the default
    release target (the floor's count does not depend on n, its share does)."""
    out = []
    for epsilon in epsilons:
        for relation in Neighbouring:
            for mode in NoiseMode:
                plan = HeavyHittersPlan(DPConfig.geometric(epsilon, mode), max_bytes, relation)
                t = release_threshold(plan).value
                count = detection_floor(plan, t, sizes[0]).count
                out.append((epsilon, relation, mode, count, [Fraction(count, n) for n in sizes]))
    return out


def format_case(rows: Sequence[CaseRow], respondents: int) -> str:
    header = (
        "| budget (question) | neighbouring | mode | noise per aggregator | T | P(release once) "
        "| P(keep empty) | floor (count) | floor (share) | Zipf answers above | "
        "least P(found), answers >= 2% |"
    )
    lines = [header, "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {_budget(r.config)} | {r.neighbouring} | {r.config.mode} | {r.noise} "
            f"| {r.threshold.value} | {r.threshold.release_probability:.3g} "
            f"| {r.threshold.spurious_probability:.3g} | {r.floor_count} "
            f"| {_share(r.floor_share)} | {r.recovered} of 50 | {r.worst_two_percent:.4f} |"
        )
    lines.append("")
    lines.append(f"n = {respondents}; Zipf counts: {zipf_counts(respondents)[:12]} ...")
    return "\n".join(lines)


def _share(share: Fraction) -> str:
    return "none (floor > n)" if share > 1 else f"{float(share):.2%}"


def format_floor_table(
    rows: Sequence[tuple[Fraction, Neighbouring, NoiseMode, int, list[Fraction]]],
    sizes: Sequence[int],
) -> str:
    head = " | ".join(f"share at n = {n:,}" for n in sizes)
    lines = [f"| ε (question) | neighbouring | mode | floor (count) | {head} |"]
    lines.append("|---|---|---|---|" + "---|" * len(sizes))
    for epsilon, relation, mode, count, shares in rows:
        cells = " | ".join(_share(s) for s in shares)
        lines.append(f"| {float(epsilon):.4g} | {relation} | {mode} | {count} | {cells} |")
    return "\n".join(lines)
