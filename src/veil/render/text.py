"""Survey results and plans as text: the terminal's tables and the demo's JSON.

Every function reads `veil.survey.results.QuestionResult` (or the plan's
figures, veil.survey.plan) and only formats: nothing is computed here that
results.json does not hold. A number the reader is shown is a row of
`QuestionResult.shown`: an integer question reads as its mean, the other
kinds as counts, shares or means per option or element; `truth` is there
when the answers are known (`veil demo`, `veil simulate`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from veil.dp.accounting import zcdp_epsilon
from veil.survey.model import Survey
from veil.survey.plan import ExpectedError, LocalCost, QuestionPlan
from veil.survey.results import BANNER, Number, QuestionResult

# The kinds whose result is one number (the demo's JSON gives it unwrapped).
SCALAR_KINDS = ("yes_no", "integer")


def budget_label(r: QuestionResult) -> str:
    """ "ε=0.4", or "ρ=0.1 (ε=2.1, δ=1e-06)" for zCDP; "none" without DP."""
    g = r.guarantee
    if g.rho is not None:
        assert g.epsilon is not None and g.delta is not None
        return f"ρ={float(g.rho):.3g} (ε={float(g.epsilon):.3g}, δ={float(g.delta):.3g})"
    if not g.epsilon:
        return "none"
    return f"ε={float(g.epsilon):.3g}"


def _fmt(x: Number | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, int) or float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.2f}"


def _rule_table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Columns padded to their widest cell, a rule under the header row."""
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    out = []
    for j, row in enumerate(rows):
        out.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def format_table(results: Sequence[QuestionResult]) -> str:
    """A plain-text table, one block per question (`veil demo`, `veil simulate`)."""
    confidence = results[0].confidence if results else 0.95
    level = f"{confidence * 100:g}% CI"
    header = ("question", "answer", "truth", "estimate", level, "privacy")
    lines: list[tuple[str, ...]] = [header]
    for r in results:
        for i, row in enumerate(r.shown):
            name = r.question.id if i == 0 else ""
            eps = budget_label(r) if i == 0 else ""
            lines.append(
                (
                    name,
                    row.label,
                    _fmt(row.truth),
                    _fmt(row.estimate),
                    f"[{_fmt(row.ci_low)}, {_fmt(row.ci_high)}]",
                    eps,
                )
            )
    out = _rule_table(lines)
    noisy = [r.question.id for r in results if r.indicative]
    if noisy:
        out.append(f"{', '.join(noisy)}: {BANNER}.")
    shown = [row for r in results for row in r.shown]
    if any(row.ci_low < 0 for row in shown):
        out.append(
            "An interval may reach below 0: the noise is symmetric; the true value never does."
        )
    if any(not row.ci_low <= row.estimate <= row.ci_high for row in shown):
        # Local-layer intervals are cut to the values the truth can take; the
        # de-biased estimate is not, so that it stays unbiased.
        out.append(
            "An estimate may lie outside its interval: it is unbiased, so it can fall"
            " outside the possible range (below 0), to which the interval is cut."
        )
    kinds = sorted({r.intervals for r in results if len(r.shown) > 1})
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


