"""One collected question as it is published: labelled rows of consistent
estimates, with the raw unbiased ones kept beside them.

The collected aggregate is unbiased: at a small batch its noise can put a count
below zero or above the number of respondents, or a mean outside the answers'
scale. What is shown (report.html, results.csv, the terminal, `veil demo`) is
projected into what is possible (veil.dp.consistent_box, consistent_histogram):

==============  =====================================================
kind            consistent estimate (replace_one: n is public)
==============  =====================================================
yes_no          the count of yes in [0, n]
integer         the sum in [0, n·max]; the mean (sum / n) in [0, max]
choice          counts non-negative and summing to n (L2 projection)
multi_choice    each option's count in [0, n]
vector          each element's sum in [0, n·max], its mean in [0, max]
points          each option's sum non-negative, all of them summing to at
                most n·total (L2 projection); each mean in [0, total]
breakdown       a single answer's cells as choice (summing to n), a
                multiple choice's each in [0, n], a number's sums
                per group in [0, n·max], a points split's per cell in
                [0, n·total]; n counts those who answered both
==============  =====================================================

Each interval is intersected with the same range, so it still covers at its
level. Under add_remove the collector has no exact n: rows are ratios of the
noisy sums to the noisy count, already within [0, 1] (shares) or [0, max]
(means), and the raw noisy sums are kept as `raw_sums`.

A question is marked indicative (`BANNER`) when the noise alone spans more than
half of a row's possible range: under replace_one that depends on public
parameters only (the noise and n), never on the answers, so `veil survey plan`
predicts it.

A text question's rows are the answers found (`veil.collector.text`), most given
first: each its last level's noisy count with the interval of that level's noise
(all rows at once), projected into [0, n]; its result also states the release
threshold, the probability that an answer given once is released and the
detection floor at n (`text_result`). Where that floor is above n not even an
answer every respondent gave could be found (`finds_nothing`): the result is
marked indicative, and its note says so and how many respondents the question
needs, everywhere (results.json's `note`, a line of results.csv, report.html,
the terminal).

Every path from a collection to published rows (`veil survey collect`,
`veil demo`, `veil simulate`) goes through `question_result`, once (then
`veil.survey.reconciled` makes each breakdown and the questions it crosses one
consistent set, each row's raw release kept), and every
presentation (results.json and results.csv here, the terminal, the plots and
report.html in veil.render) reads the one `QuestionResult` it gives.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol

from veil.dp.accounting import Guarantee, decimal_text
from veil.dp.estimates import (
    Estimate,
    consistent_bounded_sum,
    consistent_box,
    consistent_histogram,
)
from veil.dp.heavy_hitters import Threshold, count_estimates, detection_floor
from veil.survey.model import Question
from veil.survey.text import answer_from_bytes

BANNER = "too few respondents for this privacy level: treat as indicative only"


def finds_nothing_words(q: Question, floor: int, n: int, found: int = 0) -> str:
    """Why a text question of n reports, whose detection floor is above n, found
    nothing (or `found` answers only by chance), and what it needs, in words."""
    symbol = "ρ" if q.mechanism == "gaussian" else "ε"
    what = "no answer could be found" if not found else "even an answer all gave is likely missed"
    return (
        f"{what}: an answer is found (with 95% probability) only when at least {floor:,}"
        f" respondents give it, and {n:,} answered; this question needs about {floor:,}"
        f" respondents at this {symbol}"
    )


Number = float | int


class Collected(Protocol):
    """What a collection gives (veil.collector.CollectionResult): per-coordinate
    estimates and bounds (a number, or a list of them), the report count, and
    the guarantee the collection gives against the collector."""

    @property
    def report_count(self) -> int: ...
    @property
    def estimate(self) -> Any: ...
    @property
    def lower(self) -> Any: ...
    @property
    def upper(self) -> Any: ...
    @property
    def confidence(self) -> float: ...
    @property
    def intervals(self) -> str: ...
    @property
    def against_collector(self) -> Guarantee: ...


def _f(x: Fraction) -> float:
    return round(float(x), 6)


@dataclass(frozen=True)
class Row:
    """One published number: `estimate` and [`ci_low`, `ci_high`] are the
    consistent ones (within [`possible_low`, `possible_high`]); `raw_*` the
    unbiased estimate and its interval before projection (None where there is
    no such number in the row's units: add_remove's ratios). `truth` is the
    exact value where one is known (simulated answers, `veil demo`)."""

    label: str
    estimate: float
    ci_low: float
    ci_high: float
    raw_estimate: float | None = None
    raw_ci_low: float | None = None
    raw_ci_high: float | None = None
    possible_low: float | None = None
    possible_high: float | None = None
    truth: Number | None = None

    @property
    def noise_dominated(self) -> bool:
        """Whether the interval (the raw one when there is one: the noise's own
        width) spans more than half of the possible range."""
        if self.possible_low is None or self.possible_high is None:
            return False
        if self.raw_ci_low is not None and self.raw_ci_high is not None:
            width = self.raw_ci_high - self.raw_ci_low
        else:
            width = self.ci_high - self.ci_low
        return width > (self.possible_high - self.possible_low) / 2

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "label": self.label,
            "estimate": self.estimate,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
        }
        if self.raw_estimate is not None:
            out["raw_estimate"] = self.raw_estimate
            out["raw_ci_low"] = self.raw_ci_low
            out["raw_ci_high"] = self.raw_ci_high
        if self.possible_low is not None:
            out["possible"] = [self.possible_low, self.possible_high]
        if self.truth is not None:
            out["truth"] = self.truth
        return out


def _crowded(row: Row, cells: int) -> bool:
    """A breakdown's cell whose interval's half-width (the raw one: the noise's own)
    reaches its even share of the possible range."""
    if None in (row.possible_low, row.possible_high, row.raw_ci_low, row.raw_ci_high):
        return False
    assert row.possible_high is not None and row.possible_low is not None
    assert row.raw_ci_high is not None and row.raw_ci_low is not None
    share = (row.possible_high - row.possible_low) / cells
    return share > 0 and (row.raw_ci_high - row.raw_ci_low) / 2 >= share


def _row(
    label: str,
    shown: Estimate,
    raw: Estimate | None,
    scale: Fraction,
    low: Fraction,
    high: Fraction,
) -> Row:
    """A row in its units: `scale` turns a sum into them (1/n for a mean)."""
    return Row(
        label,
        _f(shown.value * scale),
        _f(shown.low * scale),
        _f(shown.high * scale),
        None if raw is None else _f(raw.value * scale),
        None if raw is None else _f(raw.low * scale),
        None if raw is None else _f(raw.high * scale),
        _f(low),
        _f(high),
    )


@dataclass(frozen=True)
class QuestionResult:
    """One question's published result (one object of results.json): its
    labelled `rows` in `unit`, `n` its report count (the noisy one under
    add_remove) and `guarantee` what its collection gives against the collector."""

    question: Question
    n: int
    guarantee: Guarantee
    rows: tuple[Row, ...]
    unit: str
    confidence: float
    intervals: str = "per-coordinate"
    # add_remove: the unbiased noisy sums the ratios come from, the count last.
    raw_sums: tuple[Row, ...] = ()
    # A text question: the threshold its answers passed, and what it implies; the
    # least number of respondents an answer needs to be found (95%) at that threshold.
    threshold: Threshold | None = None
    detection_floor: int | None = None
    # The collections its ledgers were charged for: 1, or a text question's levels
    # queried (fewer than max_bytes when the descent skips or stops).
    collections: int = 1
    # The breakdown or questions its rows were reconciled with (veil.survey.reconciled).
    reconciled_with: tuple[str, ...] = ()

    @property
    def table(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """A breakdown's (groups, categories): its rows are the cells, row by row
        (one category, "sum", for a number's breakdown)."""
        q = self.question
        if q.kind != "breakdown":
            raise ValueError(f"{q.id!r} is not a breakdown")
        return q.groups(), q.categories() or ("sum",)

    @property
    def shown(self) -> tuple[Row, ...]:
        """The rows a reader is shown (terminal, plots, charts): an integer's sum
        row is left out, its mean reads on the question's own scale."""
        if self.question.kind != "integer":
            return self.rows
        return tuple(row for row in self.rows if row.label != "sum")

    @property
    def privacy(self) -> dict[str, str]:
        """The guarantee as results.json states it: {"epsilon", "delta"}, or
        {"rho", "epsilon", "delta"} under zCDP (epsilon "none" without noise);
        with a local layer its `local_epsilon`; under add_remove the
        neighbouring relation and what the guarantee with one aggregator covers."""
        out = self.guarantee.to_json() or {"epsilon": "none"}
        if self.question.add_remove:
            # The guarantee with one aggregator covers values only: it sees each
            # report arrive.
            return {**out, "neighbouring": "add_remove", "against_one_aggregator": "values"}
        if self.question.local_epsilon is not None:
            # Answers randomized on the device (veil.dp.local): the estimates are
            # de-biased, and each answer is ε_L-private even against both aggregators.
            out = {**out, "local_epsilon": decimal_text(self.question.local_epsilon)}
        return out

    @property
    def finds_nothing(self) -> bool:
        """A text question whose detection floor is above its report count: not even
        an answer every respondent gave could be found (public parameters and n only)."""
        return self.detection_floor is not None and self.detection_floor > self.n

    @property
    def indicative(self) -> bool:
        """Whether noise dominates some row, or under add_remove some noisy sum
        against its range at the noisy count (`BANNER`), or a text question could
        find nothing (`finds_nothing`). A breakdown's cell is noise-dominated when
        its interval's half-width reaches the cell's even share of its possible
        range (the range over the cells), as `veil survey plan` warns."""
        if self.question.kind == "breakdown":
            return any(_crowded(row, len(self.rows)) for row in self.rows)
        return self.finds_nothing or any(
            row.noise_dominated for row in (*self.rows, *self.raw_sums)
        )

    @property
    def note(self) -> str:
        """What a reader is told beside the rows: the banner, and for a text question
        that could find nothing, why and how many respondents it needs ("" if none)."""
        if not self.indicative:
            return ""
        if self.finds_nothing:
            assert self.detection_floor is not None
            why = finds_nothing_words(self.question, self.detection_floor, self.n, len(self.rows))
            return f"{BANNER}; {why}"
        return BANNER

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "question": self.question.id,
            "text": self.question.text,
            "kind": self.question.kind,
            "n": self.n,
            **self.privacy,
            "confidence": self.confidence,
            "intervals": self.intervals,
            "estimates": "consistent",
            "indicative_only": self.indicative,
        }
        if self.indicative:
            out["note"] = self.note
        if self.question.kind == "breakdown":
            assert self.question.of is not None and self.question.by is not None
            groups, categories = self.table
            out["breakdown"] = {
                "question": self.question.of.id,
                "by": self.question.by.id,
                "groups": list(groups),
                "categories": list(categories),
            }
        if self.reconciled_with:
            out["reconciled_with"] = list(self.reconciled_with)
        if self.threshold is not None:
            out["threshold"] = self.threshold.value
            out["release_probability"] = self.threshold.release_probability
        if self.detection_floor is not None:
            out["detection_floor"] = self.detection_floor
        out["rows"] = [r.to_json() for r in self.rows]
        if self.raw_sums:
            out["raw_sums"] = [r.to_json() for r in self.raw_sums]
        return out


def _coordinates(r: Collected) -> list[Estimate]:
    values = r.estimate if isinstance(r.estimate, list) else [r.estimate]
    lows = r.lower if isinstance(r.lower, list) else [r.lower]
    highs = r.upper if isinstance(r.upper, list) else [r.upper]
    return [
        Estimate(Fraction(v), Fraction(lo), Fraction(hi), r.confidence, r.confidence)
        for v, lo, hi in zip(values, lows, highs, strict=True)
    ]


def question_result(q: Question, r: Collected) -> QuestionResult:
    """Labelled rows of one collected question: option names for choices;
    "yes" for yes_no; "mean" (the sum over the report count) and "sum" for an
    integer; each element's mean for a vector (its labels, or [i]); each option's
    mean points per respondent for a points question.

    Under add_remove the collector is not told the report count: `n` is the noisy
    count, and every row is a ratio of noisy sums (the share of yes, of each
    option, of respondents choosing each option; the mean per element), with an
    interval that holds whenever the question's simultaneous intervals do."""
    if q.add_remove:
        return _ratio_results(q, r)
    if q.kind == "breakdown":
        return _breakdown_result(q, r)
    n = r.report_count
    raw = _coordinates(r)
    per = Fraction(1, n) if n else Fraction(0)
    one = Fraction(1)
    zero = Fraction(0)
    top = Fraction(q.mean_top) if q.mean_top is not None else one
    if q.kind == "choice":  # one answer per report: the counts add up to n
        shown = consistent_histogram(raw, n)
    elif q.kind == "points":  # at most the total per report, over all options
        shown = consistent_bounded_sum(raw, n * q.total)
    else:
        shown = consistent_box(raw, 0, n * top)
    pairs = list(zip(shown, raw, strict=True))
    rows: list[Row]
    if q.kind == "yes_no":
        rows = [_row("yes", shown[0], raw[0], one, zero, Fraction(n))]
        unit = "respondents"
    elif q.kind == "integer":
        rows = [
            _row("mean", shown[0], raw[0], per, zero, top),
            _row("sum", shown[0], raw[0], one, zero, n * top),
        ]
        unit = f"mean answer (0 to {q.max})"
    elif q.kind == "vector":
        rows = [
            _row(label, s, e, per, zero, top)
            for label, (s, e) in zip(q.element_labels(), pairs, strict=True)
        ]
        unit = f"mean answer (0 to {q.max})"
    elif q.kind == "points":
        rows = [
            _row(label, s, e, per, zero, top)
            for label, (s, e) in zip(q.options, pairs, strict=True)
        ]
        unit = f"mean points (0 to {q.total})"
    else:
        rows = [
            _row(label, s, e, one, zero, Fraction(n))
            for label, (s, e) in zip(q.options, pairs, strict=True)
        ]
        unit = "respondents"
    return QuestionResult(q, n, r.against_collector, tuple(rows), unit, r.confidence, r.intervals)


def _breakdown_result(q: Question, r: Collected) -> QuestionResult:
    """A breakdown's cells, row by row (`Question.cells`), n those who answered both
    its questions: a single answer's cells non-negative and summing to n, a multiple
    choice's each a count in [0, n], a number's each group's sum in [0, n·max]."""
    assert q.of is not None
    n = r.report_count
    raw = _coordinates(r)
    zero = Fraction(0)
    if q.of.kind in ("yes_no", "choice"):
        shown = consistent_histogram(raw, n)
        top, unit = Fraction(n), "respondents"
    elif q.of.kind == "multi_choice":
        shown = consistent_box(raw, 0, n)
        top, unit = Fraction(n), "respondents"
    elif q.of.kind == "points":
        top, unit = Fraction(n * q.of.total), f"points (each respondent 0 to {q.of.total})"
        shown = consistent_box(raw, 0, top)
    else:
        top, unit = Fraction(n * q.of.max), f"sum of answers (each 0 to {q.of.max})"
        shown = consistent_box(raw, 0, top)
    rows = tuple(
        _row(label, s, e, Fraction(1), zero, top)
        for label, s, e in zip(q.cells(), shown, raw, strict=True)
    )
    return QuestionResult(q, n, r.against_collector, rows, unit, r.confidence, r.intervals)


def text_result(
    q: Question,
    found: Sequence[tuple[bytes, int]],
    n: int,
    threshold: Threshold,
    guarantee: Guarantee,
    confidence: float = 0.95,
    levels: int | None = None,
) -> QuestionResult:
    """The answers found for a text question: `found` holds each answer's padded
    bytes and its last level's noisy count; `n` the report count (public under
    replace_one); `levels` the levels queried (default: all max_bytes). Rows are
    the answers, most given first, each a count of respondents with an interval
    holding for every row at once."""
    if q.kind != "text":
        raise ValueError(f"question {q.id!r} is not a text question")
    ordered = sorted(found, key=lambda f: (-f[1], f[0]))
    raw = count_estimates(
        [c for _, c in ordered], q.heavy_hitters(), 1 - confidence, simultaneous=True
    )
    shown = consistent_box(raw, 0, n)
    rows = tuple(
        _row(answer_from_bytes(prefix), s, e, Fraction(1), Fraction(0), Fraction(n))
        for (prefix, _), s, e in zip(ordered, shown, raw, strict=True)
    )
    noisy = q.heavy_hitters().level_plan.server_noise() is not None
    # As veil.collector.estimate names them: the exact quantile of the rows' largest noise.
    intervals = "simultaneous (exact max-of-k)" if len(rows) > 1 and noisy else "per-coordinate"
    floor = detection_floor(q.heavy_hitters(), threshold.value, max(n, 1)).count
    return QuestionResult(
        q,
        n,
        guarantee,
        rows,
        "respondents",
        confidence,
        intervals,
        threshold=threshold,
        detection_floor=floor,
        collections=q.max_bytes if levels is None else levels,
    )


def _ratio_results(q: Question, r: Collected) -> QuestionResult:
    coords = _coordinates(r)
    results, count = q.ratio_estimates(coords)
    labels: tuple[str, ...]
    sums: tuple[str, ...]
    if q.kind == "yes_no":
        labels, unit, top = ("yes",), "share of respondents", Fraction(1)
        sums = ("no", "yes")
    elif q.kind in ("choice", "multi_choice"):
        labels, unit, top = q.options, "share of respondents", Fraction(1)
        sums = q.options if q.kind == "choice" else (*q.options, "count")
    elif q.kind == "integer":
        labels, unit, top = ("mean",), f"mean answer (0 to {q.max})", Fraction(q.max)
        sums = ("sum", "count")
    else:
        labels, unit, top = q.element_labels(), f"mean answer (0 to {q.max})", Fraction(q.max)
        sums = (*labels, "count")
    rows = tuple(
        _row(label, e, None, Fraction(1), Fraction(0), top)
        for label, e in zip(labels, results, strict=True)
    )
    if q.kind in ("yes_no", "choice"):  # the buckets add up to the count
        sums, coords = (*sums, "count"), [*coords, count]
    n = max(round(count.value), 0)
    # Each noisy sum's possible range with the noisy count standing in for n.
    raw_sums = tuple(
        Row(label, _f(e.value), _f(e.low), _f(e.high), None, None, None, 0.0, _f(n * scale))
        for label, e in zip(sums, coords, strict=True)
        for scale in [Fraction(1) if label == "count" else top]
    )
    return QuestionResult(
        q, n, r.against_collector, rows, unit, r.confidence, r.intervals, raw_sums=raw_sums
    )


def results_json(results: Sequence[QuestionResult]) -> str:
    """RESULTS/results.json: a list of `QuestionResult.to_json` objects."""
    return json.dumps([r.to_json() for r in results], indent=2, ensure_ascii=False) + "\n"


def results_csv(results: Sequence[QuestionResult]) -> str:
    """RESULTS/results.csv: one line per row, the question's n and note on each; a
    question without a row (a text question that found nothing) has one line with
    its note and no label."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["question", "kind", "n", "label", "estimate", "ci_low", "ci_high", "note"])
    for r in results:
        note = r.note
        if not r.rows:
            w.writerow([r.question.id, r.question.kind, r.n, "", "", "", "", note])
        for row in r.rows:
            w.writerow(
                [
                    r.question.id,
                    r.question.kind,
                    r.n,
                    row.label,
                    row.estimate,
                    row.ci_low,
                    row.ci_high,
                    note,
                ]
            )
    return buf.getvalue()
