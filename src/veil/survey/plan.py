"""Planning a survey's size before fielding it: `veil survey plan`.

For each question, at a given number of respondents n: the expected error of
its estimates (the median and the 90th percentile of the noise, in the
question's own units: respondents for counts, the answer's scale for means),
the half-width of the 95% interval `veil survey collect` will publish (all
rows of the question at once, as there), and the smallest n at which that
interval is narrower than the question's target (`target_error` of its range,
default ±10%). Everything comes from the exact noise distribution and the
public parameters (veil.dp.estimates), never from a random run.

What is published is kept within the possible range (veil.survey.results): an
interval is cut to it, so its half-width is never more than half the range,
and an estimate is moved into it, which only brings it nearer the truth. So
the plan gives `half_width` as published, the noise's half-width or half the
range if that is less (`raw_half_width` keeps the noise's own), and the errors
at most the range. Under replace_one the noise's interval is exactly the
collection's, at any answers, and a published one is never wider than
`half_width` (equal to it whenever the noise's interval lies within the range,
as at large n; narrower near an edge of the range at small n), but for a single
choice whose intervals miss (at most 5% of the time), which is widened to hold
its estimate (veil.dp.estimates.consistent_histogram). With a local layer
(randomized response, whose spread grows with n) and under add_remove (ratios
to a noisy count) it is computed at answers in the middle of the range.

A question whose interval at n spans more than half its range is the one the
results will mark "indicative only" (veil.survey.results.BANNER).

A breakdown's rows are its cells (counts of respondents, or a number's sums per
group), each with the same noise. A cell's range is planned as its even share of
the respondents, n / cells (times max for a number's sums): what a cell holds when
the answers spread evenly. Its target is `target_error` of that share, and the
breakdown is flagged noise-dominated (`indicative`) when the interval's half-width
reaches the even share itself: a typical cell could then read as empty or as
double its size, and fewer respondents per cell only make it worse. Where its
questions randomize on the device, its half-width is the stated bound the results
use (`veil.dp.local.breakdown_half_width`) and its errors the worst case's
(`breakdown_error`). A breakdown and the questions it measures again are published
reconciled (veil.survey.reconciled): `reconciled_half_width` is the half-width
then, from the same plan `veil survey collect` makes, every question answered by
the n respondents (so that each is a margin), every row at once.

A text question's rows are the answers found, each a count of respondents: its
plan adds the release threshold, the probability that an answer given by one
respondent is released, and the detection floor at n (the least number of
respondents, and their share, who must give an answer for it to be found with
95% probability; `veil.dp.heavy_hitters`). Its target is that floor's share:
`min_share` if the question has one, else `target_error`; "respondents needed" is
the smallest n at which the floor falls to it. Where the floor at n is above n,
the question can release nothing at n, not even an answer every respondent
gives: `possible_from` is the least n at which such an answer is found, and the
plan says so in words.

`expected_errors` gives the same figures over a range of total budgets
(`veil simulate --sweep-epsilon`), and `local_costs` what a question's local
layer costs in accuracy (`veil demo --local-epsilon`). `plan_json` is the
plan as `veil survey plan --json` prints it; veil.render.text prints the
tables.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from fractions import Fraction

from veil.dp.counted import counted_breakdown_error, counted_half_width
from veil.dp.estimates import Estimate, noise_half_width, ratio, simultaneous_alpha
from veil.dp.heavy_hitters import detection_floor
from veil.dp.local import (
    breakdown_error,
    breakdown_half_width,
    local_error,
    local_estimate,
)
from veil.dp.mechanisms import Mechanism, NoisePlan
from veil.survey.budget import text_mechanism_variant, with_epsilon
from veil.survey.model import DEFAULT_TARGET_ERROR, Question, Survey, counted, counted_channels
from veil.survey.reconciled import reconcile_plans
from veil.survey.tasks import question_task
from veil.task import DpSpec, VdafSpec

__all__ = [
    "ExpectedError",
    "LocalCost",
    "QuestionPlan",
    "expected_errors",
    "local_costs",
    "plan_json",
    "plan_survey",
    "variant_plans",
]

CONFIDENCE = 0.95
# Where the search for the smallest sufficient n stops.
MAX_SEARCH = 10**12


@dataclass(frozen=True)
class QuestionPlan:
    """One question's expected accuracy at `respondents`, in `unit`.

    `median` and `p90` are the error of one row's estimate (exceeded half the
    time, one time in ten; at most the range); `half_width` the published 95%
    interval's (every row at once; at most half the range, to which it is cut),
    `raw_half_width` the noise's own; `target` the half-width aimed at: `target_error` of the range
    [0, `range_high`] (n for counts, max for means, 1 for shares); `needed`
    the smallest number of respondents whose interval is narrower than
    `target` (never below the survey's min_batch_size; None: not within
    10^12); `indicative` whether the results at `respondents` would be marked
    indicative only (the interval spans over half the range). A breakdown's
    `range_high` is a cell's whole range (every respondent in it), and its
    `cell_share` the cell's even share of it, of which `target` is
    `target_error`; it is `indicative` when the half-width reaches that share.
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
    raw_half_width: float = 0.0
    # Text questions only (None otherwise): the release threshold (a noisy count),
    # the probability an answer given once is released, and the detection floor.
    threshold: int | None = None
    release_probability: float | None = None
    detection_floor: int | None = None
    detection_share: float | None = None
    # The least respondents at which an answer every one of them gives is found
    # (None: not within 10^12); above `respondents`, nothing can be released.
    possible_from: int | None = None
    # Breakdowns only (None otherwise): what a cell holds when the answers spread
    # evenly over the cells, the range the target and the warning are planned at.
    cell_share: float | None = None
    # A breakdown, or a question a breakdown measures again, reconciled as collect
    # publishes them (veil.survey.reconciled): its half-width then (None otherwise).
    reconciled_half_width: float | None = None

    @property
    def reaches_target(self) -> bool:
        return self.needed is not None and self.needed <= self.respondents

    @property
    def impossible(self) -> bool:
        """A text question that can release nothing at `respondents`: even an answer
        every respondent gives is below its detection floor."""
        return self.detection_floor is not None and self.detection_floor > self.respondents


