"""Do reconciled breakdowns cover, and are they at least as precise? Measured with
the exact noise (veil.dp.reconcile).

For a breakdown of each kind, a number of respondents n and a budget, many
collections of the same answers are simulated: each aggregator draws its noise
exactly as in service (veil.dp.draw_noise, per coordinate) for the breakdown,
the question and the group question, each release a task of its own with its own
noise plan. The raw intervals come from veil.dp.estimate (each release alone,
per coordinate), the reconciled and shown ones from veil.dp.reconcile's
`breakdown_plan(...).apply`, the path `veil survey collect` takes. For every cell
and every margin (a question's category, a group's count) we count how often
each interval holds the truth, and measure the variance of each estimate's error
against the smaller raw one (a cell's own; a margin's own release's or the sum of
its cells').

`scripts/study_reconcile.py` prints the table (docs/reports/ACCURACY.md).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from veil.dp.estimates import Estimate, estimate
from veil.dp.mechanisms import DPConfig, NoisePlan, draw_noise
from veil.dp.reconcile import Crossing, breakdown_plan, joint_plan

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "BUDGETS",
    "CONFIGS",
    "JOINT_CONFIGS",
    "Config",
    "JointConfig",
    "StudyPoint",
    "binomial_below",
    "format_study",
    "joint_study",
    "run",
    "run_joint",
    "study",
]


@dataclass(frozen=True)
class Config:
    """A breakdown: Q's kind and categories by G's kind and groups; `top` the most
    one respondent adds to a cell; the VDAFs of the three releases."""

    name: str
    question_kind: str
    categories: int
    group_kind: str
    groups: int
    top: int

    @property
    def histogram(self) -> bool:
        return self.question_kind in ("yes_no", "choice")

    def vdafs(self) -> tuple[tuple[str, dict[str, int]], ...]:
        """(breakdown, question, group) as task types, as a survey would make them."""
        k, m, top = self.groups, self.categories, self.top
        group = (
            ("Prio3Count", {}) if self.group_kind == "yes_no" else ("Prio3Histogram", {"length": k})
        )
        if self.histogram:
            question = (
                ("Prio3Count", {})
                if self.question_kind == "yes_no"
                else ("Prio3Histogram", {"length": m})
            )
            return (("Prio3Histogram", {"length": k * m}), question, group)
        if self.question_kind == "multi_choice":  # at most two options each
            return (
                ("Prio3MultihotCountVec", {"length": k * m, "max_weight": 2}),
                ("Prio3MultihotCountVec", {"length": m, "max_weight": 2}),
                group,
            )
        if self.question_kind == "integer":
            return (
                ("Prio3L1BoundSum", {"length": k, "max_value": top}),
                ("Prio3Sum", {"max_measurement": top}),
                group,
            )
        return (("Prio3L1BoundSum", {"length": k * m, "max_value": top}),
                ("Prio3L1BoundSum", {"length": m, "max_value": top}), group)  # fmt: skip

    def answers(self, n: int) -> npt.NDArray[np.int64]:
        """The true cells of n respondents (group-major), spread unevenly: group g
        holds about (g + 1) shares, and within it the answers lean one way."""
        k, m, top = self.groups, self.categories, self.top
        cells = np.zeros((k, m), dtype=np.int64)
        weights = np.arange(1, k + 1)
        for i in range(n):
            g = int(np.searchsorted(np.cumsum(weights), (i * 7919) % weights.sum(), side="right"))
            if self.histogram:
                cells[g, (i * 31 + g) % m if (i % 3) else 0] += 1
            elif self.question_kind == "multi_choice":
                first = (i // 3 + g) % m
                for c in {first, (first + 1) % m} if i % 3 == 0 else {first} if i % 3 == 1 else ():
                    cells[g, c] += 1
            elif self.question_kind == "integer":
                cells[g, 0] += (i * 37) % (top + 1)
            else:  # points: a split of at most `top` over the options
                left = (i * 53) % (top + 1)
                for c in range(m):
                    part = left if c == m - 1 else (left * (c + 1 + i % 3)) // (m + 3)
                    cells[g, c] += part
                    left -= part
        return cells.reshape(-1)


CONFIGS = (
    Config("choice by choice", "choice", 3, "choice", 4, 1),
    Config("yes_no by yes_no", "yes_no", 2, "yes_no", 2, 1),
    Config("multi_choice by choice", "multi_choice", 3, "choice", 3, 1),
    Config("integer by choice", "integer", 1, "choice", 3, 10),
    Config("points by yes_no", "points", 3, "yes_no", 2, 10),
)


def _plan(config: DPConfig, vdaf: tuple[str, dict[str, int]]) -> NoisePlan:
    return NoisePlan.for_task(config, vdaf[0], vdaf[1])


def binomial_below(held: int, runs: int, level: float) -> float:
    """P(Binom(runs, level) ≤ held): how surprising so few covers would be."""
    total = 0.0
    for k in range(held + 1):
        log = (
            math.lgamma(runs + 1) - math.lgamma(k + 1) - math.lgamma(runs - k + 1)
            + k * math.log(level) + (runs - k) * math.log1p(-level)
        )  # fmt: skip
        total += math.exp(log)
    return min(total, 1.0)


@dataclass(frozen=True)
class StudyPoint:
    """One configuration over `runs` releases. Coverage figures are over every cell
    and margin coordinate (lowest; `p_low` the one-sided binomial p-value of the
    lowest reconciled or shown one against the level); variance ratios are the
    largest over them of reconciled / smaller raw (exact, and as measured)."""

    name: str
    budget: str
    n: int
    runs: int
    level: float
    raw_cover: float
    reconciled_cover: float
    shown_cover: float
    p_low: float
    exact_ratio: float
    measured_ratio: float
    shown_mse_ratio: float
    width_ratio: float


def study(
    config: Config, dp: DPConfig, budget: str, n: int, runs: int, rng: random.Random,
    level: float = 0.95,
) -> StudyPoint:  # fmt: skip
    """Simulate `runs` releases of `config`'s breakdown and both questions."""
    vdafs = config.vdafs()
    plans = [_plan(dp, v) for v in vdafs]
    truth = config.answers(n)
    k, m = config.groups, config.categories
    table = truth.reshape(k, m)
    q_truth = (
        table[:, 1].sum(keepdims=True) if config.question_kind == "yes_no" else table.sum(axis=0)
    )
    g_truth = table[1, :].sum(keepdims=True) if config.group_kind == "yes_no" else table.sum(axis=1)
    plan = breakdown_plan(
        config.question_kind, m, config.group_kind, k, n, config.top,
        plans[0].total_noise(), plans[1].total_noise(),
        plans[2].total_noise() if config.histogram else None, level,
    )  # fmt: skip
    margin_truths = [q_truth, g_truth][: len(plan.margins)]
    everything = np.concatenate([truth, *margin_truths]).astype(np.float64)
    coords = everything.size
    alpha = 1 - level
    raw_half = [float(estimate([0], p, alpha)[0].high) for p in plans]
    # Raw estimators: a cell's own value; a margin's own release and its cells' sum.
    own_err, sum_err, rec_err, shown_err = [], [], [], []
    raw_held = np.zeros(coords)
    rec_held = np.zeros(coords)
    shown_held = np.zeros(coords)
    rec_width = 0.0
    for _ in range(runs):
        noisy = [
            np.asarray(draw_noise(p, size, rng)) + np.asarray(draw_noise(p, size, rng))
            for p, size in zip(plans, (k * m, q_truth.size, g_truth.size), strict=True)
        ]
        cells = truth + noisy[0]
        released = [q_truth + noisy[1], g_truth + noisy[2]][: len(plan.margins)]
        result = plan.apply(cells, released)
        rec = [*result.cells, *(e for ms in result.margins for e in ms)]
        shown = [*result.shown_cells, *(e for ms in result.shown_margins for e in ms)]
        rec_value = np.array([float(e.value) for e in rec])
        rec_err.append(rec_value - everything)
        shown_err.append(np.array([float(e.value) for e in shown]) - everything)
        rec_held += [
            float(e.low) <= t <= float(e.high) for e, t in zip(rec, everything, strict=True)
        ]
        shown_held += [
            float(e.low) <= t <= float(e.high) for e, t in zip(shown, everything, strict=True)
        ]
        own = np.concatenate([cells, *released])
        own_err.append(own - everything)
        sums = [margin.design @ cells for margin in plan.margins]
        sum_err.append(np.concatenate([cells, *sums]) - everything)
        half = np.concatenate(
            [np.full(k * m, raw_half[0])]
            + [np.full(t.size, raw_half[i + 1]) for i, t in enumerate(margin_truths)]
        )
        raw_held += np.abs(own - everything) <= half
        rec_width += float(np.mean([float(e.high - e.low) for e in rec]) / np.mean(2 * half))
    exact = np.concatenate([plan.cell_variances()] + [
        plan.margin_variances(i) for i in range(len(plan.margins))])  # fmt: skip
    raw_exact = np.concatenate([plan.raw_cell_variances()] + [
        plan.raw_margin_variances(i) for i in range(len(plan.margins))])  # fmt: skip
    measured = np.var(np.array(rec_err), axis=0)
    raw_measured = np.minimum(np.var(np.array(own_err), axis=0), np.var(np.array(sum_err), axis=0))
    shown_mse = np.mean(np.array(shown_err) ** 2, axis=0)
    lowest = int(min(rec_held.min(), shown_held.min()))
    return StudyPoint(
        config.name,
        budget,
        n,
        runs,
        level,
        float(raw_held.min() / runs),
        float(rec_held.min() / runs),
        float(shown_held.min() / runs),
        binomial_below(lowest, runs, level) * coords,
        float(np.max(exact / raw_exact)),
        float(np.max(measured / raw_measured)),
        float(np.max(shown_mse / raw_measured)),
        rec_width / runs,
    )


