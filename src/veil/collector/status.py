"""What `veil survey status` tells the survey operator (the collector).

Built from the survey's own files and the leader's GetTaskInfo answer for each
question, nothing else. Under add_remove neighbouring the leader withholds the
report counts (docs/OBSERVATIONS.md): the status then shows the window, when
the survey can be collected, the collections done and the budget spent, none
of which depends on how many reports arrived.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from veil.survey import Survey
from veil.survey.statement import survey_statement
from veil.survey.tasks import charged
from veil.task import CollectorTask
from veil.times import format_duration, format_time

__all__ = ["QuestionInfo", "render_text", "survey_status"]


@dataclass(frozen=True)
class QuestionInfo:
    """The leader's GetTaskInfo answer for one question (leader.proto)."""

    reports: int
    rejected: int
    collections_finished: int
    counts_withheld: bool


def fraction_text(x: Fraction) -> str:
    """A fraction as people read it: 1/3, 2, or 0.0417 when the denominator is large."""
    return str(x) if x.denominator <= 12 else f"{float(x):.3g}"


def survey_status(
    survey: Survey,
    tasks: Mapping[str, CollectorTask],
    infos: Mapping[str, QuestionInfo],
    now: float,
    collecting: Mapping[str, str] | None = None,
    collected: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The status as JSON-ready values (`veil survey status --json`).

    `collecting`: the questions whose collection job is pending at the leader,
    each with what it waits for ("retrying: <the leader's reason>"). `collected`:
    the report count each collected question's results give (`veil survey
    collect`'s results.json), shown for a collected question instead of the
    leader's count of the reports it still holds (it deletes them once collected:
    "reports 0"); a collected question without either shows None ("collected")."""
    collecting = collecting or {}
    collected = collected or {}
    assert survey.opens is not None and survey.closes is not None
    questions: list[dict[str, Any]] = []
    spent_total = Fraction(0)
    for q in survey.tasked:
        task, info = tasks[q.id], infos[q.id]
        own, counted = charged(task.dp, task.vdaf, info.collections_finished, survey.zcdp)
        spent_total += counted
        withheld = info.counts_withheld or task.dp.counts_protected
        reports: int | None = info.reports
        if info.collections_finished and (q.id in collected or not info.reports):
            reports = collected.get(q.id)
        questions.append(
            {
                "id": q.id,
                "counts_withheld": withheld,
                "reports": None if withheld else reports,
                "rejected": None if withheld else info.rejected,
                "collections": info.collections_finished,
                # `spent` is in the survey's unit; `spent_in_own_unit` in `own_unit`.
                "spent": str(counted),
                "spent_unit": "rho" if survey.zcdp else "epsilon",
                "spent_in_own_unit": str(own),
                "own_unit": task.dp.unit,
                "collecting": collecting.get(q.id) if info.collections_finished == 0 else None,
            }
        )
    if now < survey.opens:
        state = "not_open"
    elif now < survey.closes:
        state = "open"
    elif all(q["collections"] > 0 for q in questions):
        state = "collected"
    elif any(q["collecting"] for q in questions):
        state = "collecting"
    else:
        state = "ready"
    total = survey.total if survey.total is not None else Fraction(0)
    return {
        "survey": survey.name,
        "opens": format_time(survey.opens),
        "closes": format_time(survey.closes),
        "state": state,
        "collect_after": format_time(survey.closes),
        "unit": "rho" if survey.zcdp else "epsilon",
        "questions": questions,
        "spent": str(spent_total),
        "total": str(total),
        # What the survey promises, and to whom (covers, released_exactly, ...).
        "privacy": survey_statement(survey, _token_checkers(tasks)).to_json(),
    }


def _token_checkers(tasks: Mapping[str, CollectorTask]) -> tuple[str, ...]:
    """The aggregator roles that check invitation tokens: veil's (both, unless
    another DAP implementation runs one)."""
    roles = {r for t in tasks.values() for r in t.noise_added_by}
    return tuple(r for r in ("leader", "helper") if r in roles)


def render_text(status: Mapping[str, Any], now: float, opens: int, closes: int) -> str:
    """The status as `veil survey status` prints it."""
    state = status["state"]
    if state == "not_open":
        when = (
            f"opens in {format_duration(opens - now)}; ready to collect after"
            f" {status['collect_after']}"
        )
    elif state == "open":
        when = (
            f"open, closes in {format_duration(closes - now)}; ready to collect after"
            f" {status['collect_after']}"
        )
    elif state == "collected":
        when = "closed: collected"
    elif state == "collecting":
        waits = [f"{q['id']}: {q['collecting']}" for q in status["questions"] if q["collecting"]]
        when = "closed: collecting (veil survey collect); " + "; ".join(waits)
    else:
        when = "closed: ready to collect (veil survey collect)"
    symbol = "ρ" if status["unit"] == "rho" else "ε"
    out = [
        f"{status['survey']}: {status['opens']} to {status['closes']}; {when}",
        f"  {'question':<20} {'reports':>8} {'rejected':>9} {'collections':>12}"
        f" {'budget spent':>14}",
    ]
    converted = False
    for q in status["questions"]:
        if q["counts_withheld"]:
            reports = "withheld"
        else:
            reports = "collected" if q["reports"] is None else str(q["reports"])
        rejected = "withheld" if q["counts_withheld"] else str(q["rejected"])
        spent = f"{symbol} {fraction_text(Fraction(q['spent']))}"
        if status["unit"] == "rho" and q["own_unit"] == "epsilon":
            converted = True
            spent += f" (ε {fraction_text(Fraction(q['spent_in_own_unit']))})"
        out.append(f"  {q['id']:<20} {reports:>8} {rejected:>9} {q['collections']:>12} {spent:>14}")
    if any(q["counts_withheld"] for q in status["questions"]):
        out.append(
            "  reports withheld: under add_remove neighbouring the number of reports is"
            " protected, so the leader tells the collector neither it nor when reports arrive"
        )
    out.append(
        f"  budget spent over the survey: {symbol} {fraction_text(Fraction(status['spent']))}"
        f" of {fraction_text(Fraction(status['total']))}"
    )
    if converted:
        out.append("  (the survey is composed under zCDP: a pure question's ε counts as ρ = ε²/2)")
    return "\n".join(out)
