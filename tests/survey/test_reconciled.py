"""A survey's breakdowns published with the questions they cross as one set
(veil.survey.reconciled): the questions' totals are the sums of the breakdowns'
published cells, the raw releases stay, breakdowns that measure one question are
reconciled together, and a release that is not a margin (other respondents) is
left as it was."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import pytest

from veil.dp.accounting import Guarantee
from veil.dp.estimates import estimate
from veil.observations import load_inventory, unclassified
from veil.render.html import report_html
from veil.render.text import _amount, format_plan
from veil.survey import Survey, parse_survey, reconciled
from veil.survey.plan import plan_json, plan_survey
from veil.survey.reconciled import BONFERRONI, reconcile_results
from veil.survey.results import QuestionResult, question_result, results_json
from veil.survey.tasks import question_task

SURVEY = """\
[survey]
name = "t"
epsilon = 3
min_batch_size = 10
opens = 2026-12-01T00:00:00Z
closes = 2026-12-02T00:00:00Z

[[question]]
id = "team"
kind = "choice"
options = ["eng", "design", "sales"]

[[question]]
id = "remote"
kind = "yes_no"

[[question]]
id = "hours"
kind = "integer"
max = 60

[[question]]
id = "budget"
kind = "points"
options = ["pay", "tools"]
total = 10

[[breakdown]]
id = "remote_by_team"
question = "remote"
by = "team"

[[breakdown]]
id = "hours_by_remote"
question = "hours"
by = "remote"

[[breakdown]]
id = "budget_by_team"
question = "budget"
by = "team"
"""


@dataclass(frozen=True)
class Released:
    """A collection as the collector gives it (veil.collector.CollectionResult's
    fields that results read), its intervals from the task's own noise."""

    report_count: int
    estimate: Any
    lower: Any
    upper: Any
    confidence: float = 0.95
    intervals: str = "simultaneous (exact max-of-k)"
    against_collector: Guarantee = field(default_factory=lambda: Guarantee.pure(Fraction(1, 2)))


def _released(survey: Survey, qid: str, n: int, values: list[int]) -> Released:
    q = next(x for x in survey.tasked if x.id == qid)
    vdaf, dp, _ = question_task(survey, q)
    est = estimate(values, dp.plan(vdaf), 0.05, simultaneous=True)
    one = len(values) == 1 and q.kind != "breakdown"

    def pick(xs: list[Fraction]) -> Any:
        return xs[0] if one else xs

    return Released(
        n,
        pick([e.value for e in est]),
        pick([e.low for e in est]),
        pick([e.high for e in est]),
    )


def _results(
    survey: Survey, collected: dict[str, Released]
) -> tuple[list[QuestionResult], list[QuestionResult]]:
    results = [question_result(q, collected[q.id]) for q in survey.tasked if q.id in collected]
    return results, reconcile_results(survey, results, collected)


def _rows(results: list[QuestionResult], qid: str) -> list[float]:
    return [row.estimate for r in results if r.question.id == qid for row in r.rows]


def _collected(survey: Survey, n: int = 40) -> dict[str, Released]:
    # Each release a little off the truth, as noise leaves it: team 20/12/8,
    # remote yes 5/3/2 by team, hours 300 (no) and 250 (yes), budget by team.
    return {
        "team": _released(survey, "team", n, [23, 9, 8]),
        "remote": _released(survey, "remote", n, [13]),
        "hours": _released(survey, "hours", n, [530]),
        "budget": _released(survey, "budget", n, [190, 200]),
        "remote_by_team": _released(survey, "remote_by_team", n, [14, 6, 10, 3, 4, 1]),
        "hours_by_remote": _released(survey, "hours_by_remote", n, [310, 260]),
        "budget_by_team": _released(survey, "budget_by_team", n, [90, 110, 70, 40, 40, 50]),
    }


