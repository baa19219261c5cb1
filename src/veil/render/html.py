"""RESULTS/report.html of `veil survey collect`: one page that works offline.

It shows the questions' `veil.survey.results.QuestionResult`s, as results.json
holds them.

Every figure is inline SVG drawn here (no script, no external asset, no
font to fetch), and reads on its own: the question's words as its title, the
unit on the axis, each estimate as a bar with its confidence interval drawn
across it, n beside it.

A breakdown is a table first (a row per group, a column per category, each
cell's estimate with its interval under it), the primary view for every reader;
its heat map beneath repeats the estimates as shades (darker: more), labelled
and described for a screen reader, each cell's value in its tooltip.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from html import escape

from veil.survey.model import Survey
from veil.survey.results import QuestionResult
from veil.survey.statement import privacy_statement, public_sentences
from veil.survey.tasks import question_charged
from veil.times import format_time

WIDTH = 720
LABEL_WIDTH = 190
ROW = 30
TOP = 46
BOTTOM = 52
RIGHT = 30

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto;
       max-width: 52rem; padding: 0 1rem; color: #1d232b; line-height: 1.45; }
h1 { margin-bottom: 0.2rem; }
.meta { color: #4a5562; margin-top: 0; }
section { border-top: 1px solid #d5dbe1; padding-top: 1rem; margin-top: 1.5rem; }
table { border-collapse: collapse; margin-top: 0.5rem; font-variant-numeric: tabular-nums; }
td, th { padding: 0.15rem 0.8rem 0.15rem 0; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.privacy { background: #f2f6f9; border-left: 4px solid #3b6e99; padding: 0.6rem 1rem; }
.privacy details { margin: 0.5rem 0; color: #33404d; }
.privacy summary { cursor: pointer; font-weight: 600; }
.banner { background: #fff4e0; border-left: 4px solid #a05a00; padding: 0.5rem 1rem;
          font-weight: 600; }
table.breakdown td { vertical-align: top; }
table.breakdown .ci { display: block; color: #4a5562; font-size: 0.85em; }
table.breakdown caption { text-align: left; color: #4a5562; }
svg text { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; }
"""


def _nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    t = first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 10))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def _num(x: float) -> str:
    """Three significant digits, no exponent for everyday sizes."""
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def chart(r: QuestionResult) -> str:
    """A horizontal bar chart of one question's rows, intervals drawn."""
    rows = r.shown
    lo = min(0.0, *(row.ci_low for row in rows))
    hi = max(1.0, *(row.ci_high for row in rows))
    ticks = _nice_ticks(lo, hi)
    lo, hi = min(lo, ticks[0]), max(hi, ticks[-1])
    plot_w = WIDTH - LABEL_WIDTH - RIGHT
    height = TOP + ROW * len(rows) + BOTTOM

    def x(v: float) -> float:
        return LABEL_WIDTH + (v - lo) / (hi - lo) * plot_w

    title = r.question.text
    if len(title) > 95:
        title = title[:94] + "…"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}"'
        f' viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(r.question.text)}">',
        f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>',
        '<text x="8" y="20" font-size="15" font-weight="600" fill="#1d232b">'
        f"{escape(title)}</text>",
        f'<text x="8" y="38" font-size="12" fill="#4a5562">n = {r.n} reports;'
        f" bars: estimates; lines: {r.confidence:.0%} confidence intervals ({r.intervals})"
        "</text>",
    ]
    bottom = TOP + ROW * len(rows)
    for t in ticks:
        tx = x(t)
        parts.append(
            f'<line x1="{tx:.1f}" y1="{TOP - 4}" x2="{tx:.1f}" y2="{bottom}" stroke="#e3e8ed"/>'
            f'<text x="{tx:.1f}" y="{bottom + 16}" font-size="11" text-anchor="middle"'
            f' fill="#4a5562">{_num(t)}</text>'
        )
    parts.append(
        f'<line x1="{x(0):.1f}" y1="{TOP - 4}" x2="{x(0):.1f}" y2="{bottom}" stroke="#8a96a3"/>'
        f'<text x="{LABEL_WIDTH + plot_w / 2:.1f}" y="{bottom + 38}" font-size="12"'
        f' text-anchor="middle" fill="#1d232b">{escape(r.unit)}</text>'
    )
    for i, row in enumerate(rows):
        cy = TOP + ROW * i + ROW / 2
        label = row.label if len(row.label) <= 26 else row.label[:25] + "…"
        x0, xe = sorted((x(0), x(row.estimate)))
        parts.append(
            f'<text x="{LABEL_WIDTH - 8}" y="{cy + 4:.1f}" font-size="12" text-anchor="end"'
            f' fill="#1d232b">{escape(label)}</text>'
            f'<rect x="{x0:.1f}" y="{cy - 9:.1f}" width="{max(xe - x0, 1):.1f}" height="18"'
            f' fill="#6b9ac4"><title>{escape(row.label)}: {_num(row.estimate)}'
            f" [{_num(row.ci_low)}, {_num(row.ci_high)}]</title></rect>"
            f'<line x1="{x(row.ci_low):.1f}" y1="{cy:.1f}" x2="{x(row.ci_high):.1f}"'
            f' y2="{cy:.1f}" stroke="#1d3b57" stroke-width="2"/>'
            f'<line x1="{x(row.ci_low):.1f}" y1="{cy - 6:.1f}" x2="{x(row.ci_low):.1f}"'
            f' y2="{cy + 6:.1f}" stroke="#1d3b57" stroke-width="2"/>'
            f'<line x1="{x(row.ci_high):.1f}" y1="{cy - 6:.1f}" x2="{x(row.ci_high):.1f}"'
            f' y2="{cy + 6:.1f}" stroke="#1d3b57" stroke-width="2"/>'
        )
    parts.append("</svg>")
    return "".join(parts)


