"""Planning a survey's size before fielding it: `veil survey plan`.

For each question, at a given number of respondents n: the expected error of
its estimates (the median and the 90th percentile of the noise, in the
question's own units: respondents for counts, the answer's scale for means),
the half-width of the 95% interval `veil survey collect` will show (all rows
of the question at once, as there), and the smallest n at which that interval
is narrower than the question's target (`target_error` of its range, default
±10%). Everything comes from the exact noise distribution and the public
parameters (veil.dp.estimates), never from a random run, so under
replace_one it is exactly what the collection will show; with a local layer
(randomized response, whose spread grows with n) and under add_remove (ratios
to a noisy count) it is computed at answers in the middle of the range.

A question whose interval at n spans more than half its range is the one the
results will mark "indicative only" (veil.collector.results.BANNER).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction

from veil.dp.estimates import Estimate, noise_half_width, ratio, simultaneous_alpha
from veil.dp.local import local_error, local_estimate
from veil.dp.mechanisms import Mechanism, NoisePlan
from veil.survey import DEFAULT_TARGET_ERROR, Question, Survey
from veil.task import DpSpec, VdafSpec

__all__ = ["QuestionPlan", "format_plan", "plan_json", "plan_survey"]

CONFIDENCE = 0.95
# Where the search for the smallest sufficient n stops.
MAX_SEARCH = 10**12


@dataclass(frozen=True)
class QuestionPlan:
    """One question's expected accuracy at `respondents`, in `unit`.

    `median` and `p90` are the error of one row's estimate (exceeded half the
    time, one time in ten); `half_width` the 95% interval's (every row at
    once); `target` the half-width aimed at: `target_error` of the range
    [0, `range_high`] (n for counts, max for means, 1 for shares); `needed`
    the smallest number of respondents whose interval is narrower than
    `target` (never below the survey's min_batch_size; None: not within
    10^12); `indicative` whether the results at `respondents` would be marked
    indicative only (the interval spans over half the range).
    """

    question: str
    text: str
    kind: str
    unit: str
    respondents: int
    range_high: float
    median: float
    p90: float
    half_width: float
    target_error: float
    target: float
    needed: int | None
    indicative: bool

    @property
    def reaches_target(self) -> bool:
        return self.needed is not None and self.needed <= self.respondents


def _unit(q: Question) -> tuple[str, Fraction]:
    """What a question's results count, and the top of their range per respondent."""
    if q.kind in ("integer", "vector"):
        return f"mean answer (0 to {q.max})", Fraction(q.max)
    if q.add_remove:
        return "share of respondents", Fraction(1)
    return "respondents", Fraction(1)


class _Question:
    """The accuracy of one question's published rows as a function of n."""

    def __init__(self, q: Question, vdaf: VdafSpec, dp: DpSpec) -> None:
        self.q = q
        self.plan: NoisePlan = dp.plan(vdaf)
        self.channel = dp.local(vdaf)
        self.coordinates = q.vdaf_params.get("length", 1)
        self.unit_name, self.top = _unit(q)
        self.exact = self.plan.server_noise() is None
        scale = Fraction(1)
        if self.plan.config.mechanism is Mechanism.LAPLACE:
            scale = Fraction(1, 1 << self.plan.config.fixed_point_bits)
        self.scale = scale
        alpha = 1 - CONFIDENCE
        self.alpha = alpha
        if not self.exact:
            c, _ = noise_half_width(self.plan, simultaneous_alpha(alpha, self.coordinates))
            self.c = c * scale  # the simultaneous half-width, in the aggregate's units
            self.median_noise = noise_half_width(self.plan, 0.5)[0] * scale
            self.p90_noise = noise_half_width(self.plan, 0.1)[0] * scale

    def per_row(self, n: int) -> Fraction:
        """What turns an aggregate's units into a row's: 1/n for means and shares."""
        means = self.q.kind in ("integer", "vector") or self.q.add_remove
        return Fraction(1, n) if means else Fraction(1)

    def errors(self, n: int) -> tuple[float, float]:
        """(median, 90th percentile) of one row's error at n, in the row's units."""
        if self.exact:
            return 0.0, 0.0
        if self.channel is not None:
            # Randomized response plus the servers' noise: about normal at any n
            # worth planning for (|N(0, σ)|: median 0.674σ, 90th percentile 1.645σ).
            rms, _ = local_error(self.channel, self.plan, n)
            to_row = float(self.per_row(n))
            return 0.6745 * rms * to_row, 1.6449 * rms * to_row
        row = self.per_row(n)
        return float(self.median_noise * row), float(self.p90_noise * row)

    def half_width(self, n: int) -> Fraction:
        """Half the width of the interval the results will show at n (all rows at once)."""
        if self.exact:
            return Fraction(0)
        if self.channel is not None:
            # Answers in the middle of the range; Bonferroni over the rows, as collect does.
            alpha = self.alpha / self.coordinates if self.coordinates > 1 else self.alpha
            a, b = self.channel.affine(0)
            middle = n * self.channel.scale / 2
            y = round(a * middle + b * n)  # in the aggregate's encoded units
            (est,) = local_estimate([y], n, self.channel, self.plan, alpha=alpha)
            return (est.high - est.low) / 2 * self.per_row(n)
        if self.q.add_remove:
            # A ratio of two noisy sums at the middle of the range (veil.dp.ratio).
            num_value = n * self.top / 2
            num = Estimate(num_value, num_value - self.c, num_value + self.c, CONFIDENCE, 0.0)
            den = Estimate(Fraction(n), n - self.c, n + self.c, CONFIDENCE, 0.0)
            r = ratio(num, den, Fraction(0), self.top)
            return (r.high - r.low) / 2
        return self.c * self.per_row(n)

    def range_at(self, n: int) -> Fraction:
        """The width of a row's possible range at n."""
        if self.q.kind in ("integer", "vector") or self.q.add_remove:
            return self.top
        return Fraction(n)

    def narrow_enough(self, n: int, target_error: Fraction) -> bool:
        return self.half_width(n) < target_error * self.range_at(n)

    def needed(self, target_error: Fraction, floor: int) -> int | None:
        """The smallest n >= floor whose interval is narrower than the target."""
        if self.narrow_enough(floor, target_error):
            return floor
        if self.channel is None and not self.q.add_remove:
            # c·row(n) < t·range(n) is c < t·top·n for every kind: n > c/(t·top).
            n = max(math.floor(self.c / (target_error * self.top)) + 1, floor)
            return n if n <= MAX_SEARCH else None
        hi = floor
        while not self.narrow_enough(hi, target_error):
            if hi > MAX_SEARCH:
                return None
            hi *= 2
        lo = hi // 2  # not narrow enough (or the floor itself, checked above)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.narrow_enough(mid, target_error):
                hi = mid
            else:
                lo = mid
        return hi


