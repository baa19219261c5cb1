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


PER_COORDINATE = "per-coordinate"
SIMULTANEOUS_EXACT = "simultaneous (exact max-of-k)"
SIMULTANEOUS_BONFERRONI = "simultaneous (Bonferroni)"


def interval_kind(task: Task, coordinates: int, simultaneous: bool) -> str:
    """Which intervals `estimates` gives: each coordinate on its own, or all of a
    question's at once (exact max-of-k for the servers' independent noise;
    Bonferroni with a local layer, whose intervals are not from one pmf)."""
    # Exact release: zero-width intervals, which hold for every coordinate anyway.
    exact = not task.dp.has_noise and task.dp.local_epsilon is None
    if not simultaneous or coordinates <= 1 or exact:
        return PER_COORDINATE
    return SIMULTANEOUS_BONFERRONI if task.dp.local_epsilon is not None else SIMULTANEOUS_EXACT


def estimates(
    task: Task,
    noisy: list[int],
    confidence: float,
    report_count: int | None = None,
    *,
    simultaneous: bool = False,
) -> tuple[list[Estimate], Fraction]:
    """Per-coordinate estimates at `confidence`, and what one collection charges.

    The charge is `NoisePlan.charge` (the weaker guarantee, in ε or ρ). Intervals
    come from the exact distribution of the total noise, which depends
    on public parameters only: the noise the aggregators in
    `task.noise_added_by` draw (one of them when the other is another DAP
    implementation). With mechanism none they have zero width.

    With a local layer (the task's `local_epsilon`) the estimates are de-biased for
    the respondents' randomized response and the intervals cover both it and the
    servers' noise (veil.dp.local_estimate); that needs the batch's public
    `report_count`. Every path that turns a collected aggregate into estimates
    (`Collector`, the survey's collect) goes through here.

    `simultaneous` makes the intervals of all coordinates hold at once with
    probability `confidence` (see `interval_kind`); otherwise each holds on its own.
    """
    plan = task.noise_plan()
    amount = plan.charge or Fraction(0)
    channel = task.dp.local(task.vdaf)
    if channel is not None:
        if report_count is None:
            raise ValueError("estimates for a task with local_epsilon need the report count")
        alpha = 1 - confidence
        if simultaneous and len(noisy) > 1:
            alpha /= len(noisy)  # Bonferroni: valid whatever the dependence
        return local_estimate(noisy, report_count, channel, plan, alpha=alpha), amount
    if plan.server_noise() is None:
        exact = [Estimate(Fraction(v), Fraction(v), Fraction(v), confidence, 1.0) for v in noisy]
        return exact, amount
    return estimate(noisy, plan, alpha=1 - confidence, simultaneous=simultaneous), amount
