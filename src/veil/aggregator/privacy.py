"""The DP step of an aggregator: budget and noise on its aggregate share.

Each aggregator calls `release` once per collected batch, before sealing its
share to the collector; the caller stores the result and serves the same
bytes on every retry, so noise is never re-sampled.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from veil.aggregator.errors import BudgetExhausted, InvalidMessage
from veil.task import Task
from veil.vdaf import Prio3


class PrivacyEngine:
    """Budget ledger and noise for one aggregator."""

    def __init__(self, ledger_path: str) -> None:
        self.ledger_path = ledger_path

    def check(self, task: Task) -> None:
        """Raise BudgetExhausted if one more collection of `task` would exceed its budget."""
        if task.dp.mechanism == "none":
            return
        raise InvalidMessage(f"DP mechanism {task.dp.mechanism!r} needs veil.dp, not available")

    def release(
        self, task: Task, vdaf: Prio3[Any, Any], collection_id: bytes, agg_share: list[int]
    ) -> tuple[list[int], Fraction]:
        """Spend the budget for `collection_id` and return (noised share, ε spent)."""
        if task.dp.mechanism == "none":
            return agg_share, Fraction(0)
        raise BudgetExhausted("unreachable without veil.dp")