def _unit(q: Question) -> tuple[str, Fraction]:
    """What a question's results count, and the top of their range per respondent."""
    if q.kind == "points":
        return f"mean points (0 to {q.total})", Fraction(q.total)
    if q.kind == "breakdown":
        assert q.of is not None
        if q.of.kind == "integer":
            return f"sum per cell (each 0 to {q.of.max})", Fraction(q.of.max)
        if q.of.kind == "points":
            return f"points per cell (each 0 to {q.of.total})", Fraction(q.of.total)
        return "respondents per cell", Fraction(1)
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
        # A breakdown's cell is planned at its even share of the respondents; its
        # questions' local layers, if any, are the breakdown's too (veil.dp.local).
        self.cells = len(q.cells()) if q.kind == "breakdown" else 1
        self.cell_channels = q.breakdown_channels() if q.kind == "breakdown" else (None, None)
        # A randomized multiple choice's or number's breakdown counts bits and groups.
        self.counted = counted_channels(q) if q.kind == "breakdown" and counted(q) else None
        self.local_cells = self.cell_channels != (None, None) or self.counted is not None
        if self.local_cells:
            self.shape = (len(q.groups()), len(q.categories()) or 1)
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
        means = self.q.mean_top is not None or self.q.add_remove
        return Fraction(1, n) if means else Fraction(1)

    def errors(self, n: int) -> tuple[float, float]:
        """(median, 90th percentile) of one row's error at n, in the row's units."""
        if self.counted is not None:
            rms = counted_breakdown_error(n, self.shape, *self.counted, self.plan)
            return 0.6745 * rms, 1.6449 * rms
        if self.local_cells:
            rms = breakdown_error(n, self.shape, self.cell_channels, self.plan, int(self.top))
            return 0.6745 * rms, 1.6449 * rms
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
        if self.counted is not None:
            return counted_half_width(n, self.shape, *self.counted, self.plan)
        if self.local_cells:
            top = int(self.top)
            return breakdown_half_width(n, self.shape, self.cell_channels, self.plan, top)
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
        if self.q.kind == "breakdown":
            return n * self.top / self.cells
        if self.q.mean_top is not None or self.q.add_remove:
            return self.top
        return Fraction(n)

    def narrow_enough(self, n: int, target_error: Fraction) -> bool:
        return self.half_width(n) < target_error * self.range_at(n)

    def needed(self, target_error: Fraction, floor: int) -> int | None:
        """The smallest n >= floor whose interval is narrower than the target."""
        if self.narrow_enough(floor, target_error):
            return floor
        if self.channel is None and not self.q.add_remove and not self.local_cells:
            # c·row(n) < t·range(n) is c < t·top·n/cells for every kind (cells 1 but for
            # a breakdown): n > c·cells/(t·top).
            n = max(math.floor(self.c * self.cells / (target_error * self.top)) + 1, floor)
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
    if respondents < 1:
        raise ValueError(f"respondents must be at least 1, got {respondents}")
    reconciled = _reconciled_half_widths(survey, respondents)
    out = []
    for q in survey.tasked:
        if q.kind == "text":
            out.append(_text_plan(survey, q, respondents, target_error))
            continue
        vdaf, dp, _ = question_task(survey, q)
        model = _Question(q, vdaf, dp)
        target = target_error or q.target_error or survey.target_error or DEFAULT_TARGET_ERROR
        median, p90 = model.errors(respondents)
        half = model.half_width(respondents)
        width = model.range_at(respondents)
        # What a row may hold: a breakdown's cell up to every respondent.
        full = respondents * model.top if q.kind == "breakdown" else width
        out.append(
            QuestionPlan(
                question=q.id,
                text=q.text,
                kind=q.kind,
                unit=model.unit_name,
                respondents=respondents,
                range_high=float(full),
                median=round(min(median, float(full)), 6),
                p90=round(min(p90, float(full)), 6),
                half_width=round(float(min(half, full / 2)), 6),
                raw_half_width=round(float(half), 6),
                target_error=float(target),
                target=round(float(target * width), 6),
                needed=model.needed(target, survey.min_batch_size),
                # A breakdown: noise as wide as a cell's even share (see above).
                indicative=half >= width if q.kind == "breakdown" else 2 * half > width / 2,
                cell_share=round(float(width), 6) if q.kind == "breakdown" else None,
                reconciled_half_width=(
                    round(min(reconciled[q.id] * float(model.per_row(respondents)),
                              float(full) / 2), 6)
                    if q.id in reconciled else None
                ),
            )
        )  # fmt: skip
    return out


