"""A breakdown of a randomized multiple choice or number: de-biased over its bits
with each group's count.

A multiple choice randomized on the device (veil.dp.local.MultiOptionResponse)
reports a bit per option, a number (BoundedResponse) its max or 0: one bit. A
reported bit's value (scale·bit: scale 1 for an option, max for a number) expects
a·x + b for the true answer x (`LocalChannel.affine`), so a group's cells expect
a·X + b·N_g: unlike k-ary response (veil.dp.local.breakdown_estimate), undoing
the channel needs N_g, the group's respondents, which no other release of the
same respondents holds. The breakdown's report carries it: its group's row of
bits and a last 1 (veil.survey.model.breakdown_measurement), and
`counted_breakdown_estimate` de-biases each cell with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from veil.dp.errors import InvalidParameter
from veil.dp.estimates import MIN_ALPHA, Estimate, noise_half_width
from veil.dp.local import (
    BoundedResponse,
    KaryResponse,
    MultiOptionResponse,
    _check_int,
    _inverse,
    local_error,
)
from veil.dp.mechanisms import NoisePlan

__all__ = [
    "BitChannel",
    "counted_breakdown_error",
    "counted_breakdown_estimate",
    "counted_half_width",
]

BitChannel = MultiOptionResponse | BoundedResponse


def _counted_terms(
    group: KaryResponse | None, groups: int, question: BitChannel
) -> tuple[Fraction, Fraction, Fraction, Fraction, Fraction]:
    """(dg, og, scale, a, b): the group channel's A⁻¹ entries, the value a reported
    bit stands for, and the question channel's E[value] = a·x + b."""
    dg, og = _inverse(group, groups)
    a, b = question.affine(0)
    return dg, og, Fraction(question.scale), a, b


def counted_breakdown_estimate(
    noised: Sequence[int],
    report_count: int,
    shape: tuple[int, int],
    group: KaryResponse | None,
    question: BitChannel,
    plan: NoisePlan,
    alpha: float = 0.05,
) -> list[Estimate]:
    """De-biased cells of a breakdown of a randomized multiple choice or number,
    every cell's interval at once.

    Such a question's randomized answer is a bit per option (a multiple choice's
    options; a number's one bit, reported as max or 0), whose expectation is
    affine in the true answer with an offset per respondent: E[scale·bit] = a·x + b
    (`LocalChannel.affine`). A group's cells then expect a·X + b·N_g, N_g the
    group's respondents, which only the breakdown's own report can carry: each
    report sets its group's row to its bits and a last 1, the group's count
    (`shape` = (groups, categories); `noised` has groups·(categories + 1)
    coordinates, row by row). With the group question randomized too (k-ary,
    `group`), the rows are first mixed back by A_G⁻¹ (veil.dp.local.
    breakdown_estimate), which needs no count. Then, in each group g,

        X̂_gc = (scale·Z_gc - b·Z_g,count) / a,    Z = A_G⁻¹·Y,

    unbiased (E[Z_gc] = Σ_{i in g} E[bit_ic], E[Z_g,count] = N_g), with
    Var X̂_gc = Σ_i Var(C_i) + Var(noise)·Σ_h A_G⁻¹[g,h]²·(scale² + b²)/a², C_i a
    respondent's term A_G⁻¹[g, h_i]·(scale·bit_ic - b)/a; without a group channel
    that is (scale/a)²·Σ_{i in g} π_ic(1 - π_ic) + Var(noise)·(scale² + b²)/a², π_ic
    = (a·x_ic + b)/scale the chance of a reported bit. The interval is a stated
    bound, as `breakdown_estimate`'s: Hoeffding's inequality over the n reports for
    the randomization at alpha/2 shared over the cells, and the servers' noise
    through the same weights with max|Z| over every coordinate at alpha/2 (union
    bound). Coverage ≥ 1 - alpha for every cell at once.
    """
    if not MIN_ALPHA <= alpha < 1:
        raise InvalidParameter(f"alpha must be in [{MIN_ALPHA}, 1), got {alpha}")
    n = _check_int(report_count, "report_count", 0)
    groups, categories = shape
    width = categories + 1
    if len(noised) != groups * width:
        raise InvalidParameter(
            f"{len(noised)} coordinates, not {groups} x ({categories} + a count)"
        )
    dg, og, scale, a, b = _counted_terms(group, groups, question)
    rows = [[Fraction(noised[g * width + c]) for c in range(width)] for g in range(groups)]
    columns = [sum(rows[g][c] for g in range(groups)) for c in range(width)]
    mixed = [
        [(dg - og) * rows[g][c] + og * columns[c] for c in range(width)] for g in range(groups)
    ]
    values = [
        (scale * mixed[g][c] - b * mixed[g][categories]) / a
        for g in range(groups)
        for c in range(categories)
    ]
    half = counted_half_width(n, shape, group, question, plan, alpha)
    upper = Fraction(n) * scale
    return [
        Estimate(v, max(v - half, Fraction(0)), min(v + half, upper), 1 - alpha, 1 - alpha)
        for v in values
    ]


def counted_half_width(
    report_count: int,
    shape: tuple[int, int],
    group: KaryResponse | None,
    question: BitChannel,
    plan: NoisePlan,
    alpha: float = 0.05,
) -> Fraction:
    """The half-width of every cell's interval in `counted_breakdown_estimate` (before
    it is cut to the possible range): public parameters only."""
    groups, categories = shape
    dg, og, scale, a, b = _counted_terms(group, groups, question)
    # A report's term in a cell: an entry of A_G⁻¹ (0 for another group without a
    # group channel) times (scale·bit - b)/a, bit 0 or 1.
    terms = {d * (scale * bit - b) / a for d in (dg, og, Fraction(0)) for bit in (0, 1)}
    width = max(terms) - min(terms)
    cells = groups * categories
    t = float(width) * math.sqrt(report_count * math.log(4 * cells / alpha) / 2)
    noise = Fraction(0)
    if plan.server_noise() is not None:
        c, _ = noise_half_width(plan, min(alpha / (2 * groups * (categories + 1)), 0.5))
        noise = c * (dg + (groups - 1) * abs(og)) * (scale + abs(b)) / a
    return Fraction(math.ceil(t * 1e9), 10**9) + noise


def counted_breakdown_error(
    report_count: int,
    shape: tuple[int, int],
    group: KaryResponse | None,
    question: BitChannel,
    plan: NoisePlan,
) -> float:
    """The root mean square error of one cell of `counted_breakdown_estimate` at its
    worst over the answers: each report's term has a variance of at most w²/4 (w its
    range, as in `counted_half_width`), the servers' noise Var Z times the sum of its
    squared weights."""
    groups, _ = shape
    dg, og, scale, a, b = _counted_terms(group, groups, question)
    terms = {d * (scale * bit - b) / a for d in (dg, og, Fraction(0)) for bit in (0, 1)}
    width = float(max(terms) - min(terms))
    squares = float((dg * dg + (groups - 1) * og * og) * (scale * scale + b * b) / (a * a))
    noise, _ = local_error(None, plan, report_count)
    return math.sqrt(report_count * width * width / 4 + noise * noise * squares)