# The heat map's shades, lightest (least) to darkest (most): one hue, so that
# order reads without colour vision; the values are in the table above it.
SHADES = ("#f1f6fb", "#d3e3f1", "#a9c8e3", "#75a5cf", "#3f78b0", "#1d4f80")
CELL_W = 96
CELL_H = 26


def breakdown_table(r: QuestionResult) -> str:
    """A breakdown's cells as a table: a row per group, a column per category."""
    assert r.question.by is not None
    groups, categories = r.table
    head = "".join(f'<th scope="col">{escape(c)}</th>' for c in categories)
    body = []
    for i, g in enumerate(groups):
        cells = r.rows[i * len(categories) : (i + 1) * len(categories)]
        tds = "".join(
            f"<td>{_num(row.estimate)}"
            f'<span class="ci">{_num(row.ci_low)} to {_num(row.ci_high)}</span></td>'
            for row in cells
        )
        body.append(f'<tr><th scope="row">{escape(g)}</th>{tds}</tr>')
    return (
        f'<table class="breakdown"><caption>{escape(r.unit)} in each cell, with its'
        f" {r.confidence:.0%} interval under it; rows: {escape(r.question.by.text)}</caption>"
        f'<thead><tr><th scope="col">group</th>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def heat_map(r: QuestionResult) -> str:
    """A breakdown's estimates as shades of one hue (the table gives the values)."""
    groups, categories = r.table
    top = max((row.estimate for row in r.rows), default=0.0)
    left = LABEL_WIDTH
    width = left + CELL_W * len(categories) + RIGHT
    height = TOP + CELL_H * len(groups) + 12
    label = (
        f"Heat map of {r.question.text}: darker cells hold more {r.unit}; the table above"
        " gives each value"
    )
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="8" y="18" font-size="12" fill="#4a5562">darker: more'
        f" (lightest 0, darkest {_num(top)})</text>",
    ]
    for j, c in enumerate(categories):
        cx = left + CELL_W * j + CELL_W / 2
        name = c if len(c) <= 14 else c[:13] + "…"
        parts.append(
            f'<text x="{cx:.1f}" y="{TOP - 8}" font-size="12" text-anchor="middle"'
            f' fill="#1d232b">{escape(name)}</text>'
        )
    for i, g in enumerate(groups):
        y = TOP + CELL_H * i
        name = g if len(g) <= 26 else g[:25] + "…"
        parts.append(
            f'<text x="{left - 8}" y="{y + CELL_H / 2 + 4:.1f}" font-size="12"'
            f' text-anchor="end" fill="#1d232b">{escape(name)}</text>'
        )
        for j in range(len(categories)):
            row = r.rows[i * len(categories) + j]
            share = row.estimate / top if top > 0 else 0.0
            shade = SHADES[min(len(SHADES) - 1, int(share * len(SHADES)))]
            parts.append(
                f'<rect x="{left + CELL_W * j}" y="{y}" width="{CELL_W - 2}"'
                f' height="{CELL_H - 2}" fill="{shade}" stroke="#8a96a3" stroke-width="0.5">'
                f"<title>{escape(row.label)}: {_num(row.estimate)}"
                f" [{_num(row.ci_low)}, {_num(row.ci_high)}]</title></rect>"
            )
    parts.append("</svg>")
    return "".join(parts)


def _spent(survey: Survey, results: Sequence[QuestionResult]) -> str:
    """The budget these collections charged the ledgers (a text question: the levels
    it queried), against the survey's total, as `veil survey status` counts it."""
    if survey.mechanism == "none" or survey.total is None:
        return "no noise, no privacy budget"
    symbol = "ρ" if survey.zcdp else "ε"
    spent = sum(
        (question_charged(survey, r.question, r.collections)[1] for r in results), Fraction(0)
    )
    return f"budget spent {symbol} = {float(spent):.4g} of the survey's {float(survey.total):.4g}"


def _budget(text: str) -> str:
    """A budget from results.json (a decimal string, exact there) as a reader
    takes it in: 3 significant digits, or the word it already is ("none")."""
    try:
        return _num(float(text))
    except ValueError:
        return escape(text)


