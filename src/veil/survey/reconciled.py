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
counts, `veil.dp.reconcile.same_respondents`). A group question's counts are a
breakdown's margin when the breakdown is a histogram (a yes_no or choice
question counted by group), whose cells hold each respondent once. Breakdowns
that share a margin (two breakdowns of one question, or by one group) are
reconciled together with all their margins (`veil.dp.reconcile.joint_plan`),
so that a question's published totals are the sums of every such breakdown's
cells; a set so connected of more than MAX_CELLS cells keeps its own results.
A breakdown of answers randomized on the device (`local_epsilon`) is published
as collected, for now.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from veil.dp.errors import InvalidParameter
from veil.dp.estimates import Estimate
from veil.dp.mechanisms import TotalNoise
from veil.dp.reconcile import Crossing, ReconcilePlan, joint_plan, same_respondents
from veil.survey.model import Question, Survey
from veil.survey.results import Collected, QuestionResult, Row, _f
from veil.survey.tasks import question_task

__all__ = [
    "BONFERRONI",
    "MAX_CELLS",
    "Joint",
    "measured_by",
    "reconcile_plans",
    "reconcile_results",
]

# The most cells reconciled together (a breakdown, or breakdowns that share a
# margin): the least squares are dense, cubic in the cells (1,000 cells took 7 s
# on two busy cores). A larger set keeps its own results and its questions theirs.
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


def _margin(survey: Survey, q: Question, n: int, counts: Mapping[str, int]) -> TotalNoise | None:
    """The noise of question `q`'s release where it is a margin of a breakdown of n
    reports (see the module's docstring), else None."""
    if q.id not in counts or q.add_remove or q.local_epsilon is not None:
        return None
    return _noise(survey, q) if same_respondents(n, counts[q.id]) else None


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


def _components(
    breakdowns: Sequence[Question], keys: Mapping[str, tuple[str, ...]]
) -> list[list[Question]]:
    """The breakdowns in groups that share a margin (connected through shared
    releases), each in the survey's order."""
    parent = {b.id: b.id for b in breakdowns}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    first: dict[str, str] = {}
    for b in breakdowns:
        for key in keys[b.id]:
            parent[root(first.setdefault(key, b.id))] = root(b.id)
    groups: dict[str, list[Question]] = {}
    for b in breakdowns:
        groups.setdefault(root(b.id), []).append(b)
    return list(groups.values())


@dataclass(frozen=True)
class Joint:
    """Breakdowns reconciled together (in the survey's order) and their plan: the
    plan's pieces are theirs in this order, its margins named by question id."""

    breakdowns: tuple[Question, ...]
    plan: ReconcilePlan


def reconcile_plans(
    survey: Survey,
    counts: Mapping[str, int],
    confidence: Callable[[Question], tuple[float, bool]],
) -> list[Joint]:
    """The reconciliation `veil survey collect` makes, from public parameters:
    `counts` holds the report count of each question and breakdown collected (by
    id), `confidence(b)` a breakdown's confidence and whether its intervals hold
    together. One `Joint` per set of breakdowns that share a margin, where there
    is a margin and the set has at most MAX_CELLS cells; `veil survey plan` makes
    the same at its planned n."""
    breakdowns = [
        b
        for b in survey.breakdowns
        if b.id in counts and not b.add_remove and len(b.cells()) <= MAX_CELLS and not _local(b)
    ]
    # Each breakdown's keys for its question's and group's releases: the
    # question's id where its release is a margin of this breakdown, else a key
    # of the breakdown's own that no release has.
    keys: dict[str, tuple[str, str]] = {}
    noises: dict[str, TotalNoise] = {}
    for b in breakdowns:
        assert b.of is not None and b.by is not None
        pair = []
        for role, q in (("question", b.of), ("group", b.by)):
            counted = role == "question" or b.of.kind in ("yes_no", "choice")
            noise = _margin(survey, q, counts[b.id], counts) if counted else None
            if noise is None:
                pair.append(f"{b.id}:{role}")
            else:
                noises[q.id] = noise
                pair.append(q.id)
        keys[b.id] = (pair[0], pair[1])
    joints = []
    for component in _components(breakdowns, {b.id: tuple(k for k in keys[b.id] if k in noises)
                                               for b in breakdowns}):  # fmt: skip
        if sum(len(b.cells()) for b in component) > MAX_CELLS:
            continue  # too large to solve densely: each keeps its own result
        crossings = []
        for b in component:
            assert b.of is not None and b.by is not None
            of, by = b.of, b.by
            crossings.append(
                Crossing(
                    keys[b.id][0], of.kind, max(len(b.categories()), 1),
                    keys[b.id][1], by.kind, len(b.groups()),
                    counts[b.id],
                    {"integer": of.max, "points": of.total}.get(of.kind, 1),
                    _noise(survey, b),
                )
            )  # fmt: skip
        level, simultaneous = confidence(component[0])
        try:
            plan = joint_plan(crossings, noises, level, simultaneous=simultaneous)
        except InvalidParameter:
            continue  # breakdowns of one release with different counts: other people
        if plan.margins:  # else nothing is measured twice: their own results stand
            joints.append(Joint(tuple(component), plan))
    return joints


