"""The privacy budget ledger: durable, exact, and atomic.

Accounting (per report, since neighbouring datasets differ in one report):

- Within a task, a report lies in every batch interval that contains its time. Its
  privacy loss is the sum of the amounts spent on collections whose batch contains
  it (sequential composition); collections of disjoint batches touch disjoint
  reports and so compose in parallel. A task's loss is therefore the *peak* over
  time of the amounts stacked on each instant, and a spend fits if that peak stays
  within the task's total.
- A survey is several tasks over the same respondents. One respondent's reports
  may fall in any batch of each task, so the survey's loss is the sum over its tasks
  of each task's peak (sequential composition across tasks), which must stay within
  the survey's total.

Amounts are ε (pure DP) or ρ (zCDP, which also composes by addition). A survey counts
ε when all its tasks do; a survey that mixes pure and zCDP tasks counts ρ, and each
pure collection of ε costs it ε²/2 (ε-DP implies ε²/2-zCDP, Bun and Steinke 2016,
Proposition 1.4), while the task's own budget stays in ε. All amounts are exact
Fractions, stored as text, never floats.

A spend is one transaction of a LedgerStore, which locks the task's and the
survey's budget rows as it reads them, so two concurrent collections can never
both pass when only one fits. A collection id that was already charged is not
charged again: a retried request gets the same answer.

This module is the ledger's rules only, with no I/O: the stores (SQLite and
PostgreSQL) are veil.aggregator.store.ledger's and veil.aggregator.store.postgres's.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

from veil.dp.errors import BudgetExceeded, InvalidParameter, UnknownTask
from veil.dp.mechanisms import MAX_EPSILON, MAX_RHO, Mechanism, NoisePlan, parse_budget

__all__ = [
    "Batch",
    "BudgetLedger",
    "BudgetUnit",
    "LedgerStore",
    "LedgerTransaction",
    "Spend",
    "SurveyBudget",
    "TaskBudget",
]

# Batch bounds are integers (DAP time in seconds, or any other public index); this
# range stands for "every report of the task".
_EVERYTHING = (-(1 << 62), 1 << 62)


class BudgetUnit(enum.StrEnum):
    """What a budget counts: ε for pure DP, ρ for zCDP (the gaussian mechanism)."""

    EPSILON = "epsilon"
    RHO = "rho"

    @property
    def maximum(self) -> Fraction:
        """The largest total or spend accepted in this unit."""
        return MAX_EPSILON if self is BudgetUnit.EPSILON else MAX_RHO


@dataclass(frozen=True)
class Batch:
    """The reports of a task with start <= time < end (a DAP batch interval)."""

    start: int
    end: int

    def __post_init__(self) -> None:
        for bound in (self.start, self.end):
            if isinstance(bound, bool) or not isinstance(bound, int):
                raise InvalidParameter(f"batch bounds must be ints, got {bound!r}")
        if not _EVERYTHING[0] <= self.start < self.end <= _EVERYTHING[1]:
            raise InvalidParameter(
                f"a batch needs start < end within ±2**62, got [{self.start}, {self.end})"
            )

    @classmethod
    def everything(cls) -> Batch:
        """Every report of the task (a collection without a time interval)."""
        return cls(*_EVERYTHING)

    def overlaps(self, other: Batch) -> bool:
        """Whether some report could lie in both batches."""
        return self.start < other.end and other.start < self.end


@dataclass(frozen=True)
class SurveyBudget:
    """A total budget shared by the tasks of one survey (same respondents)."""

    survey_id: str
    total: Fraction
    unit: BudgetUnit


@dataclass(frozen=True)
class TaskBudget:
    """A task's total budget, and the survey it belongs to, if any."""

    task_id: str
    total: Fraction
    unit: BudgetUnit
    survey_id: str | None = None


@dataclass(frozen=True)
class Spend:
    """One charged collection."""

    collection_id: str
    task_id: str
    amount: Fraction
    batch: Batch


@dataclass(frozen=True)
class BudgetStatus:
    """A task's or survey's budget as operators read it (`veil status`, metrics).

    `spent` is the privacy loss so far: for a task, the largest sum of spends
    whose batches share an instant (disjoint batches compose in parallel);
    for a survey, the sum of its tasks' losses. `remaining` is what one more
    collection over every report could spend.
    """

    total: Fraction
    spent: Fraction
    remaining: Fraction
    unit: BudgetUnit
    collections: int


