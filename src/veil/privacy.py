"""The privacy statement of a task or a survey: what is protected, from whom, how much.

`privacy_statement(task_or_survey)` gives a `veil.dp.accounting.PrivacyStatement`
(JSON with `to_json()`, plain words with `lines()`), which `veil task new`,
`veil survey deploy`, `veil status` and survey reports show.

How the numbers follow from what the ledgers enforce:

- A task's ledgers charge each collection the weaker of its two guarantees
  (`NoisePlan.charge`: ε against the collector with one aggregator, which is more
  than ε in split mode; ρ for the gaussian mechanism), and never let the charges on
  any one report exceed the task's budget B. So against the collector with one
  aggregator the task is B-DP (or B-zCDP); against the collector alone, where a
  collection costs only ε, it is B · ε / charge.
- A survey's ledgers bound the sum of its tasks' losses by its total S (ρ when it is
  composed under zCDP, with ε²/2 for a pure task), so S holds against both; against
  the collector alone the sum of the tasks' collector guarantees may be smaller.
"""

from __future__ import annotations

from fractions import Fraction

from veil.dp.accounting import (
    DEFAULT_DELTA,
    Guarantee,
    Neighbouring,
    PrivacyStatement,
)
from veil.survey import Survey
from veil.task import DpSpec, Task, VdafSpec

__all__ = ["privacy_statement", "survey_statement", "task_statement"]

TASK_UNIT = "one report"
SURVEY_UNIT = "one respondent, who submits one report per question"

_SPLIT_NOTE = (
    "Split mode: each aggregator adds only part of the noise, so the collector with one "
    "aggregator learns more than the collector alone; the ledgers charge that weaker "
    "guarantee."
)


def _guarantee(amount: Fraction, zcdp: bool, delta: Fraction) -> Guarantee:
    return Guarantee.zcdp(amount, delta) if zcdp else Guarantee.pure(amount)


def _neighbouring(dp: DpSpec) -> Neighbouring:
    return Neighbouring(dp.neighbouring)


def _task_totals(dp: DpSpec, vdaf: VdafSpec) -> tuple[Fraction, Fraction] | None:
    """(against the collector, against the collector with one aggregator) in task units."""
    plan = dp.plan(vdaf)
    charge = plan.charge
    total = dp.total(vdaf)
    if charge is None or total is None:
        return None
    per_collection = plan.config.rho if plan.config.rho is not None else plan.epsilon
    assert per_collection is not None
    return total * per_collection / charge, total


def task_statement(dp: DpSpec, vdaf: VdafSpec) -> PrivacyStatement:
    """The statement of one task over its whole budget."""
    totals = _task_totals(dp, vdaf)
    if totals is None:
        nothing = Guarantee.no_privacy()
        return PrivacyStatement(TASK_UNIT, _neighbouring(dp), nothing, nothing)
    zcdp = dp.unit == "rho"
    collector, one_aggregator = totals
    plan = dp.plan(vdaf)
    notes = (_SPLIT_NOTE,) if plan.config.mode.value == "split" else ()
    return PrivacyStatement(
        TASK_UNIT,
        _neighbouring(dp),
        _guarantee(collector, zcdp, dp.delta_value),
        _guarantee(one_aggregator, zcdp, dp.delta_value),
        notes=notes,
    )


def survey_statement(survey: Survey) -> PrivacyStatement:
    """The statement of a survey over its total budget (every question composed)."""
    total = survey.total
    neighbouring = Neighbouring.REPLACE_ONE
    if total is None:
        nothing = Guarantee.no_privacy()
        return PrivacyStatement(SURVEY_UNIT, neighbouring, nothing, nothing)
    delta = survey.delta or DEFAULT_DELTA
    # Surveys use independent noise, so both guarantees are the survey total.
    guarantee = _guarantee(total, survey.zcdp, delta)
    notes = []
    if survey.zcdp and any(q.mechanism != "gaussian" for q in survey.questions):
        notes.append(
            "The survey mixes pure ε-DP and zCDP questions and is composed under zCDP: "
            "a pure question of ε counts as ρ = ε²/2."
        )
    return PrivacyStatement(SURVEY_UNIT, neighbouring, guarantee, guarantee, notes=tuple(notes))


def privacy_statement(subject: Task | Survey) -> PrivacyStatement:
    """The statement of a task (over its budget) or a survey (over its total)."""
    if isinstance(subject, Survey):
        return survey_statement(subject)
    return task_statement(subject.dp, subject.vdaf)
