"""From the noisy aggregate to estimates with confidence intervals (veil.dp)."""

from __future__ import annotations

from fractions import Fraction

from veil.dp import Estimate, estimate
from veil.task import Task


def estimates(task: Task, noisy: list[int], confidence: float) -> tuple[list[Estimate], Fraction]:
    """Per-coordinate estimates at `confidence`, and the ε (or ρ) one collection spends.

    Intervals come from the exact distribution of the total noise, which depends
    on public parameters only. With mechanism none they have zero width.
    """
    plan = task.dp.plan(task.vdaf)
    amount = task.dp.amount or Fraction(0)
    if plan.server_noise() is None:
        exact = [Estimate(Fraction(v), Fraction(v), Fraction(v), confidence, 1.0) for v in noisy]
        return exact, amount
    return estimate(noisy, plan, alpha=1 - confidence), amount
