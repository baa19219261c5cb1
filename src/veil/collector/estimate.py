"""From the noisy aggregate to an estimate with confidence bounds (via veil.dp)."""

from __future__ import annotations

from fractions import Fraction

from veil.task import Task


def estimate(
    task: Task, noisy: list[int], report_count: int, confidence: float
) -> tuple[list[float], list[float], list[float], Fraction]:
    """(estimate, lower, upper, ε spent) per coordinate of the aggregate."""
    if task.dp.mechanism == "none":
        values = [float(v) for v in noisy]
        return values, values, values, Fraction(0)
    raise ValueError(f"DP mechanism {task.dp.mechanism!r} needs veil.dp, not available")
