"""Presenting survey results: a text table, JSON, and plots.

A result pairs, per question, the exact aggregate of the simulated or known
answers (``truth``, when there is one) with the collector's DP estimate and
its confidence interval. Integer questions are shown as means (sum divided
by the published report count), the other kinds as counts or sums per
option or coordinate.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from veil.survey.plan import ExpectedError

Number = float | int
Value = Number | list[Number]


@dataclass(frozen=True)
class QuestionResult:
    """One question's result. `epsilon` is the question's ε against the collector:
    pure ε-DP, or, when `rho` is set (zCDP, the gaussian mechanism), the ε that ρ
    implies at `delta`."""

    question: str
    kind: str
    truth: Value | None
    estimate: Value
    ci_low: Value
    ci_high: Value
    epsilon: float
    reports: int
    labels: tuple[str, ...] = ()  # option names or coordinate labels for vectors
    rho: float | None = None
    delta: float | None = None
    # "per-coordinate", or "simultaneous (...)": all rows of the question at once.
    intervals: str = "per-coordinate"
    text: str = ""  # the question's own words, for plots
    # The unbiased estimates before they were kept within the possible range
    # (veil.collector.results); None where the rows are ratios (add_remove).
    raw_estimate: Value | None = None
    raw_ci_low: Value | None = None
    raw_ci_high: Value | None = None
    # Noise spans more than half of a row's possible range (veil.collector.results.BANNER).
    indicative: bool = False

    def budget_label(self) -> str:
        """ "ε=0.4", or "ρ=0.1 (ε=2.1, δ=1e-06)" for zCDP; "none" without DP."""
        if self.rho is not None:
            return f"ρ={self.rho:.3g} (ε={self.epsilon:.3g}, δ={self.delta:.3g})"
        if self.epsilon == 0:
            return "none"
        return f"ε={self.epsilon:.3g}"

    def rows(self) -> list[tuple[str, Number | None, Number, Number, Number]]:
        """(label, truth, estimate, low, high) per scalar shown."""
        if not isinstance(self.estimate, list):
            assert not isinstance(self.ci_low, list) and not isinstance(self.ci_high, list)
            t = self.truth if not isinstance(self.truth, list) else None
            # What the one number is, as `veil survey collect` labels it too.
            label = {"yes_no": "yes", "integer": "mean"}.get(self.kind, "")
            return [(label, t, self.estimate, self.ci_low, self.ci_high)]
        assert isinstance(self.ci_low, list) and isinstance(self.ci_high, list)
        labels = self.labels or tuple(f"[{i}]" for i in range(len(self.estimate)))
        truths: Sequence[Number | None] = (
            self.truth if isinstance(self.truth, list) else [None] * len(self.estimate)
        )
        return list(zip(labels, truths, self.estimate, self.ci_low, self.ci_high, strict=True))


def _fmt(x: Number | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, int) or float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.2f}"


def format_table(results: Sequence[QuestionResult], confidence: Fraction | float = 0.95) -> str:
    """A plain-text table, one block per question."""
    level = f"{float(confidence) * 100:g}% CI"
    header = ("question", "answer", "truth", "estimate", level, "privacy")
    lines: list[tuple[str, ...]] = [header]
    for r in results:
        for i, (label, t, est, lo, hi) in enumerate(r.rows()):
            name = r.question if i == 0 else ""
            eps = r.budget_label() if i == 0 else ""
            lines.append((name, label, _fmt(t), _fmt(est), f"[{_fmt(lo)}, {_fmt(hi)}]", eps))
    widths = [max(len(row[c]) for row in lines) for c in range(len(header))]
    out = []
    for j, row in enumerate(lines):
        out.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    from veil.collector.results import BANNER

    noisy = [r.question for r in results if r.indicative]
    if noisy:
        out.append(f"{', '.join(noisy)}: {BANNER}.")
    if any(lo < 0 for r in results for (_, _, _, lo, _) in r.rows()):
        out.append(
            "An interval may reach below 0: the noise is symmetric; the true value never does."
        )
    if any(not lo <= est <= hi for r in results for (_, _, est, lo, hi) in r.rows()):
        # Local-layer intervals are cut to the values the truth can take; the
        # de-biased estimate is not, so that it stays unbiased.
        out.append(
            "An estimate may lie outside its interval: it is unbiased, so it can fall"
            " outside the possible range (below 0), to which the interval is cut."
        )
    kinds = sorted({r.intervals for r in results if len(r.rows()) > 1})
    if kinds:
        out.append(
            f"{level}: "
            + "; ".join(
                "each row on its own"
                if k == "per-coordinate"
                else f"{k}: all rows of a question at once"
                for k in kinds
            )
        )
    return "\n".join(out)


def to_json(results: Sequence[QuestionResult]) -> str:
    """One JSON list, an object per question with the documented keys: `labels`
    (what each number is: a list beside a list of estimates), `epsilon` (against
    the collector), and for a zCDP question also `rho` and `delta` (then
    `epsilon` is the ε that ρ implies at that δ)."""
    keys = ("question", "kind", "truth", "estimate", "ci_low", "ci_high", "intervals", "epsilon")
    out = []
    for r in results:
        row = {k: asdict(r)[k] for k in keys}
        # What each number is (an option, an element, "yes", "mean"): a list's
        # numbers were otherwise anonymous.
        labels = [label for (label, *_rest) in r.rows()]
        row["labels"] = labels if isinstance(r.estimate, list) else labels[0]
        if r.raw_estimate is not None:
            row["raw_estimate"] = r.raw_estimate
            row["raw_ci_low"] = r.raw_ci_low
            row["raw_ci_high"] = r.raw_ci_high
        row["indicative_only"] = r.indicative
        if r.rho is not None:
            row["rho"] = r.rho
            row["delta"] = r.delta
        out.append(row)
    return json.dumps(out, indent=2)


def _axis_label(r: QuestionResult) -> str:
    """What a result's numbers are, with their unit."""
    if r.kind in ("integer", "vector"):
        return "mean answer (question's own scale)"
    return "respondents (count)"


