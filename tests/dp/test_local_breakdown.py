"""A breakdown of randomized answers (veil.dp.local.breakdown_estimate): the
de-biasing is exact in expectation, and the stated intervals cover every cell at
once over real randomized response and real noise."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from veil.dp.errors import InvalidParameter
from veil.dp.local import KaryResponse, breakdown_estimate
from veil.task import DpSpec, VdafSpec

GROUPS, CATEGORIES = 3, 2
PLAN = DpSpec(mechanism="geometric", epsilon="1/2").plan(
    VdafSpec("histogram", length=GROUPS * CATEGORIES, chunk_length=2)
)


def expected_cells(
    truth: list[int], g: KaryResponse | None, q: KaryResponse | None
) -> list[Fraction]:
    """E[Y] = (A_G ⊗ A_Q)·X, exactly."""

    def a(ch: KaryResponse | None, k: int) -> list[list[Fraction]]:
        if ch is None:
            return [[Fraction(int(i == j)) for j in range(k)] for i in range(k)]
        return [[Fraction(x) for x in row] for row in ch.transition()]

    ag, aq = a(g, GROUPS), a(q, CATEGORIES)
    out = []
    for g2 in range(GROUPS):
        for c2 in range(CATEGORIES):
            out.append(
                sum(
                    (aq[c][c2] * ag[g1][g2] * truth[g1 * CATEGORIES + c]
                     for g1 in range(GROUPS) for c in range(CATEGORIES)),
                    Fraction(0),
                )
            )  # fmt: skip
    return out


@pytest.mark.parametrize("which", ["group", "answer", "both"])
def test_the_debiasing_is_exact_in_expectation(which: str) -> None:
    truth = [40, 3, 0, 17, 25, 15]
    g = KaryResponse(GROUPS, 1) if which in ("group", "both") else None
    q = KaryResponse(CATEGORIES, Fraction(3, 2)) if which in ("answer", "both") else None
    mean = expected_cells(truth, g, q)
    cells = breakdown_estimate(mean, sum(truth), (GROUPS, CATEGORIES), (g, q), PLAN)  # type: ignore[arg-type]
    assert [e.value for e in cells] == truth


def test_the_intervals_cover_every_cell_at_once() -> None:
    rng = random.Random(7)
    g, q = KaryResponse(GROUPS, 1), KaryResponse(CATEGORIES, 1)
    noise = PLAN.server_noise()
    assert noise is not None
    truth_answers = [(rng.choice([0, 0, 1, 2]), int(rng.random() < 0.3)) for _ in range(200)]
    truth = [0] * (GROUPS * CATEGORIES)
    for grp, ans in truth_answers:
        truth[grp * CATEGORIES + ans] += 1
    covered = 0
    trials = 200
    errors = [Fraction(0)] * len(truth)
    for _ in range(trials):
        y = [0] * len(truth)
        for grp, ans in truth_answers:
            y[g.sample_index(grp, rng) * CATEGORIES + q.sample_index(ans, rng)] += 1
        y = [v + noise.sample(rng) + noise.sample(rng) for v in y]
        cells = breakdown_estimate(y, len(truth_answers), (GROUPS, CATEGORIES), (g, q), PLAN)
        covered += all(e.low <= t <= e.high for e, t in zip(cells, truth, strict=True))
        errors = [s + e.value - t for s, e, t in zip(errors, cells, truth, strict=True)]
    assert covered == trials  # a stated bound, conservative: every run covers
    # Unbiased: the mean error is within a few standard errors of 0.
    assert all(abs(float(s) / trials) < 8 for s in errors), [float(s) / trials for s in errors]


def test_hostile_shapes_are_refused() -> None:
    g = KaryResponse(GROUPS, 1)
    with pytest.raises(InvalidParameter, match="5 cells, not 3 x 2"):
        breakdown_estimate([0] * 5, 10, (GROUPS, CATEGORIES), (g, None), PLAN)
    with pytest.raises(InvalidParameter, match="a channel over 3 options for 2 cells"):
        breakdown_estimate([0] * 6, 10, (GROUPS, CATEGORIES), (None, g), PLAN)
    with pytest.raises(InvalidParameter, match="alpha"):
        breakdown_estimate([0] * 6, 10, (GROUPS, CATEGORIES), (g, None), PLAN, alpha=1.5)