def measured_by(joint: Joint) -> dict[str, tuple[str, ...]]:
    """Each margin's question id: the breakdowns of `joint` that measure it."""
    return {
        m.name: tuple(
            b.id
            for b, piece in zip(joint.breakdowns, joint.plan.pieces, strict=True)
            if any(np.any(a[:, list(piece)]) for a in (m.design, *m.others))
        )
        for m in joint.plan.margins
    }


def reconcile_results(
    survey: Survey, results: Sequence[QuestionResult], collected: Mapping[str, Collected]
) -> list[QuestionResult]:
    """`results` with every breakdown in them reconciled with its questions.

    `collected` holds each question's and breakdown's collection (by id), from
    which its result was computed; a breakdown or question without one (a text
    question, one not collected), or under add_remove, is left as it is.
    Breakdowns that share a margin are reconciled together (one least squares
    problem, veil.dp.reconcile.joint_plan), up to MAX_CELLS cells in all.
    """
    by_id = {r.question.id: r for r in results}
    counts = {qid: r.report_count for qid, r in collected.items() if qid in by_id}

    def confidence(b: Question) -> tuple[float, bool]:
        r = collected[b.id]
        return r.confidence, r.intervals != PER_COORDINATE

    out = dict(by_id)
    for joint in reconcile_plans(survey, counts, confidence):
        _reconcile(survey, joint, by_id, collected, out)
    return [out[r.question.id] for r in results]


def _reconcile(
    survey: Survey,
    joint: Joint,
    by_id: Mapping[str, QuestionResult],
    collected: Mapping[str, Collected],
    out: dict[str, QuestionResult],
) -> None:
    """Publish one set of breakdowns reconciled with their margins, into `out`."""
    plan, component = joint.plan, joint.breakdowns
    try:
        reconciled = plan.apply(
            [v for b in component for v in _values(collected[b.id])],
            [_values(collected[m.name]) for m in plan.margins],
        )
    except InvalidParameter:
        # Releases without noise that disagree: not the same respondents after
        # all (equal counts of different people). Nothing is reconciled.
        return
    users = measured_by(joint)
    for b, piece in zip(component, plan.pieces, strict=True):
        shown = [reconciled.shown_cells[j] for j in piece]
        cells = tuple(
            _shown(row, e, Fraction(1)) for row, e in zip(by_id[b.id].rows, shown, strict=True)
        )
        names = tuple(name for name, who in users.items() if b.id in who)
        if not names:
            continue
        intervals = BONFERRONI if plan.simultaneous and len(piece) > 1 else PER_COORDINATE
        out[b.id] = replace(by_id[b.id], rows=cells, intervals=intervals, reconciled_with=names)
    for m, shown_margin in zip(plan.margins, reconciled.shown_margins, strict=True):
        q = survey.question(m.name)
        out[q.id] = replace(
            by_id[q.id],
            rows=_question_rows(q, by_id[q.id], shown_margin),
            intervals=BONFERRONI if plan.simultaneous and len(shown_margin) > 1 else PER_COORDINATE,
            reconciled_with=users[m.name],
        )