def demo_json(results: Sequence[QuestionResult]) -> str:
    """`veil demo --json`: one JSON list, an object per question with the
    documented keys: `truth`, `estimate`, `ci_low`, `ci_high` (a number for a
    yes/no or integer question, else a list beside `labels`, what each number
    is), `epsilon` (against the collector), and for a zCDP question also `rho`
    and `delta` (then `epsilon` is the ε that ρ implies at that δ)."""
    out = []
    for r in results:
        rows = r.shown
        scalar = r.question.kind in SCALAR_KINDS

        def pick(values: list[Any], scalar: bool = scalar) -> Any:
            return values[0] if scalar else values

        truths = [row.truth for row in rows]
        g = r.guarantee
        item: dict[str, Any] = {
            "question": r.question.id,
            "kind": r.question.kind,
            "truth": None if None in truths else pick(truths),
            "estimate": pick([row.estimate for row in rows]),
            "ci_low": pick([row.ci_low for row in rows]),
            "ci_high": pick([row.ci_high for row in rows]),
            "intervals": r.intervals,
            "epsilon": float(g.epsilon or 0),
            "labels": pick([row.label for row in rows]),
        }
        if all(row.raw_estimate is not None for row in rows):
            item["raw_estimate"] = pick([row.raw_estimate for row in rows])
            item["raw_ci_low"] = pick([row.raw_ci_low for row in rows])
            item["raw_ci_high"] = pick([row.raw_ci_high for row in rows])
        item["indicative_only"] = r.indicative
        if g.rho is not None:
            item["rho"] = float(g.rho)
            item["delta"] = float(g.delta) if g.delta is not None else None
        out.append(item)
    return json.dumps(out, indent=2)


def summary_lines(results: Sequence[QuestionResult]) -> list[str]:
    """The terminal summary of `veil survey collect`: per question its n, the
    first rows with their intervals, and the banner where noise dominates."""
    lines = []
    for r in results:
        shown = r.shown
        text = ", ".join(
            f"{row.label} {row.estimate:.3g} [{row.ci_low:.3g}, {row.ci_high:.3g}]"
            for row in shown[:6]
        )
        more = ", ..." if len(shown) > 6 else ""
        if not shown:
            text = "no answer found" if r.question.kind == "text" else "no row"
        lines.append(f"  {r.question.id}: n = {r.n}; {text}{more}")
        if r.indicative:
            lines.append(f"    ({r.note})")
    if results:
        lines.append(
            f"  estimates kept within the possible range, {results[0].confidence:.0%} intervals"
            " in brackets; results.json also keeps the raw unbiased estimates"
        )
    return lines


def format_sweep(errors: Sequence[ExpectedError], respondents: int) -> str:
    """`veil simulate --sweep-epsilon` without --plot: the same figures as a table,
    one row per question and ε, errors as a share of the question's scale."""
    header = ("question", "survey ε", "median error", "90% of errors", "of")
    rows: list[tuple[str, ...]] = [header]
    order = {name: i for i, name in enumerate(dict.fromkeys(e.question for e in errors))}
    for e in sorted(errors, key=lambda e: (order[e.question], e.epsilon)):
        rows.append((e.question, f"{e.epsilon:g}", f"{e.median:.2%}", f"{e.p90:.2%}", e.unit))
    lines = [
        f"Expected error of each question at {respondents:,} respondents (exact, from the"
        " noise; --plot FILE draws it)"
    ]
    return "\n".join(lines + _rule_table(rows))


def format_local_costs(costs: Sequence[LocalCost], respondents: int) -> str:
    """A plain-text table of `veil.survey.plan.local_costs`."""
    header = ("question", "local epsilon", "rms error without", "with local layer", "ratio")
    rows: list[tuple[str, ...]] = [header]
    for c in costs:
        eps = "-" if c.local_epsilon is None else f"{float(c.local_epsilon):g}"
        with_local = "-" if c.with_local is None else f"{c.with_local:.4g}"
        ratio = "-" if c.with_local is None or not c.without else f"{c.with_local / c.without:.3g}x"
        rows.append((c.question, eps, f"{c.without:.4g}", with_local, ratio))
    lines = [
        f"Expected error per result element at {respondents:,} respondents "
        "(root mean square; with the local layer: worst case over the answers)"
    ]
    return "\n".join(lines + _rule_table(rows))


def _amount(x: float) -> str:
    """An error as people read it: ±3, ±0.42, ±1,200."""
    if x == 0:
        return "0"
    if x >= 100:
        return f"±{x:,.0f}"
    return f"±{x:.2g}" if x < 1 else f"±{x:.3g}"


def _budget_symbol(survey: Survey, question: str) -> str:
    """The unit a question's budget is in: ρ for a gaussian question, else ε."""
    q = next(q for q in survey.questions if q.id == question)
    return "ρ" if q.mechanism == "gaussian" else "ε"


