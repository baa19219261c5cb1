"""Do the published intervals cover at small surveys? Measured with the exact noise.

For a question of each kind and a number of respondents n, many collections
of the same answers are simulated: each aggregator draws its noise exactly as
it does in service (veil.dp.draw_noise, per coordinate), the collector's
estimates and intervals come from the same functions as `veil survey collect`
(veil.dp.estimate, simultaneous over the question's rows, then
veil.survey.results.question_result), and we count how often every row's
shown interval (intersected with the possible range) holds the truth at once,
against the nominal level. The raw intervals are counted beside them.

The answers are put where the intersection matters most: at the edge of the
range (every respondent gives the lowest answer: no yes, 0 minutes, everyone
in one option, no tool) and spread over it. `scripts/coverage_small.py`
prints the table (docs/reports/ACCURACY.md).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from veil.collector.collector import CollectionResult
from veil.dp.accounting import Guarantee
from veil.dp.estimates import Estimate, estimate
from veil.dp.mechanisms import draw_noise
from veil.survey import Question, Survey, parse_survey
from veil.survey.results import question_result

__all__ = ["CASES", "CoveragePoint", "coverage", "coverage_survey", "format_coverage"]

CASES = ("edge", "spread")


def coverage_survey(epsilon_per_question: Fraction, neighbouring: str = "replace_one") -> Survey:
    """One question of each kind, each at `epsilon_per_question`."""
    return parse_survey(
        f"""
[survey]
name = "coverage"
epsilon = "{epsilon_per_question * 5}"
min_batch_size = 1
neighbouring = "{neighbouring}"

[[question]]
id = "yes_no"
kind = "yes_no"

[[question]]
id = "integer"
kind = "integer"
max = 120

[[question]]
id = "choice"
kind = "choice"
options = ["a", "b", "c"]

[[question]]
id = "multi_choice"
kind = "multi_choice"
options = ["a", "b", "c", "d"]
max_choices = 2

[[question]]
id = "vector"
kind = "vector"
length = 2
max = 10
""",
        "coverage.toml",
    )


def answers(q: Question, n: int, case: str) -> list[Any]:
    """n answers to `q`: all at the bottom of the range ("edge"), or spread over it."""
    if case == "edge":
        if q.kind == "yes_no":
            return [False] * n
        if q.kind == "integer":
            return [0] * n
        if q.kind == "choice":
            return [q.options[0]] * n
        if q.kind == "multi_choice":
            return [[]] * n
        return [[0] * q.length] * n
    if q.kind == "yes_no":
        return [i % 3 == 0 for i in range(n)]
    if q.kind == "integer":
        return [(37 * i) % (q.max + 1) for i in range(n)]
    if q.kind == "choice":
        return [q.options[i % len(q.options)] for i in range(n)]
    if q.kind == "multi_choice":
        return [list(q.options[i % len(q.options) :][: i % (q.max_choices + 1)]) for i in range(n)]
    return [[(3 * i + j) % (q.max + 1) for j in range(q.length)] for i in range(n)]


def _aggregate(q: Question, given: Sequence[Any]) -> list[int]:
    """The exact aggregate the aggregators would sum (coordinates of the VDAF)."""
    total: list[int] | None = None
    width = q.vdaf_params.get("length", 1)
    for a in given:
        m = q.to_measurement(a)
        if q.vdaf_type == "histogram":
            vec = [int(m == j) for j in range(width)]
        elif isinstance(m, list):
            vec = [int(x) for x in m]
        else:
            vec = [int(m)]
        total = vec if total is None else [t + v for t, v in zip(total, vec, strict=True)]
    assert total is not None
    return total


def _truth_rows(q: Question, given: Sequence[Any], aggregate: list[int]) -> list[Fraction]:
    """The true value of each published row, in the row's units."""
    n = len(given)
    if q.add_remove:
        if q.kind in ("yes_no", "choice"):
            parts = aggregate[1:] if q.kind == "yes_no" else aggregate
        else:
            parts = aggregate[:-1]
        return [Fraction(x, n) for x in parts]
    if q.kind == "integer":
        return [Fraction(aggregate[0], n), Fraction(aggregate[0])]
    if q.kind == "vector":
        return [Fraction(x, n) for x in aggregate]
    return [Fraction(x) for x in aggregate]


@dataclass(frozen=True)
class CoveragePoint:
    """How often a question's intervals held the truth over `runs` collections.

    `shown`: every row's published interval (intersected with the range) at
    once; `raw`: every raw interval at once (None under add_remove, whose rows
    are ratios); `width`: the shown intervals' mean width over the raw ones'.
    """

    kind: str
    neighbouring: str
    epsilon: Fraction
    n: int
    case: str
    runs: int
    nominal: float
    shown: float
    raw: float | None
    width: float | None