def format_study(points: Sequence[StudyPoint]) -> str:
    """A Markdown table of study points."""
    lines = [
        "| breakdown | budget | n | runs | raw cover | reconciled cover | shown cover"
        " | p (lowest) | var / smaller raw, exact | measured | shown MSE / smaller raw"
        " | width / raw |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        lines.append(
            f"| {p.name} | {p.budget} | {p.n:,} | {p.runs:,} | {p.raw_cover:.3f}"
            f" | {p.reconciled_cover:.3f} | {p.shown_cover:.3f} | {min(p.p_low, 1.0):.2g}"
            f" | {p.exact_ratio:.3f} | {p.measured_ratio:.3f} | {p.shown_mse_ratio:.3f}"
            f" | {p.width_ratio:.2f} |"
        )
    return "\n".join(lines)


BUDGETS: tuple[tuple[str, DPConfig], ...] = (
    ("ε = 1/2", DPConfig.geometric(Fraction(1, 2))),
    ("ρ = 1/8", DPConfig.gaussian(Fraction(1, 8))),
)


def run(
    sizes: Sequence[int],
    runs: int,
    seed: int,
    configs: Sequence[Config] = CONFIGS,
    budgets: Sequence[tuple[str, DPConfig]] = BUDGETS,
    progress: Callable[[StudyPoint], None] = lambda _p: None,
) -> list[StudyPoint]:
    """Every (breakdown, budget, n) point."""
    rng = random.Random(seed)
    points = []
    for config in configs:
        for budget, dp in budgets:
            for n in sizes:
                point = study(config, dp, budget, n, runs, rng)
                progress(point)
                points.append(point)
    return points