def needs_words(survey: Survey, p: QuestionPlan) -> str:
    """A text question that finds nothing at its size, in words."""
    symbol = _budget_symbol(survey, p.question)
    about = (
        "more than 10^12 respondents"
        if p.possible_from is None
        else f"about {p.possible_from:,} respondents"
    )
    return (
        f"at {p.respondents:,} respondents no answer can be found, not even one that every"
        f" respondent gives: this question needs {about} at this {symbol}"
    )


def text_plan_line(survey: Survey, p: QuestionPlan) -> str:
    """What a text question can find at the plan's size, in words."""
    assert p.detection_floor is not None and p.release_probability is not None
    assert p.detection_share is not None and p.threshold is not None
    released = (
        f"an answer is released when its noisy count reaches {p.threshold:,}, and one given by"
        f" a single respondent is released with probability at most {p.release_probability:.2g}"
    )
    if p.impossible:
        floor = (
            ""
            if p.detection_floor == p.possible_from
            else f" (at {p.respondents:,}, an answer needs {p.detection_floor:,} giving it)"
        )
        return (
            f"{p.question} (text): {needs_words(survey, p)}{floor}; {released}; give it more"
            " of the budget (or mechanism gaussian), or expect more respondents"
        )
    return (
        f"{p.question} (text): an answer is found with 95% probability when at least"
        f" {p.detection_floor:,} respondents ({p.detection_share:.2%}) give it (the"
        f" detection floor; target {p.target_error:.2%}); {released}"
    )


def _mechanisms(survey: Survey) -> str:
    """What a survey's text questions use: "gaussian", "geometric", or both."""
    return "/".join(sorted({q.mechanism for q in survey.questions if q.kind == "text"}))


def _stated_epsilon(survey: Survey) -> str:
    """The survey's total as an ε: "ε = 1", or "ε = 1 at δ = 1e-06" under zCDP."""
    if survey.rho is None:
        return f"ε = {float(survey.epsilon or 0):.4g}"
    assert survey.delta is not None
    epsilon = float(zcdp_epsilon(survey.rho, survey.delta))
    return f"ε = {epsilon:.4g} at δ = {float(survey.delta):.2g}"


def format_variant(
    survey: Survey,
    plans: Sequence[QuestionPlan],
    variant: Survey,
    other: Sequence[QuestionPlan],
) -> list[str]:
    """Both choices of mechanism for the text questions side by side: the other
    questions' 95% intervals and each text question's detection floor."""
    now, then = _mechanisms(survey), _mechanisms(variant)
    header = ("question", f"text {now} (as written)", f"text {then}")
    rows: list[tuple[str, ...]] = [header]
    for a, b in zip(plans, other, strict=True):
        if a.detection_floor is not None:
            assert b.detection_floor is not None
            rows.append(
                (
                    a.question,
                    f"found from {a.detection_floor:,}",
                    f"found from {b.detection_floor:,}",
                )
            )
            continue
        change = ""
        x, y = a.raw_half_width, b.raw_half_width
        if x and y and x != y:
            wider = y > x
            ratio = y / x if wider else x / y
            change = f" ({ratio:.2g}x {'wider' if wider else 'narrower'})"
        rows.append((a.question, _amount(a.raw_half_width), _amount(b.raw_half_width) + change))
    return [
        f"the text questions' mechanism, both ways at {plans[0].respondents:,} respondents"
        f" ({_stated_epsilon(survey)} as written, {_stated_epsilon(variant)} with text {then};"
        " the budget shared in the same proportions): the other questions' 95% interval (the"
        " noise's, before it is cut to the possible range), and how many respondents must"
        " give a text answer for it to be found (95%)",
        *_rule_table(rows),
        "gaussian composes over a text question's byte levels far better, and makes the survey"
        " zCDP: a pure question then costs ε²/2 of its ρ, so the other questions get less"
        " (`mechanism` on a text question chooses)",
    ]


