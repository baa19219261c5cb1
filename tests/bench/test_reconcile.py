"""The reconciliation study (bench.reconcile) on a few points: the raw, reconciled
and shown intervals cover at their level up to sampling error, and the reconciled
variance, exact and measured, is below the smaller raw one. The quick version of
scripts/study_reconcile.py (docs/reports/ACCURACY.md)."""

from __future__ import annotations

import random

import pytest

from bench.reconcile import BUDGETS, CONFIGS, JOINT_CONFIGS, binomial_below, joint_study, study
from tests.support.modes import LONG

RUNS = 2000 if LONG else 300
# A categorical breakdown and a numeric one (the long mode: every kind).
KINDS = (
    CONFIGS if LONG else [c for c in CONFIGS if c.name in ("choice by choice", "integer by choice")]
)


@pytest.mark.parametrize("config", KINDS, ids=lambda c: c.name)
@pytest.mark.parametrize("budget", BUDGETS, ids=["pure", "zcdp"])
def test_reconciled_intervals_cover_and_gain(config, budget) -> None:  # type: ignore[no-untyped-def]
    name, dp = budget
    point = study(config, dp, name, 30, RUNS, random.Random(f"reconcile-{config.name}-{name}"))
    # Every interval at its level up to sampling error: the lowest coordinate's
    # one-sided binomial p-value, times the coordinates (Bonferroni).
    assert point.p_low > 1e-3, point
    assert point.raw_cover >= 0.9 and point.width_ratio < 1
    assert point.exact_ratio < 1
    # Measured over the runs (paired with the raw estimators on the same noise).
    assert point.measured_ratio < 1, point


# Breakdowns reconciled together: the one tied both ways (a question by two
# groups, one of them another breakdown's group) in the quick mode.
JOINT = [
    (c, b)
    for c in JOINT_CONFIGS
    for b in BUDGETS
    if LONG or (c.name == "three tied both ways" and b is BUDGETS[0])
]


@pytest.mark.parametrize(("config", "budget"), JOINT, ids=lambda x: getattr(x, "name", None))
def test_jointly_reconciled_intervals_cover_and_gain(config, budget) -> None:  # type: ignore[no-untyped-def]
    name, dp = budget
    point = joint_study(config, dp, name, 30, RUNS, random.Random(f"joint-{config.name}-{name}"))
    assert point.p_low > 1e-3, point
    assert point.raw_cover >= 0.9 and point.width_ratio < 1
    assert point.exact_ratio < 1
    assert point.measured_ratio < 1, point


def test_binomial_below_is_the_binomial_tail() -> None:
    assert binomial_below(10, 10, 0.95) == pytest.approx(1.0)
    assert binomial_below(0, 10, 0.5) == pytest.approx(0.5**10)
    assert binomial_below(940, 1000, 0.95) == pytest.approx(0.0875, abs=5e-3)
