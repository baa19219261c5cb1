"""From the noisy aggregate to estimates with confidence intervals (veil.dp)."""

from __future__ import annotations

from fractions import Fraction

from veil.dp import Estimate, estimate, local_estimate
from veil.dp.accounting import Guarantee
from veil.task import Task


def collection_guarantee(task: Task) -> Guarantee:
    """What one collection of `task` gives against the collector (ε, or ρ with (ε, δ))."""
    plan = task.dp.plan(task.vdaf)
    if plan.config.rho is not None:
        return Guarantee.zcdp(plan.config.rho, task.dp.delta_value)
    if plan.epsilon is not None:
        return Guarantee.pure(plan.epsilon)
    return Guarantee.no_privacy()


def estimates(
    task: Task, noisy: list[int], confidence: float, report_count: int | None = None
) -> tuple[list[Estimate], Fraction]:
    """Per-coordinate estimates at `confidence`, and what one collection charges.

    The charge is `NoisePlan.charge` (the weaker guarantee, in ε or ρ). Intervals
    come from the exact distribution of the total noise, which depends
    on public parameters only. With mechanism none they have zero width.

    With a local layer (the task's `local_epsilon`) the estimates are de-biased for
    the respondents' randomized response and the intervals cover both it and the
    servers' noise (veil.dp.local_estimate); that needs the batch's public
    `report_count`. Every path that turns a collected aggregate into estimates
    (`Collector`, the survey's collect) goes through here.
    """
    plan = task.dp.plan(task.vdaf)
    amount = plan.charge or Fraction(0)
    channel = task.dp.local(task.vdaf)
    if channel is not None:
        if report_count is None:
            raise ValueError("estimates for a task with local_epsilon need the report count")
        return local_estimate(noisy, report_count, channel, plan, alpha=1 - confidence), amount
    if plan.server_noise() is None:
        exact = [Estimate(Fraction(v), Fraction(v), Fraction(v), confidence, 1.0) for v in noisy]
        return exact, amount
    return estimate(noisy, plan, alpha=1 - confidence), amount