def format_plan(
    survey: Survey,
    plans: Sequence[QuestionPlan],
    variant: tuple[Survey, Sequence[QuestionPlan]] | None = None,
) -> str:
    """The plan as a plain-text table, one row per question, and what to do; with
    `variant` (the survey with its text questions on the other mechanism, and its
    plans) both choices side by side."""
    if not plans:
        return ""
    n = plans[0].respondents
    header = (
        "question",
        "unit",
        "median error",
        "90% of errors",
        "95% interval",
        "target",
        "respondents needed",
    )
    rows: list[tuple[str, ...]] = [header]
    for p in plans:
        needed = "never" if p.needed is None else f"{p.needed:,}"
        rows.append(
            (
                p.question,
                p.unit,
                _amount(p.median),
                _amount(p.p90),
                _amount(p.half_width),
                f"{_amount(p.target)} ({p.target_error:.0%})",
                needed,
            )
        )
    lines = [
        f"{survey.name}: expected accuracy at {n:,} respondents"
        " (exact, from the noise; each row in the question's own units)",
        *_rule_table(rows),
    ]
    lines += [
        "errors: how far one estimate falls from the truth, half the time and 9 times in 10"
        " (at most the range: a published estimate is kept within it)",
        "95% interval: half its width as published, every row of a question at once; it is"
        " cut to the possible range, so never more than half of it",
        "target: the half-width aimed at, a share of the range (0 to n for counts, the scale"
        " for means)",
    ]
    if any(p.kind == "breakdown" for p in plans):
        lines.append(
            "a breakdown's rows are its cells: its target is a share of what a cell holds when"
            " the answers spread evenly over the cells"
        )
    gains = [p for p in plans if p.reconciled_half_width is not None]
    if gains:
        lines.append(
            "reconciled, as collect publishes a breakdown with the questions it measures"
            " again (every one answered by all the respondents), the 95% intervals narrow: "
            + ", ".join(
                f"{p.question} {_amount(p.half_width)} → {_amount(p.reconciled_half_width or 0)}"
                for p in gains
            )
        )
    cut = [p for p in plans if p.raw_half_width > p.half_width]
    if cut:
        lines.append(
            f"at {n:,} respondents the noise alone spans more than the possible range of: "
            + ", ".join(f"{p.question} ({_amount(p.raw_half_width)})" for p in cut)
            + "; their published intervals are cut to it, and say little"
        )
    if n < survey.min_batch_size:
        lines.append(
            f"at {n:,} respondents nothing is released: the survey's min_batch_size is"
            f" {survey.min_batch_size:,} (each aggregator refuses a smaller batch)"
        )
    short = [p for p in plans if not p.reaches_target]
    if short:
        lines.append(
            f"at {n:,} respondents these questions miss their target: "
            + ", ".join(
                f"{p.question} (needs {'more than 10^12' if p.needed is None else f'{p.needed:,}'})"
                for p in short
            )
            + "; give them more of the budget, more respondents, or fewer questions"
        )
    for p in plans:
        if p.detection_floor is None:
            continue
        lines.append(text_plan_line(survey, p))
    noisy = [p.question for p in plans if p.indicative and p.kind != "breakdown"]
    crowded = [p for p in plans if p.indicative and p.kind == "breakdown"]
    if crowded:
        lines.append(
            f"warning: at {n:,} respondents the cells of these breakdowns will be"
            " noise-dominated (the interval's half-width reaches what a cell holds when the"
            " answers spread evenly): "
            + ", ".join(
                f"{p.question} ({_amount(p.half_width)} against {p.cell_share or 0:,.3g} per cell)"
                for p in crowded
            )
            + "; give them more of the budget, fewer groups, or more respondents"
        )
    if noisy:
        lines.append(
            f"results at {n:,} respondents will be marked indicative only (the interval spans"
            f" over half the range): {', '.join(noisy)}"
        )
    if variant is not None:
        lines += format_variant(survey, plans, *variant)
    return "\n".join(lines)
