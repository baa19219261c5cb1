"""Survey results and plans as PNG figures (matplotlib, the `plots` extra).

Each figure reads on its own: the question's words as its title, the unit on
the axis, each estimate with its interval drawn, and the truth where it is
known (`veil simulate --plot`, `--sweep-epsilon --plot`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from veil.render.text import budget_label
from veil.survey.plan import ExpectedError
from veil.survey.results import QuestionResult


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
        data = r.shown
        q = r.question
        xs = list(range(len(data)))
        kind = "simultaneous" if r.intervals != "per-coordinate" and len(data) > 1 else ""
        label = f"DP estimate ({r.confidence:.0%} {kind} CI)".replace("  ", " ")
        # The interval is drawn around its own middle, not the estimate: a local
        # layer's unbiased estimate may lie outside its interval (cut to the
        # possible range), which errorbar's yerr cannot express.
        mid = [(d.ci_low + d.ci_high) / 2 for d in data]
        half = [(d.ci_high - d.ci_low) / 2 for d in data]
        ax.errorbar(xs, mid, yerr=half, fmt="none", ecolor="C0", capsize=4)
        ax.plot(xs, [d.estimate for d in data], "o", color="C0", label=label)
        truths = [d.truth for d in data]
        if all(t is not None for t in truths):
            ax.scatter(xs, truths, marker="x", color="black", zorder=3, label="truth")
        ax.set_xticks(xs, [d.label or q.id for d in data], rotation=30, ha="right")
        title = q.text or q.id
        if len(title) > 60:
            title = title[:59] + "…"
        ax.set_title(
            f"{title}\n{q.id} ({q.kind}), n = {r.n:,}, {budget_label(r)}",
            fontsize="medium",
        )
        ax.set_ylabel(r.unit)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(results) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)


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