def _reconciled_half_widths(survey: Survey, n: int) -> dict[str, float]:
    """Each breakdown's and each reconciled question's half-width (its widest row,
    every row at once) after reconciliation, in its aggregate's units, with the
    plan `veil survey collect` makes when every question has the n respondents."""
    counts = {q.id: n for q in survey.tasked if q.kind != "text"}
    out: dict[str, float] = {}
    for joint in reconcile_plans(survey, counts, lambda _b: (CONFIDENCE, True)):
        plan = joint.plan
        for b, piece in zip(joint.breakdowns, plan.pieces, strict=True):
            out[b.id] = max(plan.cell_half_width(j) for j in piece)
        for i, m in enumerate(plan.margins):
            out[m.name] = max(plan.margin_half_width(i, r) for r in range(m.design.shape[0]))
    return out


def _text_plan(survey: Survey, q: Question, n: int, target_error: Fraction | None) -> QuestionPlan:
    """A text question's plan at n: its threshold, release probability and detection
    floor, and one recovered answer's count error (its last level's noise)."""
    plan = q.heavy_hitters()

    def floor_at(m: int) -> tuple[int, int, float]:
        # min_share is a share of the respondents, so the threshold moves with n.
        t = q.release_threshold(m if q.min_share is not None else survey.expected_respondents)
        return detection_floor(plan, t.value, m).count, t.value, t.release_probability

    count, threshold, release = floor_at(n)
    target = target_error or q.min_share or q.target_error or survey.target_error
    target = target or DEFAULT_TARGET_ERROR
    level = plan.level_plan
    if level.server_noise() is None:
        median = p90 = half = 0.0
    else:
        median = float(noise_half_width(level, 0.5)[0])
        p90 = float(noise_half_width(level, 0.1)[0])
        half = float(noise_half_width(level, 1 - CONFIDENCE)[0])

    def reaches(m: int) -> bool:
        return floor_at(m)[0] <= target * m

    def found_at_all(m: int) -> bool:
        return floor_at(m)[0] <= m

    needed = _least(reaches, survey.min_batch_size)
    return QuestionPlan(
        question=q.id,
        text=q.text,
        kind=q.kind,
        unit="respondents per answer",
        respondents=n,
        range_high=float(n),
        median=round(min(median, n), 6),
        p90=round(min(p90, n), 6),
        half_width=round(min(half, n / 2), 6),
        raw_half_width=round(half, 6),
        target_error=float(target),
        target=round(float(target * n), 6),
        needed=needed,
        indicative=count > n,
        threshold=threshold,
        release_probability=release,
        detection_floor=count,
        detection_share=round(count / n, 6),
        possible_from=_least(found_at_all, 1),
    )