def test_the_questions_totals_are_the_breakdowns_margins() -> None:
    survey = parse_survey(SURVEY, "s.toml")
    before, after = _results(survey, _collected(survey))
    cells = _rows(after, "remote_by_team")  # eng/no, eng/yes, design/no, ...
    assert sum(cells) == pytest.approx(40, abs=1e-5)
    assert _rows(after, "remote") == pytest.approx([cells[1] + cells[3] + cells[5]], abs=1e-5)
    assert _rows(after, "team") == pytest.approx(
        [cells[0] + cells[1], cells[2] + cells[3], cells[4] + cells[5]], abs=1e-5
    )
    mean, total = _rows(after, "hours")
    by_remote = _rows(after, "hours_by_remote")
    assert total == pytest.approx(sum(by_remote), abs=1e-5)
    assert mean == pytest.approx(total / 40, abs=1e-5)
    budget = _rows(after, "budget_by_team")
    assert [x * 40 for x in _rows(after, "budget")] == pytest.approx(
        [budget[0] + budget[2] + budget[4], budget[1] + budget[3] + budget[5]], abs=1e-4
    )
    # The raw releases are kept beside them, unchanged.
    for old, new in zip(before, after, strict=True):
        assert [row.raw_estimate for row in new.rows] == [row.raw_estimate for row in old.rows]
        assert [row.raw_ci_low for row in new.rows] == [row.raw_ci_low for row in old.rows]
        assert all(row.ci_low <= row.estimate <= row.ci_high for row in new.rows)
    doc = {q["question"]: q for q in json.loads(results_json(after))}
    assert doc["remote_by_team"]["reconciled_with"] == ["remote", "team"]
    assert doc["remote"]["reconciled_with"] == ["remote_by_team"]
    assert doc["budget"]["reconciled_with"] == ["budget_by_team"]
    assert doc["team"]["intervals"] == BONFERRONI
    assert doc["remote"]["intervals"] == "per-coordinate"  # one row


def test_reconciled_cells_are_narrower_than_their_own_release() -> None:
    survey = parse_survey(SURVEY, "s.toml")
    collected = _collected(survey, n=4000)  # far from the range's ends: nothing cut
    collected["remote_by_team"] = _released(
        survey, "remote_by_team", 4000, [1400, 600, 1000, 300, 400, 300]
    )
    collected["team"] = _released(survey, "team", 4000, [2000, 1300, 700])
    collected["remote"] = _released(survey, "remote", 4000, [1200])
    before, after = _results(survey, collected)
    old = next(r for r in before if r.question.id == "remote_by_team")
    new = next(r for r in after if r.question.id == "remote_by_team")
    for a, b in zip(old.rows, new.rows, strict=True):
        assert b.ci_high - b.ci_low < a.ci_high - a.ci_low


def test_a_release_that_is_no_margin_is_left_alone() -> None:
    survey = parse_survey(SURVEY, "s.toml")
    collected = _collected(survey)
    # Two respondents answered team and not remote: remote's count is 40, team's 42.
    collected["team"] = _released(survey, "team", 42, [24, 9, 9])
    before, after = _results(survey, collected)
    old = {r.question.id: r for r in before}
    new = {r.question.id: r for r in after}
    assert new["team"] == old["team"]
    assert new["remote_by_team"].reconciled_with == ("remote",)
    # Team is a budget breakdown's group too, but a numeric breakdown has no group
    # margin: budget_by_team still reconciles with budget.
    assert new["budget_by_team"].reconciled_with == ("budget",)
    assert new["hours"].reconciled_with == ("hours_by_remote",)


OFFICE = """
[[question]]
id = "office"
kind = "choice"
options = ["north", "south"]

[[question]]
id = "lunch"
kind = "choice"
options = ["in", "out", "none"]

[[breakdown]]
id = "remote_by_office"
question = "remote"
by = "office"

[[breakdown]]
id = "lunch_by_team"
question = "lunch"
by = "team"

[[breakdown]]
id = "hours_by_office"
question = "hours"
by = "office"
"""


def _joint(n: int = 40) -> tuple[list[QuestionResult], list[QuestionResult]]:
    survey = parse_survey(SURVEY + OFFICE, "s.toml")
    collected = _collected(survey, n)
    collected |= {
        "office": _released(survey, "office", n, [26, 15]),
        "lunch": _released(survey, "lunch", n, [18, 15, 6]),
        "remote_by_office": _released(survey, "remote_by_office", n, [19, 5, 9, 8]),
        "lunch_by_team": _released(survey, "lunch_by_team", n, [9, 8, 3, 5, 4, 2, 4, 3, 1]),
        "hours_by_office": _released(survey, "hours_by_office", n, [290, 250]),
    }
    return _results(survey, collected)