def plot_results(results: Sequence[QuestionResult], path: str | Path) -> None:
    """Estimate (with its interval) against truth, one panel per question,
    written as a PNG of 1200 x (400 * rows) pixels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 2
    rows = max(1, -(-len(results) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(12, 4 * rows), dpi=100, squeeze=False)
    for ax, r in zip(axes.flat, results, strict=False):
        data = r.rows()
        xs = list(range(len(data)))
        est = [d[2] for d in data]
        kind = "simultaneous" if r.intervals != "per-coordinate" and len(data) > 1 else ""
        label = f"DP estimate (95% {kind} CI)".replace("  ", " ")
        # The interval is drawn around its own middle, not the estimate: a local
        # layer's unbiased estimate may lie outside its interval (cut to the
        # possible range), which errorbar's yerr cannot express.
        mid = [(d[3] + d[4]) / 2 for d in data]
        half = [(d[4] - d[3]) / 2 for d in data]
        ax.errorbar(xs, mid, yerr=half, fmt="none", ecolor="C0", capsize=4)
        ax.plot(xs, est, "o", color="C0", label=label)
        truths = [d[1] for d in data]
        if all(t is not None for t in truths):
            ax.scatter(xs, truths, marker="x", color="black", zorder=3, label="truth")
        ax.set_xticks(xs, [d[0] or r.question for d in data], rotation=30, ha="right")
        title = r.text or r.question
        if len(title) > 60:
            title = title[:59] + "…"
        ax.set_title(
            f"{title}\n{r.question} ({r.kind}), n = {r.reports:,}, {r.budget_label()}",
            fontsize="medium",
        )
        ax.set_ylabel(_axis_label(r))
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(results) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)


def format_sweep(errors: Sequence[ExpectedError], respondents: int) -> str:
    """`veil simulate --sweep-epsilon` without --plot: the same figures as a table,
    one row per question and ε, errors as a share of the question's scale."""
    header = ("question", "survey ε", "median error", "90% of errors", "of")
    rows: list[tuple[str, ...]] = [header]
    order = {name: i for i, name in enumerate(dict.fromkeys(e.question for e in errors))}
    for e in sorted(errors, key=lambda e: (order[e.question], e.epsilon)):
        rows.append((e.question, f"{e.epsilon:g}", f"{e.median:.2%}", f"{e.p90:.2%}", e.unit))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        f"Expected error of each question at {respondents:,} respondents (exact, from the"
        " noise; --plot FILE draws it)"
    ]
    for j, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plot_sweep(errors: Sequence[ExpectedError], respondents: int, path: str | Path) -> None:
    """The expected error of each question against the survey's total ε, relative
    to the question's scale, with the band from the median to the 90th percentile
    of the error, computed exactly from the noise distribution (see
    `veil.survey.plan.expected_errors`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=100)
    names = list(dict.fromkeys(e.question for e in errors))
    for name in names:
        rows = sorted((e for e in errors if e.question == name), key=lambda e: e.epsilon)
        xs = [e.epsilon for e in rows]
        label = rows[0].text if len(rows[0].text) <= 48 else rows[0].text[:47] + "…"
        (line,) = ax.plot(xs, [e.median * 100 for e in rows], marker="o", label=label)
        ax.fill_between(
            xs,
            [e.median * 100 for e in rows],
            [e.p90 * 100 for e in rows],
            color=line.get_color(),
            alpha=0.15,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    epsilons = sorted({e.epsilon for e in errors})
    ax.set_xticks(epsilons, [f"{x:g}" for x in epsilons])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))
    ax.set_xlabel("survey's total ε (for zCDP: the ε of its (ε, δ) guarantee)")
    ax.set_ylabel(
        "expected error, % of scale\n(counts: of respondents; means: of the answer range)"
    )
    ax.set_title(
        f"Expected error of each question at {respondents:,} respondents\n"
        "line: median error; band: up to the 90th percentile (exact, from the noise)"
    )
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