def _least(holds: Callable[[int], bool], floor: int) -> int | None:
    """The least n >= floor for which `holds` (true from some n on), None past 10^12."""
    if holds(floor):
        return floor
    hi = floor
    while not holds(hi):
        if hi > MAX_SEARCH:
            return None
        hi *= 2
    lo = max(hi // 2, floor)  # does not hold
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if holds(mid) else (mid, hi)
    return hi


def variant_plans(
    survey: Survey, respondents: int, target_error: Fraction | None = None
) -> tuple[Survey, list[QuestionPlan]] | None:
    """The survey with its text questions on the other mechanism
    (`veil.survey.budget.text_mechanism_variant`) and its plans at `respondents`;
    None unless the survey mixes text and other questions."""
    variant = text_mechanism_variant(survey)
    if variant is None:
        return None
    return variant, plan_survey(variant, respondents, target_error)


def plan_json(survey: Survey, plans: Sequence[QuestionPlan]) -> str:
    """The plan as one JSON object (`veil survey plan --json`)."""
    return json.dumps(
        {
            "survey": survey.id,
            "name": survey.name,
            "respondents": plans[0].respondents if plans else 0,
            "min_batch_size": survey.min_batch_size,
            "confidence": CONFIDENCE,
            "questions": [
                {
                    **_plan_fields(p),
                    "reaches_target": p.reaches_target,
                    **({"finds_nothing": p.impossible} if p.kind == "text" else {}),
                }
                for p in plans
            ],
        },
        indent=2,
        ensure_ascii=False,
    )


TEXT_FIELDS = (
    "threshold",
    "release_probability",
    "detection_floor",
    "detection_share",
    "possible_from",
)


def _plan_fields(p: QuestionPlan) -> dict[str, object]:
    """A plan row's fields, the text-only ones only for a text question."""
    fields = asdict(p)
    if p.kind != "text":
        for key in TEXT_FIELDS:
            del fields[key]
    if p.kind != "breakdown":
        del fields["cell_share"]
    if p.reconciled_half_width is None:
        del fields["reconciled_half_width"]
    return fields


@dataclass(frozen=True)
class LocalCost:
    """The expected error of one question's estimates, with and without its local layer.

    Root mean square per result element, in the units the results are shown in
    (a count, the mean of an integer question, a vector's per-element mean): `without` is the
    servers' noise alone, `with_local` adds the respondents' randomized response,
    at its worst over the answers (None: the question has no local layer).
    """

    question: str
    local_epsilon: Fraction | None
    without: float
    with_local: float | None


def local_costs(survey: Survey, respondents: int) -> list[LocalCost]:
    """What each question's local layer costs in accuracy at `respondents` reports."""
    costs = []
    for q in survey.questions:
        if q.kind == "text":
            continue  # no local layer for text answers
        # Integer, vector and points results are shown as means (per element, option).
        scale = 1 / respondents if q.mean_top is not None else 1.0
        plain = question_task(survey, replace(q, local_epsilon=None))
        without, _ = local_error(None, plain[1].plan(plain[0]), respondents)
        with_local = None
        if q.local_epsilon is not None:
            vdaf, dp, _ = question_task(survey, q)
            with_local = local_error(dp.local(vdaf), dp.plan(vdaf), respondents)[0] * scale
        costs.append(LocalCost(q.id, q.local_epsilon, without * scale, with_local))
    return costs


@dataclass(frozen=True)
class ExpectedError:
    """How far one question's estimates are expected to be from the truth at a
    total ε, computed exactly from the noise distribution (no random run).

    Relative to the question's scale: a share of the respondents for counts
    (yes_no, choice, multi_choice), a share of the answer range 0..max for the
    means of integer, vector and points questions. `median` is the error exceeded half
    the time, `p90` one in ten times (the band), `rms` the root mean square.
    The servers' noise only (without any local layer).
    """

    question: str
    text: str
    unit: str
    epsilon: float
    median: float
    p90: float
    rms: float


def expected_errors(
    survey: Survey, respondents: int, epsilons: Sequence[Fraction]
) -> list[ExpectedError]:
    """`ExpectedError` of every question at each total ε in `epsilons`."""
    out = []
    for eps in epsilons:
        scaled = with_epsilon(survey, eps)
        plain = replace(
            scaled, questions=tuple(replace(q, local_epsilon=None) for q in scaled.questions)
        )
        for q in plain.questions:
            if q.kind == "text":
                # One recovered answer's count: its last level's noise.
                plan = q.heavy_hitters().level_plan
            else:
                vdaf, dp, _ = question_task(plain, q)
                plan = dp.plan(vdaf)
            if plan.server_noise() is None:
                median = p90 = rms = 0.0
            else:
                unit = 2**plan.config.fixed_point_bits
                median = noise_half_width(plan, 0.5)[0] / unit
                p90 = noise_half_width(plan, 0.1)[0] / unit
                rms = local_error(None, plan, respondents)[0]
            top = q.mean_top
            scale = respondents * (top or 1)
            what = f"share of the range 0..{top}" if top else "share of respondents"
            out.append(
                ExpectedError(
                    q.id, q.text, what, float(eps), median / scale, p90 / scale, rms / scale
                )
            )
    return out