# --------------------------------------------------------------------------- joint


@dataclass(frozen=True)
class JointConfig:
    """Breakdowns that share a margin, reconciled together (veil.dp.reconcile.
    joint_plan): `questions` maps each question to its kind and options (an
    integer's: its max), `crossings` lists (question, group) pairs."""

    name: str
    questions: tuple[tuple[str, str, int], ...]
    crossings: tuple[tuple[str, str], ...]

    def kind(self, q: str) -> tuple[str, int]:
        return next((k, size) for name, k, size in self.questions if name == q)

    def answers(self, n: int) -> dict[str, npt.NDArray[np.int64]]:
        """Each question's answer for n respondents, spread unevenly (option o
        about (o + 1) shares) and related: every third respondent's answer
        follows the answer to the question before."""
        out: dict[str, npt.NDArray[np.int64]] = {}
        i = np.arange(n)
        before = np.zeros(n, dtype=np.int64)
        for j, (name, kind, size) in enumerate(self.questions):
            options = size + 1 if kind == "integer" else 2 if kind == "yes_no" else size
            shares = np.cumsum(np.arange(1, options + 1)) / (options * (options + 1) / 2)
            spread = np.modf((i + 1) * (math.sqrt(2) + j * math.sqrt(3)))[0]
            value = np.searchsorted(shares, spread, side="right")
            out[name] = np.where(i % 3 == 0, before % options, value).astype(np.int64)
            before = out[name]
        return out

    def vdaf(self, q: str) -> tuple[str, dict[str, int]]:
        kind, size = self.kind(q)
        if kind == "yes_no":
            return ("Prio3Count", {})
        if kind == "integer":
            return ("Prio3Sum", {"max_measurement": size})
        return ("Prio3Histogram", {"length": size})

    def crossing_vdaf(self, q: str, g: str) -> tuple[str, dict[str, int]]:
        (kind, size), (_, groups) = self.kind(q), self.kind(g)
        groups = 2 if self.kind(g)[0] == "yes_no" else groups
        if kind == "integer":
            return ("Prio3L1BoundSum", {"length": groups, "max_value": size})
        return ("Prio3Histogram", {"length": groups * (2 if kind == "yes_no" else size)})


