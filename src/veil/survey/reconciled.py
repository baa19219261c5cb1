"""A survey's results with each breakdown reconciled with the questions it crosses.

A breakdown's cells, its question's totals and its group question's counts are
three releases of overlapping totals with independent noise. After every
question is collected, `reconcile_results` replaces their published rows with one
reconciled set (veil.dp.reconcile: weighted least squares with the exact noise
variances, then the cut to the possible range): the question's totals and the
group's counts are the sums of the breakdown's published cells, and each is at
least as precise as its own release. The raw releases stay beside them, as every
row's `raw_estimate`, `raw_ci_low` and `raw_ci_high`; the result names what it
was reconciled with (`reconciled_with`), and its intervals hold together by
Bonferroni (the reconciled errors are correlated).

A question's release is a margin of a breakdown only where it is a fact: the
question was collected with the same respondents as the breakdown (equal report
counts, `veil.dp.reconcile.same_respondents`), and no other breakdown also
measures it (two breakdowns of one question would each make its totals theirs:
it keeps its own, and each breakdown is reconciled with its other question
only). A group question's counts are a breakdown's margin when the breakdown is
a histogram (a yes_no or choice question counted by group), whose cells hold
each respondent once. A breakdown of answers randomized on the device
(`local_epsilon`) is published as collected, for now.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from fractions import Fraction

from veil.dp.errors import InvalidParameter
from veil.dp.estimates import Estimate
from veil.dp.mechanisms import TotalNoise
from veil.dp.reconcile import breakdown_plan, same_respondents
from veil.survey.model import Question, Survey
from veil.survey.results import Collected, QuestionResult, Row, _f
from veil.survey.tasks import question_task

__all__ = ["BONFERRONI", "MAX_CELLS", "reconcile_results"]

# The most cells a reconciled breakdown has: its least squares are dense, cubic in
# the cells (1,000 cells took 7 s on two busy cores).
# A larger breakdown keeps its own result and its questions theirs.
MAX_CELLS = 1000
# As veil.collector.estimate names intervals that hold together by the union bound.
BONFERRONI = "simultaneous (Bonferroni)"
PER_COORDINATE = "per-coordinate"


def _noise(survey: Survey, q: Question) -> TotalNoise:
    vdaf, dp, _ = question_task(survey, q)
    return dp.plan(vdaf).total_noise()


def _values(r: Collected) -> list[float]:
    """The decoded aggregate: the raw unbiased estimate of each coordinate."""
    values = r.estimate if isinstance(r.estimate, list) else [r.estimate]
    return [float(v) for v in values]


def _local(b: Question) -> bool:
    """Whether breakdown `b` counts answers randomized on the device: its collected
    values are then de-biased estimates whose error is not the servers' noise alone,
    and it is published as collected (veil.dp.reconcile says how it would be
    reconciled: on the randomized sums, de-biased afterwards)."""
    assert b.of is not None and b.by is not None
    return any(q.local_epsilon is not None for q in (b, b.of, b.by))


def _margins(b: Question) -> tuple[Question, ...]:
    """The questions whose releases measure breakdown `b`'s margins."""
    assert b.of is not None and b.by is not None
    return (b.of, b.by) if b.of.kind in ("yes_no", "choice") else (b.of,)


def _margin(
    survey: Survey, q: Question, n: int, collected: Mapping[str, Collected], shared: set[str]
) -> TotalNoise | None:
    """The noise of question `q`'s release where it is a margin of a breakdown of n
    reports (see the module's docstring), else None."""
    r = collected.get(q.id)
    if r is None or q.id in shared or q.add_remove or q.local_epsilon is not None:
        return None
    return _noise(survey, q) if same_respondents(n, r.report_count) else None


def _shown(row: Row, e: Estimate, scale: Fraction) -> Row:
    return replace(
        row,
        estimate=_f(e.value * scale),
        ci_low=_f(e.low * scale),
        ci_high=_f(e.high * scale),
    )


def _question_rows(q: Question, r: QuestionResult, shown: Sequence[Estimate]) -> tuple[Row, ...]:
    """Question `q`'s published rows from its reconciled totals (one per coordinate
    of its release: an integer's sum gives its mean and sum rows)."""
    n = r.n
    per = Fraction(1, n) if n else Fraction(0)
    if q.kind == "integer":
        mean, total = r.rows
        return (_shown(mean, shown[0], per), _shown(total, shown[0], Fraction(1)))
    scale = per if q.kind == "points" else Fraction(1)
    return tuple(_shown(row, e, scale) for row, e in zip(r.rows, shown, strict=True))


def reconcile_results(
    survey: Survey, results: Sequence[QuestionResult], collected: Mapping[str, Collected]
) -> list[QuestionResult]:
    """`results` with every breakdown in them reconciled with its questions.

    `collected` holds each question's and breakdown's collection (by id), from
    which its result was computed; a breakdown or question without one (a text
    question, one not collected), or under add_remove, is left as it is.
    """
    by_id = {r.question.id: r for r in results}
    breakdowns = [
        b
        for b in survey.breakdowns
        if b.id in by_id
        and b.id in collected
        and not b.add_remove
        and len(b.cells()) <= MAX_CELLS
        and not _local(b)
    ]
    uses = Counter(q.id for b in breakdowns for q in _margins(b))
    shared = {qid for qid, count in uses.items() if count > 1 or qid not in by_id}
    out = dict(by_id)
    for b in breakdowns:
        assert b.of is not None and b.by is not None
        rb = collected[b.id]
        n = rb.report_count
        simultaneous = rb.intervals != PER_COORDINATE
        of, by = b.of, b.by
        top = {"integer": of.max, "points": of.total}.get(of.kind, 1)
        plan = breakdown_plan(
            of.kind,
            max(len(b.categories()), 1),
            by.kind,
            len(b.groups()),
            n,
            top,
            _noise(survey, b),
            _margin(survey, of, n, collected, shared),
            _margin(survey, by, n, collected, shared) if of.kind in ("yes_no", "choice") else None,
            rb.confidence,
            simultaneous=simultaneous,
        )
        if not plan.margins:
            continue  # nothing measured twice: its own result stands
        sources = {"question": of, "group": by}
        try:
            reconciled = plan.apply(
                _values(rb), [_values(collected[sources[m.name].id]) for m in plan.margins]
            )
        except InvalidParameter:
            # Releases without noise that disagree: not the same respondents after
            # all (equal counts of different people). Nothing is reconciled.
            continue
        intervals = BONFERRONI if simultaneous and plan.size > 1 else PER_COORDINATE
        cells = tuple(
            _shown(row, e, Fraction(1))
            for row, e in zip(by_id[b.id].rows, reconciled.shown_cells, strict=True)
        )
        names = tuple(sources[m.name].id for m in plan.margins)
        out[b.id] = replace(by_id[b.id], rows=cells, intervals=intervals, reconciled_with=names)
        for m, shown in zip(plan.margins, reconciled.shown_margins, strict=True):
            q = sources[m.name]
            rows = _question_rows(q, by_id[q.id], shown)
            out[q.id] = replace(
                by_id[q.id],
                rows=rows,
                intervals=BONFERRONI if simultaneous and len(shown) > 1 else PER_COORDINATE,
                reconciled_with=(b.id,),
            )
    return [out[r.question.id] for r in results]