def test_a_question_two_breakdowns_measure_is_every_ones_margin() -> None:
    """Remote by team and remote by office, team counted by remote_by_team and
    lunch_by_team, hours by remote and by office: one least squares problem, and
    every published total is every breakdown's sum of it."""
    before, after = _joint()
    remote_team = _rows(after, "remote_by_team")  # eng/no, eng/yes, design/no, ...
    remote_office = _rows(after, "remote_by_office")  # north/no, north/yes, south/...
    lunch_team = _rows(after, "lunch_by_team")  # eng/in, eng/out, eng/none, design/...
    (remote,) = _rows(after, "remote")
    assert remote == pytest.approx(sum(remote_team[1::2]), abs=1e-5)
    assert remote == pytest.approx(sum(remote_office[1::2]), abs=1e-5)
    team = _rows(after, "team")
    for g in range(3):
        # remote_by_team is tied on both remote and team: its cells are cut onto
        # both sets of totals at once.
        assert team[g] == pytest.approx(sum(lunch_team[3 * g : 3 * g + 3]), abs=1e-5)
        assert team[g] == pytest.approx(sum(remote_team[2 * g : 2 * g + 2]), abs=1e-5)
    lunch = _rows(after, "lunch")
    for c in range(3):
        assert lunch[c] == pytest.approx(sum(lunch_team[c::3]), abs=1e-5)
    office = _rows(after, "office")
    assert office == pytest.approx([sum(remote_office[:2]), sum(remote_office[2:])], abs=1e-5)
    _, hours = _rows(after, "hours")
    assert hours == pytest.approx(sum(_rows(after, "hours_by_remote")), abs=1e-4)
    assert hours == pytest.approx(sum(_rows(after, "hours_by_office")), abs=1e-4)
    doc = {q["question"]: q for q in json.loads(results_json(after))}
    assert doc["remote"]["reconciled_with"] == ["remote_by_team", "remote_by_office"]
    assert doc["hours"]["reconciled_with"] == ["hours_by_remote", "hours_by_office"]
    assert doc["team"]["reconciled_with"] == ["remote_by_team", "lunch_by_team"]
    assert doc["remote_by_team"]["reconciled_with"] == ["remote", "team"]
    assert doc["lunch_by_team"]["reconciled_with"] == ["team", "lunch"]
    for old, new in zip(before, after, strict=True):
        assert [row.raw_estimate for row in new.rows] == [row.raw_estimate for row in old.rows]
        assert all(row.ci_low <= row.estimate <= row.ci_high for row in new.rows)
        assert all(row.estimate >= 0 for row in new.rows)


def test_breakdowns_measuring_one_question_with_other_respondents_are_apart() -> None:
    """remote_by_office counted 39 reports where remote counted 40: remote is no
    margin of it, and remote_by_team alone is reconciled with remote."""
    survey = parse_survey(SURVEY + OFFICE, "s.toml")
    collected = _collected(survey)
    collected |= {
        "office": _released(survey, "office", 40, [26, 15]),
        "lunch": _released(survey, "lunch", 40, [18, 15, 6]),
        "remote_by_office": _released(survey, "remote_by_office", 39, [19, 5, 9, 8]),
        "lunch_by_team": _released(survey, "lunch_by_team", 40, [9, 8, 3, 5, 4, 2, 4, 3, 1]),
        "hours_by_office": _released(survey, "hours_by_office", 40, [290, 250]),
    }
    _, after = _results(survey, collected)
    new = {r.question.id: r for r in after}
    assert new["remote"].reconciled_with == ("remote_by_team",)
    assert not new["remote_by_office"].reconciled_with
    assert new["office"].reconciled_with == ()
    (remote,) = _rows(after, "remote")
    assert remote == pytest.approx(sum(_rows(after, "remote_by_team")[1::2]), abs=1e-5)


def test_two_copies_of_one_breakdown_agree() -> None:
    """Two breakdowns of remote by team, tied on remote and on team: both publish
    the same cells, whose sums are remote's and team's totals."""
    twice = parse_survey(
        SURVEY + '\n[[breakdown]]\nid = "remote_by_team_again"\nquestion = "remote"\nby = "team"\n',
        "s.toml",
    )
    collected = _collected(twice)
    collected["remote_by_team_again"] = _released(
        twice, "remote_by_team_again", 40, [16, 5, 9, 2, 6, 2]
    )
    _, after = _results(twice, collected)
    new = {r.question.id: r for r in after}
    assert new["remote"].reconciled_with == ("remote_by_team", "remote_by_team_again")
    assert new["team"].reconciled_with == ("remote_by_team", "remote_by_team_again")
    (remote,) = _rows(after, "remote")
    team = _rows(after, "team")
    for b in ("remote_by_team", "remote_by_team_again"):
        cells = _rows(after, b)
        assert remote == pytest.approx(sum(cells[1::2]), abs=1e-5)
        assert team == pytest.approx([sum(cells[2 * g : 2 * g + 2]) for g in range(3)], abs=1e-5)
    assert new["hours"].reconciled_with == ("hours_by_remote",)