JOINT_CONFIGS = (
    JointConfig(
        "yes_no by two groups",
        (("remote", "yes_no", 2), ("team", "choice", 3), ("office", "choice", 2)),
        (("remote", "team"), ("remote", "office")),
    ),
    JointConfig(
        "two by one group",
        (("team", "choice", 3), ("remote", "yes_no", 2), ("commute", "choice", 3)),
        (("remote", "team"), ("commute", "team")),
    ),
    JointConfig(
        "three tied both ways",
        (
            ("remote", "yes_no", 2),
            ("team", "choice", 3),
            ("office", "choice", 2),
            ("commute", "choice", 3),
        ),
        (("remote", "team"), ("remote", "office"), ("commute", "team")),
    ),
    JointConfig(
        "integer by two groups",
        (("hours", "integer", 10), ("team", "choice", 3), ("office", "yes_no", 2)),
        (("hours", "team"), ("hours", "office")),
    ),
)


def joint_study(
    config: JointConfig, dp: DPConfig, budget: str, n: int, runs: int, rng: random.Random,
    level: float = 0.95,
) -> StudyPoint:  # fmt: skip
    """Simulate `runs` releases of `config`'s breakdowns and every question, each
    a task of its own, reconciled together; as `study` measures one breakdown."""
    answers = config.answers(n)
    crossings, cell_truths, cell_plans = [], [], []
    for q, g in config.crossings:
        (kind, size), (group_kind, groups) = config.kind(q), config.kind(g)
        m = 1 if kind == "integer" else 2 if kind == "yes_no" else size
        k = 2 if group_kind == "yes_no" else groups
        table = np.zeros((k, m), dtype=np.int64)
        for a, b in zip(answers[q], answers[g], strict=True):
            if kind == "integer":
                table[b, 0] += a
            else:
                table[b, a] += 1
        plan = _plan(dp, config.crossing_vdaf(q, g))
        top = size if kind == "integer" else 1
        crossings.append(Crossing(q, kind, m, g, group_kind, k, n, top, plan.total_noise()))
        cell_truths.append(table.reshape(-1))
        cell_plans.append(plan)
    release_plans = {q: _plan(dp, config.vdaf(q)) for q, _, _ in config.questions}
    joint = joint_plan(
        crossings, {q: p.total_noise() for q, p in release_plans.items()}, level,
    )  # fmt: skip

    def release_truth(q: str) -> npt.NDArray[np.int64]:
        kind, size = config.kind(q)
        if kind == "integer":
            return np.array([answers[q].sum()])
        if kind == "yes_no":
            return np.array([int(answers[q].sum())])
        return np.bincount(answers[q], minlength=size)

    truth = np.concatenate(cell_truths)
    margin_truths = [release_truth(m.name) for m in joint.margins]
    everything = np.concatenate([truth, *margin_truths]).astype(np.float64)
    coords = everything.size
    alpha = 1 - level
    cell_half = np.concatenate([
        np.full(t.size, float(estimate([0], p, alpha)[0].high))
        for t, p in zip(cell_truths, cell_plans, strict=True)])  # fmt: skip
    half = np.concatenate([cell_half] + [
        np.full(t.size, float(estimate([0], release_plans[m.name], alpha)[0].high))
        for t, m in zip(margin_truths, joint.margins, strict=True)])  # fmt: skip
    own_err: list[FloatArray] = []
    best_err: list[list[FloatArray]] = []
    rec_err: list[FloatArray] = []
    shown_err: list[FloatArray] = []
    alternatives = max((1 + len(m.others) for m in joint.margins), default=0)
    raw_held, rec_held, shown_held = np.zeros(coords), np.zeros(coords), np.zeros(coords)
    rec_width = 0.0
    for _ in range(runs):
        cells = np.concatenate([
            t + np.asarray(draw_noise(p, t.size, rng)) + np.asarray(draw_noise(p, t.size, rng))
            for t, p in zip(cell_truths, cell_plans, strict=True)])  # fmt: skip
        released = [
            t
            + np.asarray(draw_noise(release_plans[m.name], t.size, rng))
            + np.asarray(draw_noise(release_plans[m.name], t.size, rng))
            for t, m in zip(margin_truths, joint.margins, strict=True)
        ]
        result = joint.apply(cells, released)
        for margin, shown_m in zip(joint.margins, result.shown_margins, strict=True):
            # Every breakdown that measures a release publishes its totals.
            cut = [float(e.value) for e in result.shown_cells]
            for a in margin.others:
                assert np.allclose(a @ cut, [float(e.value) for e in shown_m], atol=1e-9)
        rec = [*result.cells, *(e for ms in result.margins for e in ms)]
        shown = [*result.shown_cells, *(e for ms in result.shown_margins for e in ms)]
        rec_err.append(np.array([float(e.value) for e in rec]) - everything)
        shown_err.append(np.array([float(e.value) for e in shown]) - everything)
        rec_held += _held(rec, everything)
        shown_held += _held(shown, everything)
        own = np.concatenate([cells, *released])
        own_err.append(own - everything)
        # A margin's other raw estimators: each measuring breakdown's sum (where a
        # margin has fewer, its own release stands in).
        best_err.append([
            np.concatenate([cells, *(
                (m.design, *m.others)[s] @ cells if s <= len(m.others) else r
                for m, r in zip(joint.margins, released, strict=True))]) - everything
            for s in range(alternatives)
        ])  # fmt: skip
        raw_held += np.abs(own - everything) <= half
        rec_width += float(np.mean([float(e.high - e.low) for e in rec]) / np.mean(2 * half))
    exact = np.concatenate([joint.cell_variances()] + [
        joint.margin_variances(i) for i in range(len(joint.margins))])  # fmt: skip
    raw_exact = np.concatenate([joint.raw_cell_variances()] + [
        joint.raw_margin_variances(i) for i in range(len(joint.margins))])  # fmt: skip
    measured = np.var(np.array(rec_err), axis=0)
    raw_measured = np.var(np.array(own_err), axis=0)
    for s in range(alternatives):
        raw_measured = np.minimum(raw_measured, np.var(np.array([b[s] for b in best_err]), axis=0))
    shown_mse = np.mean(np.array(shown_err) ** 2, axis=0)
    lowest = int(min(rec_held.min(), shown_held.min()))
    return StudyPoint(
        config.name, budget, n, runs, level,
        float(raw_held.min() / runs), float(rec_held.min() / runs),
        float(shown_held.min() / runs), binomial_below(lowest, runs, level) * coords,
        float(np.max(exact / raw_exact)), float(np.max(measured / raw_measured)),
        float(np.max(shown_mse / raw_measured)), rec_width / runs,
    )  # fmt: skip


def _held(estimates: Sequence[Estimate], truth: FloatArray) -> FloatArray:
    return np.array(
        [float(e.low) <= t <= float(e.high) for e, t in zip(estimates, truth, strict=True)],
        dtype=np.float64,
    )


def run_joint(
    sizes: Sequence[int],
    runs: int,
    seed: int,
    configs: Sequence[JointConfig] = JOINT_CONFIGS,
    budgets: Sequence[tuple[str, DPConfig]] = BUDGETS,
    progress: Callable[[StudyPoint], None] = lambda _p: None,
) -> list[StudyPoint]:
    """Every (joint configuration, budget, n) point."""
    rng = random.Random(seed)
    points = []
    for config in configs:
        for budget, dp in budgets:
            for n in sizes:
                point = joint_study(config, dp, budget, n, runs, rng)
                progress(point)
                points.append(point)
    return points