class LedgerTransaction(Protocol):
    """Reads and writes inside one exclusive transaction of a LedgerStore."""

    def survey(self, survey_id: str) -> SurveyBudget | None:
        """The survey's budget (its row locked until the transaction ends), or None."""
        ...

    def task(self, task_id: str) -> TaskBudget | None:
        """The task's budget (its row locked until the transaction ends), or None."""
        ...

    def survey_tasks(self, survey_id: str) -> Sequence[TaskBudget]:
        """The budgets of the survey's tasks."""
        ...

    def spends(self, task_id: str) -> Sequence[Spend]:
        """Every spend charged to the task so far."""
        ...

    def spend(self, collection_id: str) -> Spend | None:
        """The spend of one collection, or None."""
        ...

    def add_survey(self, survey: SurveyBudget) -> bool:
        """Record a survey's budget; False (nothing written) if its id is taken."""
        ...

    def add_task(self, task: TaskBudget) -> bool:
        """Record a task's budget; False (nothing written) if its id is taken."""
        ...

    def add_spend(self, spend: Spend) -> None:
        """Record a spend (a collection's ε or ρ)."""
        ...


class LedgerStore(Protocol):
    """Durable storage for the ledger.

    `transaction()` must serialise every two transactions that read the same task
    or survey row, each seeing what the other committed (SQLite: BEGIN IMMEDIATE;
    PostgreSQL: SELECT ... FOR UPDATE of those rows at READ COMMITTED), commit on
    normal exit and roll back on an exception.
    """

    def transaction(self) -> AbstractContextManager[LedgerTransaction]:
        """One exclusive transaction (see the class docstring)."""
        ...