def coverage(
    survey: Survey,
    q: Question,
    n: int,
    case: str,
    runs: int,
    rng: random.Random,
    confidence: float = 0.95,
) -> CoveragePoint:
    """Simulate `runs` collections of `q` over n respondents' answers (`case`)."""
    from veil.survey.tasks import task_specs

    vdaf, dp, _ = task_specs(replace(survey, questions=(q,)))[q.id]
    plan = dp.plan(vdaf)
    given = answers(q, n, case)
    aggregate = _aggregate(q, given)
    truth = _truth_rows(q, given, aggregate)
    k = len(aggregate)
    # The interval is y plus the same offsets at every y (public parameters only).
    zero = estimate([0] * k, plan, alpha=1 - confidence, simultaneous=True)[0]
    held = raw_held = 0
    shown_width = raw_width = Fraction(0)
    for _ in range(runs):
        leader, helper = draw_noise(plan, k, rng), draw_noise(plan, k, rng)
        noisy = [a + x + y for a, x, y in zip(aggregate, leader, helper, strict=True)]
        coords = [
            Estimate(Fraction(v), v + zero.low, v + zero.high, confidence, zero.coverage)
            for v in noisy
        ]
        result = _collected(coords, 0 if q.add_remove else n, confidence, noisy)
        rows = question_result(q, result).rows
        if q.kind == "integer" and not q.add_remove:
            rows = rows[:1]  # the sum row is the mean row times n: the same event
            want = truth[:1]
        else:
            want = truth
        held += all(r.ci_low <= float(t) <= r.ci_high for r, t in zip(rows, want, strict=True))
        shown_width += sum(Fraction(r.ci_high - r.ci_low) for r in rows)
        if not q.add_remove:
            raw_held += all(
                (r.raw_ci_low or 0) <= float(t) <= (r.raw_ci_high or 0)
                for r, t in zip(rows, want, strict=True)
            )
            raw_width += sum(Fraction((r.raw_ci_high or 0) - (r.raw_ci_low or 0)) for r in rows)
    return CoveragePoint(
        q.kind,
        survey.neighbouring,
        q.epsilon or Fraction(0),
        n,
        case,
        runs,
        confidence,
        held / runs,
        None if q.add_remove else raw_held / runs,
        None if q.add_remove or not raw_width else float(shown_width / raw_width),
    )


def _collected(
    coords: list[Estimate], report_count: int, confidence: float, noisy: list[int]
) -> CollectionResult:
    scalar = len(coords) == 1

    def pick(values: list[Fraction]) -> Any:
        return values[0] if scalar else values

    return CollectionResult(
        start=0,
        duration=1,
        report_count=report_count,
        estimate=pick([e.value for e in coords]),
        lower=pick([e.low for e in coords]),
        upper=pick([e.high for e in coords]),
        confidence=confidence,
        intervals="simultaneous (exact max-of-k)",
        spent=Fraction(0),
        unit="epsilon",
        against_collector=Guarantee.pure(Fraction(1)),
        mechanism="geometric",
        noisy_aggregate=noisy,
        seconds=0.0,
    )


def format_coverage(points: Sequence[CoveragePoint]) -> str:
    """A Markdown table of coverage points."""
    lines = [
        "| kind | neighbouring | ε | n | answers | runs | shown intervals cover | raw cover"
        " | shown width / raw |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        raw = "-" if p.raw is None else f"{p.raw:.3f}"
        width = "-" if p.width is None else f"{p.width:.2f}"
        lines.append(
            f"| {p.kind} | {p.neighbouring} | {float(p.epsilon):g} | {p.n} | {p.case} | {p.runs:,}"
            f" | {p.shown:.3f} | {raw} | {width} |"
        )
    return "\n".join(lines)


def run(
    epsilons: Sequence[Fraction],
    sizes: Sequence[int],
    runs: int,
    seed: int,
    neighbourings: Sequence[str] = ("replace_one", "add_remove"),
    progress: Callable[[CoveragePoint], None] = lambda _p: None,
) -> list[CoveragePoint]:
    """Every (neighbouring, ε, kind, n, case) point."""
    rng = random.Random(seed)
    points = []
    for neighbouring in neighbourings:
        for eps in epsilons:
            survey = coverage_survey(eps, neighbouring)
            for q in survey.questions:
                for n in sizes:
                    for case in CASES:
                        point = coverage(survey, q, n, case, runs, rng)
                        progress(point)
                        points.append(point)
    return points