def plan_survey(
    survey: Survey, respondents: int, target_error: Fraction | None = None
) -> list[QuestionPlan]:
    """Every question's `QuestionPlan` at `respondents`. `target_error` (a share
    of the range, half the interval's width) overrides the survey's and the
    questions' own."""
    from veil.demo import task_specs

    if respondents < 1:
        raise ValueError(f"respondents must be at least 1, got {respondents}")
    specs = task_specs(survey)
    out = []
    for q in survey.questions:
        vdaf, dp, _ = specs[q.id]
        model = _Question(q, vdaf, dp)
        target = target_error or q.target_error or survey.target_error or DEFAULT_TARGET_ERROR
        median, p90 = model.errors(respondents)
        half = model.half_width(respondents)
        width = model.range_at(respondents)
        out.append(
            QuestionPlan(
                question=q.id,
                text=q.text,
                kind=q.kind,
                unit=model.unit_name,
                respondents=respondents,
                range_high=float(width),
                median=round(median, 6),
                p90=round(p90, 6),
                half_width=round(float(half), 6),
                target_error=float(target),
                target=round(float(target * width), 6),
                needed=model.needed(target, survey.min_batch_size),
                indicative=2 * half > width / 2,
            )
        )
    return out


def _amount(x: float) -> str:
    """An error as people read it: ±3, ±0.42, ±1,200."""
    if x == 0:
        return "0"
    if x >= 100:
        return f"±{x:,.0f}"
    return f"±{x:.2g}" if x < 1 else f"±{x:.3g}"


def format_plan(survey: Survey, plans: Sequence[QuestionPlan]) -> str:
    """The plan as a plain-text table, one row per question, and what to do."""
    if not plans:
        return ""
    n = plans[0].respondents
    header = (
        "question",
        "unit",
        "median error",
        "90% of errors",
        "95% interval",
        "target",
        "respondents needed",
    )
    rows: list[tuple[str, ...]] = [header]
    for p in plans:
        needed = "never" if p.needed is None else f"{p.needed:,}"
        rows.append(
            (
                p.question,
                p.unit,
                _amount(p.median),
                _amount(p.p90),
                _amount(p.half_width),
                f"{_amount(p.target)} ({p.target_error:.0%})",
                needed,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        f"{survey.name}: expected accuracy at {n:,} respondents"
        " (exact, from the noise; each row in the question's own units)"
    ]
    for j, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines += [
        "errors: how far one estimate falls from the truth, half the time and 9 times in 10",
        "95% interval: half its width, every row of a question at once (as the results show)",
        "target: the half-width aimed at, a share of the range (0 to n for counts, the scale"
        " for means)",
    ]
    if n < survey.min_batch_size:
        lines.append(
            f"at {n:,} respondents nothing is released: the survey's min_batch_size is"
            f" {survey.min_batch_size:,} (each aggregator refuses a smaller batch)"
        )
    short = [p for p in plans if not p.reaches_target]
    if short:
        lines.append(
            f"at {n:,} respondents these questions miss their target: "
            + ", ".join(
                f"{p.question} (needs {'more than 10^12' if p.needed is None else f'{p.needed:,}'})"
                for p in short
            )
            + "; give them more of the budget, more respondents, or fewer questions"
        )
    noisy = [p.question for p in plans if p.indicative]
    if noisy:
        lines.append(
            f"results at {n:,} respondents will be marked indicative only (the interval spans"
            f" over half the range): {', '.join(noisy)}"
        )
    return "\n".join(lines)


def plan_json(survey: Survey, plans: Sequence[QuestionPlan]) -> str:
    """The plan as one JSON object (`veil survey plan --json`)."""
    return json.dumps(
        {
            "survey": survey.id,
            "name": survey.name,
            "respondents": plans[0].respondents if plans else 0,
            "min_batch_size": survey.min_batch_size,
            "confidence": CONFIDENCE,
            "questions": [{**asdict(p), "reaches_target": p.reaches_target} for p in plans],
        },
        indent=2,
        ensure_ascii=False,
    )