class BudgetLedger:
    """Per-task and per-survey privacy budgets; refuses any spend that would overspend.

    Every method runs in one transaction of the store; a refused or invalid request
    changes nothing.
    """

    def __init__(self, store: LedgerStore) -> None:
        self._store = store

    def add_survey(
        self, survey_id: str, total: Fraction | int | str, unit: BudgetUnit = BudgetUnit.EPSILON
    ) -> SurveyBudget:
        """Register a survey's total budget (idempotent for identical arguments)."""
        survey = SurveyBudget(_check_id(survey_id, "survey id"), _amount(total, unit), unit)
        with self._store.transaction() as tx:
            existing = None if tx.add_survey(survey) else tx.survey(survey_id)
            if existing is not None and existing != survey:
                raise InvalidParameter(
                    f"survey {survey_id!r} is already registered with total "
                    f"{existing.total} {existing.unit}; budgets are immutable"
                )
        return survey

    def add_task(
        self,
        task_id: str,
        total: Fraction | int | str,
        unit: BudgetUnit = BudgetUnit.EPSILON,
        survey_id: str | None = None,
    ) -> TaskBudget:
        """Register a task's total budget, optionally inside a survey (idempotent)."""
        task = TaskBudget(_check_id(task_id, "task id"), _amount(total, unit), unit, survey_id)
        with self._store.transaction() as tx:
            if survey_id is not None:
                survey = tx.survey(survey_id)
                if survey is None:
                    raise UnknownTask(f"unknown survey {survey_id!r}; add it before its tasks")
                if survey.unit is BudgetUnit.EPSILON and unit is BudgetUnit.RHO:
                    raise InvalidParameter(
                        f"task {task_id!r} counts rho but survey {survey_id!r} counts "
                        "epsilon; a survey with a zCDP task must be composed under zCDP "
                        "(register it with unit rho)"
                    )
            existing = None if tx.add_task(task) else tx.task(task_id)
            if existing is not None and existing != task:
                raise InvalidParameter(
                    f"task {task_id!r} is already registered with total {existing.total} "
                    f"{existing.unit} (survey {existing.survey_id!r}); budgets are immutable"
                )
        return task

    def remaining(self, task_id: str, batch: Batch | None = None) -> Fraction:
        """The largest amount a collection of `batch` (default: all) could still spend."""
        with self._store.transaction() as tx:
            task = _known_task(tx, task_id)
            return _remaining(tx, task, batch or Batch.everything())[0]

    def task_status(self, task_id: str) -> BudgetStatus:
        """Total, spent and remaining budget of a registered task."""
        with self._store.transaction() as tx:
            task = _known_task(tx, task_id)
            spends = tx.spends(task_id)
            remaining = _remaining(tx, task, Batch.everything())[0]
            return BudgetStatus(
                task.total, _peak(spends, Batch.everything()), remaining, task.unit, len(spends)
            )

    def survey_status(self, survey_id: str) -> BudgetStatus:
        """Total, spent (sum of its tasks' losses) and remaining budget of a survey."""
        with self._store.transaction() as tx:
            survey = tx.survey(survey_id)
            if survey is None:
                raise UnknownTask(f"no privacy budget is registered for survey {survey_id!r}")
            spent = Fraction(0)
            collections = 0
            for t in tx.survey_tasks(survey_id):
                spends = tx.spends(t.task_id)
                spent += _peak(spends, Batch.everything(), _converter(t.unit, survey.unit))
                collections += len(spends)
            remaining = max(survey.total - spent, Fraction(0))
            return BudgetStatus(survey.total, spent, remaining, survey.unit, collections)

    def recorded(self, collection_id: str) -> Spend | None:
        """The spend recorded for `collection_id`, if it was charged."""
        with self._store.transaction() as tx:
            return tx.spend(collection_id)

    def spend(
        self,
        task_id: str,
        amount: Fraction | int | str,
        batch: Batch | None = None,
        collection_id: str | None = None,
    ) -> Spend:
        """Charge `amount` for collecting `batch` of a task, or raise BudgetExceeded.

        `collection_id` (default: a fresh id) makes the call idempotent: charging the
        same collection again returns the recorded spend without charging twice.
        """
        batch = batch or Batch.everything()
        with self._store.transaction() as tx:
            task = _known_task(tx, task_id)
            asked = _amount(amount, task.unit)
            if collection_id is None:
                collection_id = os.urandom(16).hex()
            _check_id(collection_id, "collection id")
            wanted = Spend(collection_id, task_id, asked, batch)
            previous = tx.spend(collection_id)
            if previous is not None:
                if previous != wanted:
                    raise InvalidParameter(
                        f"collection {collection_id!r} was already charged as {previous}; "
                        "a retry must repeat the same task, amount and batch"
                    )
                return previous
            remaining, why = _remaining(tx, task, batch)
            if not _fits(tx, task, batch, asked):
                raise BudgetExceeded(asked, remaining, why)
            tx.add_spend(wanted)
            return wanted

    def charge(
        self,
        task_id: str,
        plan: NoisePlan,
        batch: Batch | None = None,
        collection_id: str | None = None,
    ) -> Spend | None:
        """Spend what one collection under `plan` costs (`NoisePlan.charge`).

        That is the weaker of the two guarantees the collection gives: ε against the
        collector with one aggregator (more than ε in split mode), or ρ for the
        gaussian mechanism. Mechanism none costs nothing on the ledger (it promises
        no privacy at all, which draw_noise logs); None is returned, nothing recorded.
        """
        config = plan.config
        if config.mechanism is Mechanism.NONE:
            return None
        amount = plan.charge
        unit = BudgetUnit.RHO if config.mechanism is Mechanism.GAUSSIAN else BudgetUnit.EPSILON
        assert amount is not None  # DPConfig validation guarantees it
        with self._store.transaction() as tx:
            task = _known_task(tx, task_id)
        if task.unit is not unit:
            raise InvalidParameter(
                f"task {task_id!r} budgets {task.unit} but mechanism {config.mechanism} "
                f"spends {unit}"
            )
        return self.spend(task_id, amount, batch, collection_id)


