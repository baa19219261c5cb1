"""From a survey to its tasks: one task per question and per breakdown, every
task under the survey's total budget (`veil survey deploy`, `veil demo`,
`veil survey plan`)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from veil.survey.model import Question, Survey
from veil.task import DpSpec, VdafSpec

TaskSpec = tuple[VdafSpec, DpSpec, dict[str, Any]]


def task_specs(survey: Survey) -> dict[str, TaskSpec]:
    """One task per question and per breakdown (`Survey.tasked`), every task under
    the survey's total budget.

    A gaussian question's task names its ρ (never an ε read as ρ); a survey composed
    under zCDP counts ρ on its ledger, and its pure questions' ε as ε²/2 there.
    """
    return {q.id: question_task(survey, q) for q in survey.tasked}


def question_task(survey: Survey, q: Question) -> TaskSpec:
    """The task of one question of `survey` (see `task_specs`)."""
    # A text question's task is Poplar1 over 8·max_bytes bits; its [dp] table holds the
    # question's whole budget, which the aggregators spend evenly over its byte levels.
    vdaf = VdafSpec(q.vdaf_type, **q.vdaf_params)
    local: dict[str, Any] = {}
    if q.local_epsilon is not None:
        local["local_epsilon"] = str(q.local_epsilon)
        if q.kind == "multi_choice":
            local["local_max_choices"] = q.max_choices
    if survey.mechanism == "none" or survey.total is None:
        dp = DpSpec(mechanism="none", **local)
    else:
        gaussian = q.mechanism == "gaussian"
        amount = q.rho if gaussian else q.epsilon
        assert amount is not None
        dp = DpSpec(
            mechanism=q.mechanism,
            epsilon=None if gaussian else str(amount),
            rho=str(amount) if gaussian else None,
            delta=str(survey.delta) if gaussian and survey.delta is not None else None,
            budget=str(amount),
            survey=survey.id,
            survey_budget=str(survey.total),
            survey_unit="rho" if survey.zcdp else "epsilon",
            neighbouring=survey.neighbouring,
            **local,
        )
    return (vdaf, dp, {"min_batch_size": survey.min_batch_size})


def charged(
    dp: DpSpec, vdaf: VdafSpec, collections: int, zcdp_survey: bool
) -> tuple[Fraction, Fraction]:
    """What `collections` collections of a question's task (a text question: levels)
    charge its ledgers: (in the task's own unit, in the survey's unit). A survey
    composed under zCDP counts a pure question's collection of ε as ρ = ε²/2 (as its
    ledgers do, veil.dp.budget), not as ε."""
    charge = dp.charge(vdaf) or Fraction(0)
    own = charge * collections
    if zcdp_survey and dp.unit == "epsilon":
        return own, charge * charge / 2 * collections
    return own, own


def question_charged(survey: Survey, q: Question, collections: int) -> tuple[Fraction, Fraction]:
    """`charged` for question `q` of `survey`."""
    vdaf, dp, _ = question_task(survey, q)
    return charged(dp, vdaf, collections, survey.zcdp)
