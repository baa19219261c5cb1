"""The DP step of an aggregator: budget and noise on its aggregate share (veil.dp).

Each aggregator calls `release` once per collected batch, before sealing its
share to the collector; the caller stores the result and serves the same
bytes on every retry, so released noise is never re-sampled. The spend is
keyed by the collection job id, so a retry after a crash between the spend
and the store is not charged twice (and the first draw, never released, is
simply discarded).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

from veil.aggregator.errors import BudgetExhausted, InvalidMessage
from veil.dp import Batch, BudgetExceeded, BudgetLedger, BudgetUnit, DPError, add_noise
from veil.metrics import Metrics
from veil.task import Task
from veil.vdaf import Prio3

log = logging.getLogger(__name__)


def _unit(task: Task) -> BudgetUnit:
    return BudgetUnit.RHO if task.dp.mechanism == "gaussian" else BudgetUnit.EPSILON


class PrivacyEngine:
    """Budget ledger (in the aggregator's own SQLite file) and noise."""

    def __init__(self, ledger_path: str, tasks: Iterable[Task]) -> None:
        self.ledger = BudgetLedger.sqlite(ledger_path)
        for task in tasks:
            amount = task.dp.amount
            if amount is None:
                log.warning(
                    "task %s has DP mechanism none: shares leave without noise", task.id_text
                )
                continue
            unit = _unit(task)
            if task.dp.survey is not None:
                total = task.dp.survey_budget or task.dp.budget or amount
                self.ledger.add_survey(task.dp.survey, total, unit)
            self.ledger.add_task(task.id_text, task.dp.budget or amount, unit, task.dp.survey)

    def report_budget(self, task: Task, metrics: Metrics) -> None:
        """Export what remains of the task's budget (for a whole-task batch)."""
        if task.dp.amount is not None:
            remaining = self.ledger.remaining(task.id_text)
            metrics.budget_remaining.labels(task.id_text).set(float(remaining))

    def check(self, task: Task, start: int, duration: int) -> None:
        """Raise BudgetExhausted if collecting this batch would exceed the budget."""
        amount = task.dp.amount
        if amount is None:
            return
        remaining = self.ledger.remaining(task.id_text, Batch(start, start + duration))
        if amount > remaining:
            raise BudgetExhausted(
                f"privacy budget exhausted: collecting this batch spends {amount} but only"
                f" {remaining} remains for task {task.id_text}"
                + (f" in survey {task.dp.survey}" if task.dp.survey else "")
            )

    def release(
        self,
        task: Task,
        vdaf: Prio3[Any, Any],
        collection_id: bytes,
        start: int,
        duration: int,
        agg_share: list[int],
    ) -> tuple[list[int], Fraction]:
        """Spend the budget for `collection_id` and return (noised share, amount spent)."""
        amount = task.dp.amount
        if amount is None:
            return agg_share, Fraction(0)
        try:
            self.ledger.spend(
                task.id_text, amount, Batch(start, start + duration), collection_id.hex()
            )
        except BudgetExceeded as e:
            raise BudgetExhausted(f"privacy budget exhausted: {e}") from None
        except DPError as e:
            raise InvalidMessage(f"budget ledger refused the spend: {e}") from None
        plan = task.dp.plan(task.vdaf)
        return add_noise(agg_share, vdaf.field.MODULUS, plan), amount