def _counted(results: Sequence[QuestionResult]) -> str:
    """ "5 questions", and ", 1 breakdown" where there are breakdowns."""
    breakdowns = sum(1 for r in results if r.question.kind == "breakdown")
    words = f"{len(results) - breakdowns} questions"
    if breakdowns:
        words += f" and {breakdowns} breakdown{'s' if breakdowns > 1 else ''}"
    return words


def privacy_lines(survey: Survey) -> list[str]:
    """The survey's privacy statement in plain words (veil.survey.statement), and what
    the intervals mean."""
    lines = privacy_statement(survey).lines()
    if survey.mechanism != "none":
        lines.append(
            "Each figure is an estimate with noise added by each aggregator on its own, kept"
            " within what is possible (a count from 0 to the number of respondents, a mean"
            " within the answers' scale, a single choice's counts adding up to the respondents);"
            " each interval is cut to the same range. results.json keeps the raw unbiased"
            " estimates beside them."
        )
        if survey.breakdowns:
            lines.append(
                "Where a breakdown counts the same respondents as a question it crosses, the"
                " two are reconciled, weighted by their exact noise, so that the question's"
                " totals are the sums of the breakdown's cells, each at least as precise as"
                " on its own (results.json names them under reconciled_with)."
            )
    return lines


def privacy_box(survey: Survey) -> str:
    """The privacy box: the statement in plain sentences first, the exact one (for
    auditors) in a details section under it."""
    return (
        '<div class="privacy" role="note" aria-label="Privacy">'
        + "".join(f"<p>{escape(line)}</p>" for line in public_sentences(survey))
        + "<details><summary>The exact privacy statement, for auditors</summary>"
        + "".join(f"<p>{escape(line)}</p>" for line in privacy_lines(survey))
        + "</details></div>"
    )


def report_html(survey: Survey, results: Sequence[QuestionResult]) -> str:
    """The whole page: the survey's window, budget and privacy statement, then
    each question's chart and table."""
    assert survey.opens is not None and survey.closes is not None
    sections = []
    for r in results:
        privacy = (
            f"ρ = {_budget(r.privacy['rho'])} (ε = {_budget(r.privacy['epsilon'])},"
            f" δ = {r.privacy['delta']})"
            if "rho" in r.privacy
            else f"ε = {_budget(r.privacy['epsilon'])}"
        )
        rows = "".join(
            f"<tr><td>{escape(row.label)}</td><td>{_num(row.estimate)}</td>"
            f"<td>{_num(row.ci_low)} to {_num(row.ci_high)}</td></tr>"
            for row in r.rows
        )
        banner = (
            f'<p class="banner" role="note">{escape(r.note[0].upper() + r.note[1:])}.</p>'
            if r.indicative
            else ""
        )
        figure = chart(r) if r.rows else ""
        # No rows (a text question whose answers were all below the threshold):
        # the sentence above says so; a table of headers alone would say nothing.
        table = (
            f"<table><tr><th>answer</th><th>estimate</th>"
            f"<th>{r.confidence:.0%} interval</th></tr>{rows}</table>"
            if r.rows
            else ""
        )
        if r.question.kind == "breakdown":
            assert r.question.of is not None and r.question.by is not None
            sections.append(
                f"<section><h2>{escape(r.question.text)}</h2>"
                f'<p class="meta">breakdown <code>{escape(r.question.id)}</code>:'
                f" <code>{escape(r.question.of.id)}</code> by"
                f" <code>{escape(r.question.by.id)}</code>, n = {r.n} respondents who answered"
                f" both, {privacy}</p>{banner}{breakdown_table(r)}"
                f'<figure><figcaption class="meta">The same estimates as shades</figcaption>'
                f"{heat_map(r)}</figure></section>"
            )
            continue
        if r.threshold is not None:
            # A text question: its rows are the answers found, and only those.
            found = (
                f"{len(r.rows)} answers found"
                if r.rows
                else "no answer was given often enough to be found"
            )
            banner += (
                f'<p class="meta">{found}: an answer is shown only if its noisy count reached'
                f" {r.threshold.value:,}; one given by a single respondent is shown with"
                f" probability at most {r.threshold.release_probability:.2g}.</p>"
            )
        sections.append(
            f"<section><h2>{escape(r.question.text)}</h2>"
            f'<p class="meta">question <code>{escape(r.question.id)}</code>'
            f" ({escape(r.question.kind.replace('_', ' '))}), n = {r.n} reports,"
            f" {privacy}</p>{banner}{figure}{table}</section>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(survey.name)}: results</title><style>{STYLE}</style></head><body><main>"
        f"<h1>{escape(survey.name)}</h1>"
        f'<p class="meta">Window {format_time(survey.opens)} to {format_time(survey.closes)}'
        f" (UTC); {_counted(results)}; {escape(_spent(survey, results))}.</p>"
        + privacy_box(survey)
        + "".join(sections)
        + "</main></body></html>\n"
    )
