"""Estimates that agree with each other: a breakdown and the questions it crosses.

A breakdown of a question Q by a group question G releases noisy cells, one per
(group, category): a histogram over group x answer for a categorical Q, each
group's sums for a numeric one. Q's own release and G's own release measure the
breakdown's margins again, with noise drawn independently by each aggregator,
whose exact variance is public (`TotalNoise.variance`). Published side by side,
the three disagree: a team's counts do not add up to the team's own count.

Reconciliation is post-processing of released values (free under DP). The cells
x (K of them) are the unknowns; each release r measures y_r = A_r·x + e_r, its
noise e_r independent across coordinates and releases with variance v_r per
coordinate (A_0 = I for the breakdown itself, column sums for Q, row sums for G),
and some facts are exact, C·x = d (a histogram's cells add up to the public
report count n; a release without noise). The generalised least squares estimate
under the exact constraints (Aitken 1935, with equality constraints),

    x̂ = argmin Σ_r |y_r - A_r·x|² / v_r  subject to  C·x = d,

is, with N a basis of C's null space, H = Σ_r A_r'A_r / v_r and
G = N (N'HN)⁻¹ N':

    x̂ = G·Σ_r A_r'y_r / v_r + (I - G·H)·C⁺d,   x̂ - x = G·Σ_r A_r'e_r / v_r.

Its covariance is exactly G (G·H·G = G); a linear function t'x (a margin) is
estimated by t'x̂ with variance t'Gt, and its error is Σ_r ω_r'e_r with weights
ω_r = A_r·G·t / v_r on each release's noises, from which the interval follows.

**At least as precise as either source.** Let U be any linear unbiased estimator
of t'x from the releases (a cell's own noisy value, Q's own count, the sum of a
column of cells) and T = t'x̂. D = U - T is linear, D = Σ_r b_r'e_r + (Σ_r b_r'A_r)·x
+ const, and unbiased for 0 at every x with C·x = d, so Σ_r b_r'A_r·N = 0. Then
Cov(T, D) = Σ_r v_r·ω_r'b_r = t'G·Σ_r A_r'b_r = t'N (N'HN)⁻¹ (Σ_r b_r'A_r N)' = 0,
so Var U = Var T + Var D ≥ Var T (the Gauss-Markov argument). Every reconciled
cell's variance is at most its own release's v_0, every reconciled margin's at
most min(v_Q, v_0·|column|), and likewise for any sum of cells.

**Intervals.** The error of each estimate is a fixed weighted sum of the releases'
integer noises, whose exact distributions are public: its interval
(`veil.dp.noise_sums.weighted_noise_half_width`) covers at least at its level, as
the raw intervals do, and is at most 2% of the estimate's standard deviation
wider than the exact one.

**The cut.** As the single questions are published (veil.dp.consistent_box,
consistent_histogram), the reconciled cells are then projected (Euclidean, exact
in rationals) onto what is possible, block by block (`Block`): a histogram's
cells onto the non-negative ones summing to n; a multiple choice's column (an
option over the groups) first as a total cut to [0, n], then its cells onto the
non-negative ones summing to that total; a numeric question's margins (its
columns' totals) first onto the non-negative ones summing to at most n·max (or
the points' total), then each column's cells onto its cut total. Cutting each
cell at 0 alone would push every margin up; cutting the margin first publishes
it as its own reconciled value cut to its range, as its question alone would
be. A margin is published as the sum of the cut cells, so the published single-
question totals equal the breakdown's margins. Each interval is the reconciled
one intersected with the possible range and widened to hold the cut value. The
cut makes the estimates biased towards the inside, as it makes the single
questions'; the study (bench.reconcile) measures its mean squared error.

**Several breakdowns.** Where one question's release measures two breakdowns'
margins (remote by team and remote by office; two breakdowns by team), the
unknowns are all their cells and the breakdowns' sums of that question's totals
are tied, equal (a fact: the same respondents' totals), so the whole connected
set is one least squares problem (`joint_plan`): every release is weighed once,
the argument above holds as it stands (the ties are part of C), and the cut
keeps the ties (a shared release's totals are cut first, once, and every
breakdown's cells onto them; a histogram tied through both its question and its
group onto its row and column totals at once). Then every published total is
the sum of every breakdown's cells that measure it.

**Which margins hold.** A margin constraint is a fact only when the breakdown's
respondents are exactly the question's: `same_respondents`. A question answered
with local randomized response is reconciled on the randomized scale, where both
its release and the breakdown sum the very same randomized answers (a second,
independent randomization would make no margin): the variances are the servers'
noise alone, and the de-biasing that follows, as for the question's estimates, is
one linear map of raw and reconciled alike, so the inequality above still holds
(the randomization's own error is common to both).

All of this is public parameters and released values: no I/O, no randomness.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from veil.dp.errors import InvalidParameter
from veil.dp.estimates import Estimate, _into
from veil.dp.mechanisms import TotalNoise
from veil.dp.noise_sums import weighted_noise_half_width

__all__ = [
    "BREAKDOWN_GROUP_KINDS",
    "BREAKDOWN_QUESTION_KINDS",
    "Block",
    "Crossing",
    "Margin",
    "ReconcilePlan",
    "Reconciled",
    "breakdown_plan",
    "joint_plan",
    "same_respondents",
]

FloatArray = npt.NDArray[np.float64]
# Released values: a decoded aggregate's integers, or floats holding them.
Values = Sequence[float] | FloatArray

BREAKDOWN_QUESTION_KINDS = ("yes_no", "choice", "multi_choice", "integer", "points")
BREAKDOWN_GROUP_KINDS = ("yes_no", "choice")

# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True, eq=False)
class Margin:
    """A release of sums of cells: its coordinate i measures Σ_j design[i, j]·x_j
    with independent noise `noise` on each coordinate, and lies in [0, high].
    `name` says which release it is ("question", "group" for a breakdown)."""

    design: FloatArray
    noise: TotalNoise
    high: int
    name: str = ""
    # Other breakdowns' cells that measure the same totals (a question two
    # breakdowns cross): a tie makes them equal, and each is a raw estimator.
    others: tuple[FloatArray, ...] = ()

    def __post_init__(self) -> None:
        designs = [np.asarray(d, dtype=np.float64) for d in (self.design, *self.others)]
        for design in designs:
            if design.ndim != 2 or design.shape[0] < 1 or not np.all(np.isfinite(design)):
                raise InvalidParameter("a margin's design is a finite matrix of one row or more")
            if design.shape != designs[0].shape:
                raise InvalidParameter("a margin's designs must all have one shape")
        object.__setattr__(self, "design", designs[0])
        object.__setattr__(self, "others", tuple(designs[1:]))


@dataclass(frozen=True)
class Block:
    """Cells that are non-negative and sum to at most `total` (exactly, if `exact`):
    the possible set the cut projects onto, block by block.

    `parts` (a partition of `cells`; None: each cell alone) orders the cut: the
    parts' sums are projected first, then each part's cells onto their part's cut
    sum. A part that is a margin (a column of a multiple choice, all of an
    integer's groups) is then published as its reconciled value cut to its range,
    where cutting each cell at 0 first would push the sum up.
    """

    cells: tuple[int, ...]
    total: int
    exact: bool = False
    parts: tuple[tuple[int, ...], ...] | None = None
    # Blocks of one link have parts whose sums are the same totals (a question's,
    # measured by two breakdowns): those sums are cut once, from the first such
    # block, and each block's parts are cut onto them, so that both publish the
    # same totals.
    link: str | None = None
    # A second partition whose sums are cut too, the cells then onto both sets of
    # totals at once (`_transport`): a histogram's rows where its parts are its
    # columns, both measured by other breakdowns. Only for an exact block.
    cross: tuple[tuple[int, ...], ...] | None = None
    cross_link: str | None = None

    def __post_init__(self) -> None:
        if self.parts is not None and sorted(j for p in self.parts for j in p) != sorted(
            self.cells
        ):
            raise InvalidParameter(f"a block's parts must partition its cells: {self}")
        if self.link is not None and self.parts is None:
            raise InvalidParameter(f"a linked block has parts: {self}")
        if self.cross is not None and (
            self.parts is None
            or not self.exact
            or sorted(j for p in self.cross for j in p) != sorted(self.cells)
        ):
            raise InvalidParameter(f"a block's cross partition needs parts, exactly: {self}")


def _simplex(values: Sequence[Fraction], total: Fraction, exact: bool) -> list[Fraction]:
    """The closest point (L2) with non-negative entries summing to `total` (at most
    `total` unless `exact`): each value less a common θ, cut at 0 (veil.dp.
    project_histogram's method, for a total that is not an integer)."""
    clamped = [max(v, Fraction(0)) for v in values]
    if not exact and sum(clamped, Fraction(0)) <= total:
        return clamped
    if total <= 0:
        return [Fraction(0)] * len(values)
    running = Fraction(0)
    theta = Fraction(0)
    for k, v in enumerate(sorted(values, reverse=True), start=1):
        running += v
        candidate = (running - total) / k
        if v - candidate > 0:
            theta = candidate
    return [max(v - theta, Fraction(0)) for v in values]


def _shift(values: FloatArray, total: float) -> float:
    """The u with Σ max(values + u, 0) = total (total > 0): _simplex's -θ, in floats.
    A value of -inf (a cell of a column whose total is 0) stays at 0."""
    ordered = np.sort(values[np.isfinite(values)])[::-1]
    running = np.cumsum(ordered)
    k = np.arange(1, ordered.size + 1)
    theta = (running - total) / k
    # The largest value is always kept (it exceeds θ by the total, which rounding
    # may hide when the total is below the values' precision).
    last = int(np.flatnonzero(ordered - theta > 0)[-1:].sum())
    return float(-theta[last])


def _transport(
    values: Sequence[Fraction],
    rows: Sequence[Sequence[int]],
    columns: Sequence[Sequence[int]],
    row_totals: Sequence[Fraction],
    column_totals: Sequence[Fraction],
) -> dict[int, Fraction]:
    """The closest point (L2) to `values` (by cell) with non-negative entries whose
    sums over each row and each column are the given totals (equal in all).

    It is x = max(values + u_row + v_column, 0) for the dual variables u, v that
    give the totals; they are found by exact coordinate ascent on the dual (each
    row's u, then each column's v, is _simplex's θ with the others fixed), which
    converges for this strongly convex problem (Tseng 2001). Floats, to 1e-12 of
    the total: the rows are exact to that, the columns exact after a last column
    step. A histogram breakdown whose question and group are both measured by
    other breakdowns is cut so."""
    cells = sorted(j for row in rows for j in row)
    at = {j: i for i, j in enumerate(cells)}
    x = np.array([float(values[j]) for j in cells])
    row_of, column_of = np.zeros(x.size, dtype=np.int64), np.zeros(x.size, dtype=np.int64)
    for r, row in enumerate(rows):
        row_of[[at[j] for j in row]] = r
    for c, column in enumerate(columns):
        column_of[[at[j] for j in column]] = c
    r_tot = np.array([float(t) for t in row_totals])
    c_tot = np.array([float(t) for t in column_totals])
    u, v = np.zeros(len(rows)), np.zeros(len(columns))
    members_r = [row_of == r for r in range(len(rows))]
    members_c = [column_of == c for c in range(len(columns))]
    tolerance = 1e-12 * (1.0 + float(np.sum(r_tot)))

    def step(
        totals: FloatArray, members: list[npt.NDArray[np.bool_]], other: FloatArray
    ) -> FloatArray:
        return np.array([
            _shift(x[m] + other[m], t) if t > 0 else -np.inf
            for t, m in zip(totals, members, strict=True)
        ])  # fmt: skip

    for _ in range(20_000):
        u = step(r_tot, members_r, v[column_of])
        v = step(c_tot, members_c, u[row_of])
        out = np.maximum(x + u[row_of] + v[column_of], 0.0)
        residual = np.abs(np.bincount(row_of, out, minlength=len(rows)) - r_tot)
        if float(np.max(residual, initial=0.0)) <= tolerance:
            break
    out = np.maximum(x + u[row_of] + v[column_of], 0.0)
    return {j: Fraction(float(out[at[j]])) for j in cells}


@dataclass(frozen=True)
class Reconciled:
    """One breakdown reconciled with its questions.

    `cells` and `margins` (one tuple per margin, in the plan's order) are the least
    squares estimates (unbiased) with their intervals; `shown_cells` and
    `shown_margins` the published ones: the cells cut to the possible set, each
    margin the sum of the cut cells, so that the tables add up.
    """

    cells: tuple[Estimate, ...]
    margins: tuple[tuple[Estimate, ...], ...]
    shown_cells: tuple[Estimate, ...]
    shown_margins: tuple[tuple[Estimate, ...], ...]


def _check_values(values: Values, size: int, what: str) -> FloatArray:
    array = np.asarray(values, dtype=np.float64)
    if array.shape != (size,):
        raise InvalidParameter(f"{what} has shape {array.shape}, expected ({size},)")
    if not np.all(np.isfinite(array)):
        raise InvalidParameter(f"{what} holds a value that is not finite")
    return array


class ReconcilePlan:
    """What reconciling breakdowns takes, from public parameters only: the least
    squares map, the exact variances and the intervals' half-widths. Build it once
    (`breakdown_plan` for one breakdown, `joint_plan` for breakdowns that share a
    margin), `apply` it to released values.

    `noise` is the breakdown's total noise per cell, or, for several breakdowns
    reconciled together, one (cells, noise) piece per breakdown, the pieces
    partitioning the cells; `margins` are the other releases and `blocks` the
    possible set; a block marked exact is also a fact the least squares use (the
    cells sum to its total). A release without noise is a fact too, and so is each
    row t of `ties` (t·x = 0: two breakdowns' sums of one question's totals are
    equal). `simultaneous` makes each release's intervals hold together (Bonferroni:
    the reconciled errors are correlated, so the exact max-of-k does not apply),
    a breakdown's cells among themselves.
    """

    def __init__(
        self,
        cells: int,
        noise: TotalNoise | Sequence[tuple[Sequence[int], TotalNoise]],
        margins: Sequence[Margin],
        blocks: Sequence[Block],
        confidence: float = 0.95,
        *,
        simultaneous: bool = False,
        ties: Sequence[Sequence[float]] | FloatArray = (),
    ) -> None:
        if isinstance(cells, bool) or not isinstance(cells, int) or cells < 1:
            raise InvalidParameter(f"a breakdown has at least one cell, got {cells!r}")
        if not 0 < confidence < 1:
            raise InvalidParameter(f"confidence must be in (0, 1), got {confidence}")
        self.size = cells
        pieces = [(tuple(range(cells)), noise)] if isinstance(noise, TotalNoise) else list(noise)
        self.pieces = tuple(tuple(int(j) for j in p) for p, _ in pieces)
        if sorted(j for p in self.pieces for j in p) != list(range(cells)) or not all(self.pieces):
            raise InvalidParameter("the breakdowns' pieces must partition the cells")
        self.margins = tuple(margins)
        self.blocks = tuple(blocks)
        self.confidence = confidence
        self.simultaneous = simultaneous
        for m in self.margins:
            if m.design.shape[1] != cells:
                raise InvalidParameter(
                    f"a margin's design has {m.design.shape[1]} columns for {cells} cells"
                )
        for b in self.blocks:
            if not b.cells or any(not 0 <= j < cells for j in b.cells) or b.total < 0:
                raise InvalidParameter(f"a block names cells outside the breakdown: {b}")
        linked: dict[str, Block] = {}
        for b in self.blocks:
            if b.link is None:
                continue
            first = linked.setdefault(b.link, b)
            if (len(first.parts or ()), first.total, first.exact) != (
                len(b.parts or ()),
                b.total,
                b.exact,
            ):
                raise InvalidParameter(f"blocks of one link differ in their parts or total: {b}")
        tie_rows = np.asarray(ties, dtype=np.float64).reshape(-1, cells)
        if not np.all(np.isfinite(tie_rows)):
            raise InvalidParameter("a tie is a finite row over the cells")
        eye = np.eye(cells)
        releases = [(eye[list(p)], n) for p, (_, n) in zip(self.pieces, pieces, strict=True)]
        releases += [(m.design, m.noise) for m in self.margins]
        self._variances = [n.variance() for _, n in releases]
        self._cell_variance = np.zeros(cells)
        for p, v in zip(self.pieces, self._variances, strict=False):
            self._cell_variance[list(p)] = v
        self._piece_of = np.zeros(cells, dtype=np.int64)
        for i, p in enumerate(self.pieces):
            self._piece_of[list(p)] = i
        # The exact facts: exact blocks, every release without noise (its values
        # are the right-hand side, known only when applied), then the ties (0).
        rows = [np.isin(np.arange(cells), b.cells).astype(np.float64) for b in blocks if b.exact]
        rows += [
            row for (a, _), v in zip(releases, self._variances, strict=True) if v == 0 for row in a
        ]
        rows += list(tie_rows)
        self._ties = len(tie_rows)
        constraints = np.array(rows).reshape(len(rows), cells)
        self._constraints = constraints
        h = sum(
            (a.T @ a / v for (a, _), v in zip(releases, self._variances, strict=True) if v > 0),
            np.zeros((cells, cells)),
        )
        # N: a basis of the null space of C (the directions the facts leave free).
        if constraints.shape[0]:
            _, s, vt = np.linalg.svd(constraints)
            rank = int(np.sum(s > 1e-10 * s[0]))
            basis = vt[rank:].T
            self._pinv = np.linalg.pinv(constraints, rcond=1e-10)
        else:
            basis = np.eye(cells)
            self._pinv = np.zeros((cells, 0))
        if basis.shape[1]:
            inner = basis.T @ h @ basis
            gain = basis @ np.linalg.solve(inner, basis.T)
        else:
            gain = np.zeros((cells, cells))
        self._gain = (gain + gain.T) / 2
        self._fixed = (np.eye(cells) - self._gain @ h) @ self._pinv
        self._releases = releases
        self._widths: dict[tuple[int, int], tuple[float, float]] = {}
        self._cache: dict[tuple[object, ...], tuple[float, float]] = {}

    @property
    def noise(self) -> TotalNoise:
        """The breakdown's noise per cell (the first breakdown's, of several)."""
        return self._releases[0][1]

    # ----------------------------------------------------------------- variances

    def cell_variances(self) -> FloatArray:
        """The exact variance of each reconciled cell (diag G)."""
        variances: FloatArray = np.clip(np.diag(self._gain).copy(), 0.0, None)
        return variances

    def margin_variances(self, index: int) -> FloatArray:
        """The exact variance of each reconciled coordinate of margin `index`."""
        a = self.margins[index].design
        variances: FloatArray = np.clip(np.einsum("ij,jk,ik->i", a, self._gain, a), 0.0, None)
        return variances

    def raw_cell_variances(self) -> FloatArray:
        """Each cell's variance from its own release alone."""
        return self._cell_variance.copy()

    def raw_margin_variances(self, index: int) -> FloatArray:
        """Each coordinate's smallest raw variance: its own release's, or the sum of
        the cells of any breakdown that measures it."""
        m = self.margins[index]
        smallest: FloatArray = np.full(m.design.shape[0], self._variances[len(self.pieces) + index])
        for a in (m.design, *m.others):
            smallest = np.minimum(smallest, (a**2) @ self._cell_variance)
        return smallest

    # ----------------------------------------------------------------- intervals

    def cell_half_width(self, cell: int) -> float:
        """The half-width of cell `cell`'s reconciled interval (before the cut): it
        depends on public parameters only, as `apply` gives it."""
        return self._half_width(0, cell)[0]

    def margin_half_width(self, index: int, row: int) -> float:
        """The half-width of coordinate `row` of margin `index`'s reconciled interval."""
        return self._half_width(index + 1, row)[0]

    def _alpha(self, release: int, row: int) -> float:
        alpha = 1 - self.confidence
        if not self.simultaneous:
            return alpha
        if release == 0:
            return alpha / len(self.pieces[int(self._piece_of[row])])
        return alpha / int(self.margins[release - 1].design.shape[0])

    def _half_width(self, release: int, row: int) -> tuple[float, float]:
        """(c, coverage) of coordinate `row` of release `release` (0: the cells)."""
        key = (release, row)
        if key in self._widths:
            return self._widths[key]
        gt = (
            self._gain[:, row]
            if release == 0
            else self._gain @ self.margins[release - 1].design[row]
        )
        terms = [
            (n, (a @ gt) / v)
            for (a, n), v in zip(self._releases, self._variances, strict=True)
            if v > 0
        ]
        alpha = self._alpha(release, row)
        # Cells (and margins) of a symmetric design share their weights up to order.
        signature = (alpha, *((n, tuple(np.sort(np.round(np.abs(w), 12)))) for n, w in terms))
        if signature not in self._cache:
            self._cache[signature] = weighted_noise_half_width(terms, alpha)
        self._widths[key] = self._cache[signature]
        return self._widths[key]

    # ----------------------------------------------------------------- applying

    def apply(self, cells: Values, margins: Sequence[Values]) -> Reconciled:
        """Reconcile released values: the breakdowns' decoded cells (one after the
        other, as the pieces lay them out), and each margin's decoded coordinates
        in the plan's order (in the aggregates' own units: a fixed-point task's
        values as decoded, scaled by the caller)."""
        x0 = _check_values(cells, self.size, "the breakdown's values")
        if len(margins) != len(self.margins):
            raise InvalidParameter(f"{len(margins)} margins given for {len(self.margins)}")
        ys = [x0[list(p)] for p in self.pieces] + [
            _check_values(v, m.design.shape[0], f"margin {i}'s values")
            for i, (v, m) in enumerate(zip(margins, self.margins, strict=True))
        ]
        rhs = [float(b.total) for b in self.blocks if b.exact]
        rhs += [float(x) for y, v in zip(ys, self._variances, strict=True) if v == 0 for x in y]
        rhs += [0.0] * self._ties
        d = np.array(rhs)
        if d.size and not np.allclose(
            self._constraints @ (self._pinv @ d), d, rtol=1e-9, atol=1e-6
        ):
            raise InvalidParameter(
                "the exact facts contradict each other (a release without noise disagrees"
                " with the breakdown's): their respondents are not the same"
            )
        b = sum(
            (
                a.T @ y / v
                for (a, _), y, v in zip(self._releases, ys, self._variances, strict=True)
                if v > 0
            ),
            np.zeros(self.size),
        )
        x = self._gain @ b + (self._fixed @ d if d.size else 0.0)
        return self._publish(np.asarray(x, dtype=np.float64))

    def _estimate(self, value: float, release: int, row: int) -> Estimate:
        c, coverage = self._half_width(release, row)
        v = Fraction(value)
        return Estimate(v, v - Fraction(c), v + Fraction(c), self.confidence, coverage)

    def _publish(self, x: FloatArray) -> Reconciled:
        cells = tuple(self._estimate(float(x[j]), 0, j) for j in range(self.size))
        margins = tuple(
            tuple(self._estimate(float(v), i + 1, r) for r, v in enumerate(m.design @ x))
            for i, m in enumerate(self.margins)
        )
        cut = [Fraction(float(v)) for v in x]
        cell_high = [Fraction(max((b.total for b in self.blocks), default=0))] * self.size
        linked: dict[str, list[Fraction]] = {}

        def totals(
            block: Block, parts: Sequence[Sequence[int]], link: str | None
        ) -> list[Fraction]:
            if link in linked:
                return linked[link]
            sums = [sum((cut[j] for j in part), Fraction(0)) for part in parts]
            cut_sums = _simplex(sums, Fraction(block.total), block.exact)
            if link is not None:
                linked[link] = cut_sums
            return cut_sums

        for block in self.blocks:
            parts = block.parts or tuple((j,) for j in block.cells)
            first = totals(block, parts, block.link)
            if block.cross is not None:
                second = totals(block, block.cross, block.cross_link)
                for j, v in _transport(cut, parts, block.cross, first, second).items():
                    cut[j] = v
            else:
                for part, total in zip(parts, first, strict=True):
                    for j, v in zip(
                        part, _simplex([cut[j] for j in part], total, True), strict=True
                    ):
                        cut[j] = v
            for j in block.cells:
                cell_high[j] = min(cell_high[j], Fraction(block.total))
        shown_cells = tuple(
            _into(e, v, Fraction(0), high) if self.blocks else e
            for e, v, high in zip(cells, cut, cell_high, strict=True)
        )
        shown_margins = tuple(
            tuple(
                _into(e, sum((Fraction(w) * cut[j] for j, w in enumerate(row) if w), Fraction(0)),
                      Fraction(0), Fraction(m.high))
                for e, row in zip(est, m.design, strict=True)
            )
            for est, m in zip(margins, self.margins, strict=True)
        )  # fmt: skip
        return Reconciled(cells, margins, shown_cells, shown_margins)


# --------------------------------------------------------------------------- breakdowns


def same_respondents(breakdown_reports: int, question_reports: int) -> bool:
    """Whether a question's release and its breakdown's hold the same respondents.

    A breakdown's report is sent with the answers to both of its questions, so its
    respondents are a subset of each question's; under replace_one both counts are
    public, and a subset of equal size is the whole set. Only then are the
    breakdown's margins the question's totals.
    """
    return breakdown_reports == question_reports


def breakdown_plan(
    question_kind: str,
    categories: int,
    group_kind: str,
    groups: int,
    report_count: int,
    top: int,
    breakdown: TotalNoise,
    question: TotalNoise | None,
    group: TotalNoise | None,
    confidence: float = 0.95,
    *,
    simultaneous: bool = False,
) -> ReconcilePlan:
    """The plan for a breakdown of a question by a group question (replace_one).

    Cells are group-major, cell (g, c) at index g·categories + c, as the breakdown
    task's aggregate lays them out: groups are G's options (yes_no: "no", "yes");
    categories are Q's options (yes_no: "no", "yes"; integer: one, its sum).
    `top` is the most one respondent adds to a cell (1 for counts, an integer's
    max, a points question's total), `report_count` the breakdown's n.

    `question` and `group` are their releases' total noise (`NoisePlan.total_noise`),
    or None where their respondents are not the breakdown's (`same_respondents`).
    Margins, in this order where they hold: Q's release (each category's column sum;
    a yes_no question's Prio3Count measures the "yes" column only), then G's (each
    group's row sum; a yes_no group's count the "yes" row), which a respondent's one
    cell per report gives only for a histogram breakdown (Q yes_no or choice).

    The possible set: a histogram's cells are non-negative and sum to n exactly; a
    multiple choice's column (one option in every group) to at most n; an
    integer's cells to at most n·max; a points question's cells to at most n·total.

    From the collect path, with each task's decoded aggregate and report count:

        plan = breakdown_plan(
            q.kind, categories, g.kind, groups, n, top,
            breakdown_noise_plan.total_noise(),
            q_noise_plan.total_noise() if same_respondents(n, n_q) else None,
            g_noise_plan.total_noise() if same_respondents(n, n_g) else None,
            confidence, simultaneous=True,
        )
        values = {"question": q_decoded, "group": g_decoded}
        result = plan.apply(cells_decoded, [values[m.name] for m in plan.margins])

    `result.shown_cells` and `result.shown_margins` are what to publish (the
    question's and the group's totals among them), `result.cells` and
    `result.margins` the reconciled unbiased values; the raw releases' own
    estimates (veil.dp.estimate) are kept beside them.
    """
    crossing = Crossing(
        "question", question_kind, categories, "group", group_kind, groups, report_count, top,
        breakdown,
    )  # fmt: skip
    releases = {k: v for k, v in (("question", question), ("group", group)) if v is not None}
    return joint_plan([crossing], releases, confidence, simultaneous=simultaneous)


@dataclass(frozen=True)
class Crossing:
    """One breakdown of a joint plan: its question (the key of its release, its
    kind and categories) by its group question (key, kind, groups), its report
    count, `top` (the most one respondent adds to a cell) and its total noise per
    cell. Cells are laid out as `breakdown_plan` says."""

    question: str
    question_kind: str
    categories: int
    group: str
    group_kind: str
    groups: int
    report_count: int
    top: int
    noise: TotalNoise

    def __post_init__(self) -> None:
        q, g = self.question_kind, self.group_kind
        if q not in BREAKDOWN_QUESTION_KINDS:
            raise InvalidParameter(f"no breakdown of a {q!r} question")
        if g not in BREAKDOWN_GROUP_KINDS:
            raise InvalidParameter(
                f"a breakdown's groups come from a yes_no or choice question, not {g!r}"
            )
        if self.question == self.group:
            raise InvalidParameter(f"a breakdown of {self.question!r} by itself")
        for what in ("categories", "groups", "top"):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParameter(f"{what} must be an int >= 1, got {value!r}")
        n = self.report_count
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidParameter(f"report_count must be an int >= 0, got {n!r}")
        if (q == "yes_no" and self.categories != 2) or (g == "yes_no" and self.groups != 2):
            raise InvalidParameter("a yes_no question has two cells: no, yes")
        if q == "integer" and self.categories != 1:
            raise InvalidParameter("an integer question's breakdown has one cell per group")
        if self.histogram and self.top != 1:
            raise InvalidParameter("a histogram breakdown counts respondents: top is 1")

    @property
    def histogram(self) -> bool:
        """Whether its cells count respondents, one cell each (Q yes_no or choice)."""
        return self.question_kind in ("yes_no", "choice")

    @property
    def size(self) -> int:
        return self.groups * self.categories


def joint_plan(
    crossings: Sequence[Crossing],
    releases: Mapping[str, TotalNoise],
    confidence: float = 0.95,
    *,
    simultaneous: bool = False,
) -> ReconcilePlan:
    """The plan for breakdowns reconciled together with the questions they cross.

    The cells are each crossing's, one after the other (`ReconcilePlan.pieces`).
    `releases` holds the total noise of each question's release that is a margin
    (its respondents the breakdowns'; `same_respondents`), by key. A release
    measures a crossing's column sums where it is its question, its row sums where
    it is its group and the crossing a histogram, as in `breakdown_plan`. Measured
    by two crossings or more, a release is one margin (over the first one's cells)
    and the others' sums are tied to the first's (equal, a fact: the same
    respondents' totals), so the least squares weigh every release at once.

    The cut keeps the ties: a shared release's totals are cut once, to their range,
    and each crossing's cells onto them (`Block.link`), in rationals; a histogram
    crossing whose question and group are both shared is cut onto its row and
    column totals at once (`_transport`, to 1e-12 of n).
    """
    crossings = list(crossings)
    if not crossings:
        raise InvalidParameter("a joint plan reconciles one breakdown or more")
    offsets = np.cumsum([0] + [c.size for c in crossings])
    total = int(offsets[-1])
    # key -> [(crossing, its full totals over the cells: one row per option)]
    measures: dict[str, list[tuple[int, FloatArray, int]]] = {}
    for i, c in enumerate(crossings):
        grid = offsets[i] + np.arange(c.size).reshape(c.groups, c.categories)
        roles = [(c.question, grid.T, c.top)]
        if c.histogram:
            roles.append((c.group, grid, 1))
        for key, lines, top in roles:
            if key in releases:
                full = np.array([np.isin(np.arange(total), line) for line in lines], dtype=float)
                measures.setdefault(key, []).append((i, full, top))
    shared = {k for k, ms in measures.items() if len(ms) > 1}
    kinds = {c.question: c.question_kind for c in crossings}
    kinds |= {c.group: c.group_kind for c in crossings}
    margins, ties = [], []
    for key, ms in measures.items():
        first, full, top = ms[0]
        if any(crossings[i].report_count != crossings[first].report_count for i, _, _ in ms):
            raise InvalidParameter(
                f"breakdowns measuring the release {key!r} have different report counts:"
                " they do not hold the same respondents"
            )
        measured = [1] if kinds[key] == "yes_no" else list(range(full.shape[0]))
        n = crossings[first].report_count
        margins.append(
            Margin(full[measured], releases[key], n * top, key,
                   tuple(other[measured] for _, other, _ in ms[1:]))
        )  # fmt: skip
        ties += [row for _, other, _ in ms[1:] for row in full - other]
    blocks = []
    for i, c in enumerate(crossings):
        grid = offsets[i] + np.arange(c.size).reshape(c.groups, c.categories)
        n, everything = c.report_count, tuple(range(int(offsets[i]), int(offsets[i + 1])))
        columns = tuple(tuple(int(j) for j in grid[:, col]) for col in range(c.categories))
        rows = tuple(tuple(int(j) for j in grid[g, :]) for g in range(c.groups))
        on_question = c.question in shared
        if c.histogram:
            if on_question and c.group in shared:
                blocks.append(Block(everything, n, True, columns, c.question, rows, c.group))
            elif on_question:
                blocks.append(Block(everything, n, True, columns, c.question))
            elif c.group in shared:
                blocks.append(Block(everything, n, True, rows, c.group))
            else:
                blocks.append(Block(everything, n, exact=True))
        elif c.question_kind == "multi_choice":
            blocks += [
                Block(col, n, parts=(col,), link=f"{c.question}#{j}" if on_question else None)
                for j, col in enumerate(columns)
            ]
        else:
            link = c.question if on_question else None
            blocks.append(Block(everything, n * c.top, parts=columns, link=link))
    pieces = [
        (range(int(offsets[i]), int(offsets[i + 1])), c.noise) for i, c in enumerate(crossings)
    ]
    return ReconcilePlan(
        total, pieces, margins, blocks, confidence, simultaneous=simultaneous,
        ties=np.array(ties).reshape(len(ties), total),
    )  # fmt: skip