def _check_id(value: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidParameter(f"{what} must be a non-empty string, got {value!r}")
    return value


def _amount(value: Fraction | int | str, unit: BudgetUnit) -> Fraction:
    return parse_budget(value, unit.value, unit.maximum)


def _known_task(tx: LedgerTransaction, task_id: str) -> TaskBudget:
    task = tx.task(task_id)
    if task is None:
        raise UnknownTask(f"no privacy budget is registered for task {task_id!r}")
    return task


Convert = Callable[[Fraction], Fraction]


def _same(amount: Fraction) -> Fraction:
    return amount


def _to_rho(amount: Fraction) -> Fraction:
    return amount * amount / 2


def _converter(task_unit: BudgetUnit, survey_unit: BudgetUnit) -> Convert:
    """How a task's spend counts in its survey: as is, or ε as ε²/2-zCDP."""
    if task_unit is BudgetUnit.EPSILON and survey_unit is BudgetUnit.RHO:
        return _to_rho
    return _same


def _sqrt_down(x: Fraction) -> Fraction:
    """The largest multiple of 10**-12 whose square is at most x (x >= 0)."""
    scale = 10**12
    return Fraction(math.isqrt(x.numerator * scale * scale // x.denominator), scale)


def _peak(spends: Sequence[Spend], within: Batch, convert: Convert = _same) -> Fraction:
    """max over instants in `within` of the (converted) amounts of spends holding it."""
    relevant = [s for s in spends if s.batch.overlaps(within)]
    # The stacked amount only changes where a batch starts, so those points (and the
    # window's own start) are the only candidates for the maximum.
    points = {within.start} | {s.batch.start for s in relevant if s.batch.start > within.start}
    return max(
        (
            sum(
                (convert(s.amount) for s in relevant if s.batch.start <= p < s.batch.end),
                Fraction(0),
            )
            for p in points
        ),
        default=Fraction(0),
    )


def _survey_room(
    tx: LedgerTransaction, task: TaskBudget, batch: Batch
) -> tuple[SurveyBudget, Fraction, Fraction, Convert] | None:
    """(survey, its room for this batch in survey units, others' loss, converter)."""
    if task.survey_id is None:
        return None
    survey = tx.survey(task.survey_id)
    assert survey is not None  # add_task checked it; surveys are never removed
    others = sum(
        (
            _peak(tx.spends(t.task_id), Batch.everything(), _converter(t.unit, survey.unit))
            for t in tx.survey_tasks(survey.survey_id)
            if t.task_id != task.task_id
        ),
        Fraction(0),
    )
    convert = _converter(task.unit, survey.unit)
    spends = tx.spends(task.task_id)
    # The survey's loss is the sum of the tasks' peaks. This task's peak becomes
    # max(own_peak, stacked + x): x fits if that stays within total - others.
    own_peak = _peak(spends, Batch.everything(), convert)
    stacked = _peak(spends, batch, convert)
    room = max(survey.total - others, own_peak) - stacked
    return survey, room, others, convert


def _fits(tx: LedgerTransaction, task: TaskBudget, batch: Batch, asked: Fraction) -> bool:
    """Whether a spend of `asked` (task units) on `batch` fits the task and its survey."""
    if _peak(tx.spends(task.task_id), batch) + asked > task.total:
        return False
    room = _survey_room(tx, task, batch)
    return room is None or room[3](asked) <= room[1]


def _remaining(tx: LedgerTransaction, task: TaskBudget, batch: Batch) -> tuple[Fraction, str]:
    """What a spend on `batch` may still take (task units), and which budget binds."""
    spends = tx.spends(task.task_id)
    stacked = _peak(spends, batch)
    remaining = task.total - stacked
    why = (
        f"task {task.task_id!r} has a total of {task.total} {task.unit} and reports in "
        f"batch [{batch.start}, {batch.end}) have already spent {stacked}"
    )
    found = _survey_room(tx, task, batch)
    if found is not None:
        survey, room, others, convert = found
        room = max(room, Fraction(0))
        # Back in task units: a pure task in a zCDP survey may spend ε with ε²/2 <= room.
        survey_remaining = _sqrt_down(2 * room) if convert is _to_rho else room
        if survey_remaining < remaining:
            remaining = survey_remaining
            why = (
                f"survey {survey.survey_id!r} has a total of {survey.total} {survey.unit}; "
                f"its other tasks have spent {others} and this batch "
                f"{_peak(spends, batch, convert)}"
            )
    return max(remaining, Fraction(0)), why