def test_without_its_collections_nothing_changes() -> None:
    survey = parse_survey(SURVEY, "s.toml")
    collected = _collected(survey)
    results = [question_result(q, collected[q.id]) for q in survey.tasked]
    assert reconcile_results(survey, results, {}) == results


def test_a_breakdown_past_the_cell_bound_keeps_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    survey = parse_survey(SURVEY, "s.toml")
    monkeypatch.setattr(reconciled, "MAX_CELLS", 5)  # remote_by_team has 6
    before, after = _results(survey, _collected(survey))
    old = {r.question.id: r for r in before}
    new = {r.question.id: r for r in after}
    assert new["remote_by_team"] == old["remote_by_team"] and new["team"] == old["team"]
    assert new["hours"].reconciled_with == ("hours_by_remote",)  # 2 cells


def test_the_report_says_what_is_reconciled() -> None:
    survey = parse_survey(SURVEY, "s.toml")
    _, after = _results(survey, _collected(survey))
    page = report_html(survey, after)
    assert "the two are reconciled, weighted by their exact noise" in page
    assert "simultaneous (Bonferroni)" in page  # what the intervals are


def test_a_breakdown_of_randomized_answers_is_published_as_collected() -> None:
    """Its collected values are de-biased estimates, whose error is more than the
    servers' noise: not what the least squares weigh."""
    survey = parse_survey(SURVEY, "s.toml")
    remote = survey.question("remote")
    local = replace(survey, questions=tuple(
        replace(q, local_epsilon=Fraction(2)) if q.id == "remote" else q
        for q in survey.questions
    ))  # fmt: skip
    local = replace(local, breakdowns=tuple(
        replace(b, of=local.question("remote")) if b.of == remote else b
        for b in local.breakdowns
    ))  # fmt: skip
    collected = _collected(survey)
    results = [question_result(q, collected[q.id]) for q in survey.tasked]
    after = {r.question.id: r for r in reconcile_results(local, results, collected)}
    assert not after["remote_by_team"].reconciled_with and not after["team"].reconciled_with
    assert after["budget"].reconciled_with == ("budget_by_team",)


def test_the_plan_gives_the_reconciled_half_widths_collect_publishes() -> None:
    """veil survey plan's reconciled_half_width is the widest row's half-width that
    collect publishes, at the same n (far from the range's ends: nothing cut)."""
    survey = parse_survey(SURVEY + OFFICE, "s.toml")
    n = 4000
    values = {
        "team": [2000, 1300, 700], "remote": [1200], "hours": [100_000], "budget": [15_000, 14_000],
        "office": [2500, 1500], "lunch": [1800, 1500, 700],
        "remote_by_team": [1400, 600, 1000, 300, 400, 300],
        "hours_by_remote": [60_000, 40_000],
        "budget_by_team": [5_000, 4_500, 5_000, 5_000, 5_000, 4_500],
        "remote_by_office": [1700, 800, 1100, 400],
        "lunch_by_team": [800, 800, 400, 600, 500, 200, 400, 200, 100],
        "hours_by_office": [55_000, 45_000],
    }  # fmt: skip
    collected = {qid: _released(survey, qid, n, v) for qid, v in values.items()}
    _, after = _results(survey, collected)
    plans = {p.question: p for p in plan_survey(survey, n)}
    for r in after:
        p = plans[r.question.id]
        assert r.reconciled_with, r.question.id  # every one is reconciled
        rows = r.rows[:1] if r.question.kind == "integer" else r.rows  # its mean, as planned
        published = max((row.ci_high - row.ci_low) / 2 for row in rows)
        assert p.reconciled_half_width == pytest.approx(published, rel=1e-5, abs=1e-5), (
            r.question.id
        )
        assert p.reconciled_half_width < p.half_width
    doc = json.loads(plan_json(survey, list(plans.values())))
    assert all("reconciled_half_width" in q for q in doc["questions"])
    field = "json:survey-plan.questions[].reconciled_half_width"
    assert unclassified(load_inventory(), "collector", [field]) == []
    text = format_plan(survey, list(plans.values()))
    assert f"team {_amount(plans['team'].half_width)} → " in text


def test_the_plan_has_no_reconciled_half_width_without_a_breakdown() -> None:
    survey = parse_survey(SURVEY.split("[[breakdown]]")[0], "s.toml")
    plans = plan_survey(survey, 1000)
    assert all(p.reconciled_half_width is None for p in plans)
    assert "reconciled_half_width" not in plan_json(survey, plans)
    assert "reconciled, as collect publishes" not in format_plan(survey, plans)
