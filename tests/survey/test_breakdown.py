"""Breakdowns ([[breakdown]] id, question, by): parsed with errors at their line,
charged to the survey's budget, encoded over the cells group x category, described
to respondents, planned per cell, and published as tables."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from tests.support.docs import section_blocks
from veil.dp.accounting import Guarantee
from veil.local.simulate import truth
from veil.render.html import report_html
from veil.render.text import demo_json, format_plan
from veil.survey import SurveyError, parse_survey
from veil.survey.description import load_description, public_description
from veil.survey.plan import plan_survey
from veil.survey.results import question_result, results_csv, results_json
from veil.survey.tasks import task_specs
from veil.vdaf import registry

HEAD = """\
[survey]
name = "t"
epsilon = 2
min_batch_size = 10
opens = 2026-12-01T00:00:00Z
closes = 2026-12-02T00:00:00Z

[[question]]
id = "team"
text = "Which team?"
kind = "choice"
options = ["eng", "design", "sales"]

[[question]]
id = "remote"
text = "Remote?"
kind = "yes_no"

[[question]]
id = "hours"
text = "Hours?"
kind = "integer"
max = 60

[[question]]
id = "tools"
text = "Tools?"
kind = "multi_choice"
options = ["chat", "wiki"]
max_choices = 2

[[question]]
id = "note"
kind = "text"

[[question]]
id = "scores"
kind = "vector"
length = 2
max = 5

[[question]]
id = "budget"
text = "Split 10 points"
kind = "points"
options = ["pay", "tools"]
total = 10
"""

BREAKDOWNS = """
[[breakdown]]
id = "remote_by_team"
question = "remote"
by = "team"

[[breakdown]]
id = "hours_by_team"
question = "hours"
by = "team"
weight = 2

[[breakdown]]
id = "tools_by_remote"
question = "tools"
by = "remote"

[[breakdown]]
id = "budget_by_remote"
question = "budget"
by = "remote"
"""


def survey() -> Any:
    return parse_survey(HEAD + BREAKDOWNS, "s.toml")


def test_breakdowns_are_tasks_charged_to_the_budget() -> None:
    s = survey()
    assert [q.id for q in s.questions] == [
        "team", "remote", "hours", "tools", "note", "scores", "budget"
    ]  # fmt: skip
    assert [b.id for b in s.breakdowns] == [
        "remote_by_team", "hours_by_team", "tools_by_remote", "budget_by_remote"
    ]  # fmt: skip
    # Ten shares of weight 1 and one of 2 (hours_by_team): twelve in all.
    assert sum((q.share for q in s.tasked), Fraction(0)) == s.epsilon
    assert s.breakdowns[1].epsilon == 2 * s.breakdowns[0].epsilon == Fraction(1, 3)
    specs = task_specs(s)
    assert list(specs) == [q.id for q in s.tasked]
    vdaf, dp, _ = specs["remote_by_team"]
    assert (vdaf.type, vdaf.length) == ("histogram", 6)
    assert dp.epsilon == "1/6"
    assert specs["hours_by_team"][0].type == "l1boundsum"
    assert specs["tools_by_remote"][0].type == "multihot"
    points = specs["budget_by_remote"][0]
    assert (points.type, points.length, points.max_value) == ("l1boundsum", 4, 10)
    for b in s.breakdowns:
        b.vdaf()  # a constructible Prio3 instance


def test_cells_and_measurements() -> None:
    s = survey()
    remote, hours, tools, budget = s.breakdowns
    assert remote.cells() == (
        "eng / no", "eng / yes", "design / no", "design / yes", "sales / no", "sales / yes"
    )  # fmt: skip
    assert hours.cells() == ("eng", "design", "sales")
    assert tools.cells() == ("no / chat", "no / wiki", "yes / chat", "yes / wiki")
    assert budget.cells() == ("no / pay", "no / tools", "yes / pay", "yes / tools")
    answers = {
        "team": "design", "remote": True, "hours": 37, "tools": ["wiki"], "budget": "pay:3,tools:7"
    }  # fmt: skip
    assert remote.measurement_from(answers) == 3
    assert hours.measurement_from(answers) == [0, 37, 0]
    assert tools.measurement_from(answers) == [False, False, False, True]
    assert budget.measurement_from(answers) == [0, 0, 3, 7]
    # Each is a valid measurement of its task's VDAF, and one respondent's number
    # is bounded over all cells together.
    for b in (remote, hours, tools, budget):
        vdaf = registry.kind(b.vdaf_type).make(b.vdaf_params)
        vdaf.shard(b"ctx", b.measurement_from(answers), b"\0" * 16, b"\1" * vdaf.RAND_SIZE)
    assert hours.vdaf_params["max_value"] == 60
    other = {
        "team": "eng",
        "remote": False,
        "hours": 5,
        "tools": ["chat", "wiki"],
        "budget": [1, 2],
    }
    rows = [answers, other]
    assert truth(remote, rows) == [1, 0, 0, 1, 0, 0]
    assert truth(hours, rows) == [5, 37, 0]
    assert truth(tools, rows) == [1, 1, 0, 1]
    assert truth(budget, rows) == [1, 2, 3, 7]


BAD = [
    ('question = "nope"\nby = "team"', "is not a question of this survey"),
    ('question = "remote"\nby = "nope"', "`by` = 'nope' is not a question"),
    ('by = "team"', "each breakdown needs `question`"),
    ('question = "remote"', "each breakdown needs `by`"),
    ('question = "team"\nby = "team"', "counts 'team' by itself"),
    ('question = "remote"\nby = "hours"', "is an integer question: a breakdown groups"),
    ('question = "remote"\nby = "tools"', "is a multi_choice question: a breakdown groups"),
    ('question = "note"\nby = "team"', "is a text question, which cannot be broken down"),
    ('question = "scores"\nby = "team"', "is a vector question; a breakdown counts"),
    ('question = "remote"\nby = "budget"', "is a points question: a breakdown groups"),
    ('question = "remote"\nby = "team"\ncolour = "red"', "unknown setting 'colour'"),
    ('question = 3\nby = "team"', "each breakdown needs `question`"),
    ('question = "remote"\nby = "team"\nepsilon = -1', "must be positive"),
    ('question = "remote"\nby = "team"\nepsilon = 5', "overspends"),
    ('question = "remote"\nby = "team"\ntext = ""', "`text` must be a title"),
    ('question = "remote"\nby = "team"\ntarget_error = 2', "`target_error` must be"),
    ('question = "remote"\nby = "team"\nmechanism = "magic"', "unknown mechanism"),
]


@pytest.mark.parametrize(("body", "message"), BAD)
def test_hostile_breakdowns_are_refused_at_their_line(body: str, message: str) -> None:
    text = HEAD + f'\n[[breakdown]]\nid = "b"\n{body}\n'
    with pytest.raises(SurveyError) as e:
        parse_survey(text, "s.toml")
    assert message in str(e.value)
    line = int(str(e.value).split(":")[1])
    assert line > HEAD.count("\n"), str(e.value)  # at the [[breakdown]] table


def test_more_hostile_breakdown_files() -> None:
    twice = HEAD + '\n[[breakdown]]\nid = "team"\nquestion = "remote"\nby = "team"\n'
    with pytest.raises(SurveyError, match="question id 'team' is used twice"):
        parse_survey(twice)
    same = BREAKDOWNS.replace('"hours_by_team"', '"remote_by_team"')
    with pytest.raises(SurveyError, match="used twice"):
        parse_survey(HEAD + same)
    with pytest.raises(SurveyError, match="array of tables"):
        parse_survey(HEAD.replace("[survey]", "breakdown = 1\n[survey]"))
    # A points question takes no local layer, in a breakdown or not.
    local = HEAD.replace("total = 10", "total = 10\nlocal_epsilon = 1")
    with pytest.raises(SurveyError, match="local_epsilon") as e:
        parse_survey(local + BREAKDOWNS, "s.toml")
    assert str(e.value).startswith("s.toml:")
    add_remove = HEAD.replace("epsilon = 2", 'epsilon = 2\nneighbouring = "add_remove"')
    with pytest.raises(SurveyError, match="add_remove"):
        parse_survey(add_remove + BREAKDOWNS)
    many = HEAD.replace(
        'options = ["chat", "wiki"]', f"options = {json.dumps([f'o{i}' for i in range(50_001)])}"
    )
    with pytest.raises(SurveyError, match="100000 are supported"):
        parse_survey(many + '\n[[breakdown]]\nid = "b"\nquestion = "tools"\nby = "team"\n')


def test_the_description_names_each_breakdown_and_reads_back(tmp_path: Path) -> None:
    s = survey()
    ids = {q.id: f"id-{q.id}" for q in s.tasked}
    doc = public_description(s, ids)
    assert [b["id"] for b in doc["breakdowns"]] == [b.id for b in s.breakdowns]
    assert doc["breakdowns"][0] == {
        "id": "remote_by_team",
        "text": "Remote? (by Which team?)",
        "kind": "breakdown",
        "question": "remote",
        "by": "team",
        "mechanism": "geometric",
        "epsilon": "1/6",
        "task_file": "remote_by_team.toml",
        "task_id": "id-remote_by_team",
    }
    (tmp_path / "survey.json").write_text(json.dumps(doc))
    back = load_description(tmp_path)
    assert [(b.id, b.of and b.of.id, b.by and b.by.id) for b in back.survey.breakdowns] == [
        ("remote_by_team", "remote", "team"),
        ("hours_by_team", "hours", "team"),
        ("tools_by_remote", "tools", "remote"),
        ("budget_by_remote", "budget", "remote"),
    ]
    assert back.task_ids["hours_by_team"] == "id-hours_by_team"
    assert back.survey.breakdowns[0].vdaf_params == s.breakdowns[0].vdaf_params
    # Hostile descriptions are refused with what is wrong.
    for change, message in [
        ({"question": "remote", "by": "hours"}, "not yes_no by integer"),
        ({"question": "remote", "by": "remote"}, "must name two questions"),
        ({"question": "ghost"}, "must name two questions"),
        ({"kind": "choice"}, "`kind` must be"),
        ({"id": "team"}, "bad or repeated id"),
        ({"task_file": "../x.toml"}, "same directory"),
    ]:
        bad = json.loads(json.dumps(doc))
        bad["breakdowns"][1].update(change)
        (tmp_path / "survey.json").write_text(json.dumps(bad))
        with pytest.raises(SurveyError, match=message):
            load_description(tmp_path)


def test_the_plan_gives_each_cell_and_warns_when_noise_dominates() -> None:
    s = survey()
    plans = {p.question: p for p in plan_survey(s, 1000)}
    p = plans["remote_by_team"]
    assert p.kind == "breakdown" and p.unit == "respondents per cell"
    # Planned at a cell's even share: 1000 respondents over 6 cells.
    assert p.cell_share == pytest.approx(1000 / 6, rel=1e-6) and p.range_high == 1000
    assert not p.indicative
    assert p.needed is not None and p.needed > 1000 > plans["remote"].needed  # type: ignore[operator]
    assert plans["hours_by_team"].unit == "sum per cell (each 0 to 60)"
    few = {p.question: p for p in plan_survey(s, 60)}
    assert few["remote_by_team"].indicative
    text = format_plan(s, list(few.values()))
    assert "the cells of these breakdowns will be noise-dominated" in text
    assert "remote_by_team (±" in text


@dataclass
class Fake:
    """A collection's outcome as veil.collector gives it."""

    report_count: int
    estimate: list[float]
    lower: list[float]
    upper: list[float]
    confidence: float = 0.95
    intervals: str = "simultaneous (exact max-of-k)"
    against_collector: Guarantee = field(default_factory=lambda: Guarantee.pure(Fraction(1, 6)))


def test_a_breakdown_is_published_as_a_table_with_a_heat_map() -> None:
    s = survey()
    remote = s.breakdowns[0]
    raw = [40.0, 12.0, 20.0, -3.0, 9.0, 22.0]
    r = question_result(remote, Fake(100, raw, [x - 8 for x in raw], [x + 8 for x in raw]))
    assert [row.label for row in r.rows] == list(remote.cells())
    # A single answer per report: the cells are non-negative and add up to n.
    assert sum(row.estimate for row in r.rows) == pytest.approx(100)
    assert min(row.estimate for row in r.rows) >= 0
    assert [row.raw_estimate for row in r.rows] == raw  # the raw release is kept
    doc = json.loads(results_json([r]))[0]
    assert doc["question"] == "remote_by_team" and doc["kind"] == "breakdown"
    assert doc["breakdown"] == {
        "question": "remote",
        "by": "team",
        "groups": ["eng", "design", "sales"],
        "categories": ["no", "yes"],
    }
    assert "remote_by_team,breakdown,100,design / yes," in results_csv([r])
    listed = json.loads(demo_json([r]))[0]
    assert listed["labels"] == list(remote.cells()) and len(listed["estimate"]) == 6
    hours = s.breakdowns[1]
    h = question_result(hours, Fake(100, [900.0, 80.0, 7000.0], [0, 0, 0], [2000, 2000, 9000]))
    assert h.rows[2].estimate == 6000  # within [0, n·max]
    html = report_html(s, [r, h])
    assert '<table class="breakdown">' in html
    assert '<th scope="row">design</th>' in html and '<th scope="col">yes</th>' in html
    assert 'role="img" aria-label="Heat map of Remote? (by Which team?)' in html
    assert "0 questions and 2 breakdowns" in html
    budget = s.breakdowns[3]
    b = question_result(budget, Fake(10, [30.0, 70.0, -5.0, 120.0], [0] * 4, [200] * 4))
    assert b.unit == "points (each respondent 0 to 10)"
    assert [row.estimate for row in b.rows] == [30, 70, 0, 100]  # within [0, n·total]


def test_the_surveys_doc_breakdown_parses_as_written() -> None:
    (block,) = section_blocks(
        "docs/SURVEYS.md", "Breakdowns: a question's answers in each group", "toml"
    )
    (b,) = parse_survey(HEAD + block.code, "s.toml").breakdowns
    assert (b.id, b.of and b.of.id, b.by and b.by.id) == ("remote_by_team", "remote", "team")


def test_a_randomized_answer_is_drawn_once_for_its_question_and_its_breakdowns() -> None:
    from veil.client.survey import device_measurements
    from veil.dp.local import KaryResponse
    from veil.task import new_task

    text = HEAD.replace('kind = "yes_no"', 'kind = "yes_no"\nlocal_epsilon = 0.5').replace(
        'options = ["eng", "design", "sales"]',
        'options = ["eng", "design", "sales"]\nlocal_epsilon = 1',
    )
    s = parse_survey(text + BREAKDOWNS.split('[[breakdown]]\nid = "hours_by_team"')[0])
    (b,) = s.breakdowns
    group, answer = b.breakdown_channels()
    assert isinstance(group, KaryResponse) and (group.k, group.epsilon) == (3, 1)
    assert isinstance(answer, KaryResponse) and (answer.k, answer.epsilon) == (2, Fraction(1, 2))
    tasks = {
        qid: new_task(vdaf, "127.0.0.1:1", "127.0.0.1:2", min_batch_size=1, dp=dp).client
        for qid, (vdaf, dp, _) in task_specs(s).items()
    }
    assert tasks["remote_by_team"].dp.local_epsilon is None  # never a second draw
    changed = 0
    for _ in range(200):
        measured = {"team": 1, "remote": 1, "hours": 3}
        sent, drawn = device_measurements(s, tasks, measured)
        assert drawn == {"team", "remote"}
        # The breakdown's cell is the one of the answers the device sent.
        assert sent["remote_by_team"] == sent["team"] * 2 + sent["remote"]
        assert sent["hours"] == 3
        changed += (sent["team"], sent["remote"]) != (1, 1)
    assert 0 < changed < 200  # randomized, and not always


def test_the_plans_breakdown_field_is_in_the_observation_inventory() -> None:
    from veil.observations import load_inventory, unclassified
    from veil.survey.plan import plan_json

    s = survey()
    plan = json.loads(plan_json(s, plan_survey(s, 1000)))
    (entry,) = [q for q in plan["questions"] if q["question"] == "remote_by_team"]
    assert entry["cell_share"] == pytest.approx(1000 / 6, rel=1e-6)
    assert "cell_share" not in plan["questions"][0]  # a question's plan has none
    field = "json:survey-plan.questions[].cell_share"
    assert unclassified(load_inventory(), "collector", [field]) == []


RANDOMIZED = (
    HEAD.replace("max = 60", "max = 60\nlocal_epsilon = 2").replace(
        "max_choices = 2", "max_choices = 1\nlocal_epsilon = 1"
    )
    + BREAKDOWNS.split('[[breakdown]]\nid = "budget_by_remote"')[0]
)


def test_a_randomized_multiple_choice_or_number_is_broken_down_with_its_counts() -> None:
    """Each report sends its group's row of the randomized answer's bits (a number's
    one: max or 0) and a last 1, the group's count (veil.dp.local.
    counted_breakdown_estimate); the cells published are still group x category."""
    from veil.client.survey import device_measurements
    from veil.dp.local import BoundedResponse, MultiOptionResponse
    from veil.survey.model import counted, counted_channels
    from veil.task import new_task

    s = parse_survey(RANDOMIZED, "s.toml")
    hours, tools = s.question("hours_by_team"), s.question("tools_by_remote")
    assert counted(hours) and counted(tools) and not counted(s.question("remote_by_team"))
    assert (hours.vdaf_type, hours.vdaf_params["length"], hours.vdaf_params["max_weight"]) == (
        "multihot", 6, 2)  # fmt: skip
    assert (tools.vdaf_params["length"], tools.vdaf_params["max_weight"]) == (6, 3)
    assert hours.cells() == ("eng", "design", "sales")
    assert tools.cells() == ("no / chat", "no / wiki", "yes / chat", "yes / wiki")
    group, channel = counted_channels(tools)
    assert group is None and isinstance(channel, MultiOptionResponse)
    assert (channel.length, channel.max_choices, channel.epsilon) == (2, 1, 1)
    assert isinstance(counted_channels(hours)[1], BoundedResponse)
    tasks = {
        qid: new_task(vdaf, "127.0.0.1:1", "127.0.0.1:2", min_batch_size=1, dp=dp).client
        for qid, (vdaf, dp, _) in task_specs(s).items()
    }
    assert tasks["hours_by_team"].dp.local_epsilon is None  # never a second draw
    for _ in range(50):
        sent, drawn = device_measurements(
            s, tasks, {"team": 2, "remote": 1, "hours": 37, "tools": [False, True]}
        )
        assert {"hours", "tools"} <= drawn and sent["hours"] in (0, 60)
        assert sent["hours_by_team"] == [False] * 4 + [sent["hours"] == 60, True]
        assert sent["tools_by_remote"] == [False] * 3 + [*sent["tools"], True]
        for b in ("hours_by_team", "tools_by_remote"):
            s.question(b).vdaf().flp.encode(sent[b])  # a valid measurement (its weight too)
    # The truth veil simulate compares with: each group's sums of the true answers.
    answers = [{"team": "sales", "remote": True, "hours": 37, "tools": ["wiki"]}] * 3
    assert truth(hours, answers) == [0, 0, 111] and truth(tools, answers) == [0, 0, 0, 3]
    plan = {p.question: p for p in plan_survey(s, 2000)}
    assert 0 < plan["hours_by_team"].half_width <= plan["hours_by_team"].range_high / 2
    assert plan["tools_by_remote"].median > 0


def test_local_epsilon_for_the_whole_survey_takes_its_breakdowns() -> None:
    from veil.survey.budget import with_local_epsilon

    plain = parse_survey(HEAD + BREAKDOWNS.split('[[breakdown]]\nid = "budget_by_remote"')[0])
    local = with_local_epsilon(plain, Fraction(2))
    assert all(b.of is not None and b.of.local_epsilon == 2 for b in local.breakdowns)
    with pytest.raises(ValueError, match="points question, which takes no local_epsilon"):
        with_local_epsilon(survey(), Fraction(2))


def test_a_respondent_answers_randomized_breakdowns(tmp_path: Path) -> None:
    """The respondent's client reads and counts the answers before it draws
    (SurveyClient.measurements), then sends the breakdowns made from the draws."""
    from veil.client.survey import SurveyClient, device_measurements
    from veil.deploy import deploy_survey

    s = parse_survey(RANDOMIZED, "s.toml")
    dep = deploy_survey(s, RANDOMIZED, tmp_path / "dep", "127.0.0.1:9", "127.0.0.1:9")
    task = json.loads((dep.client_dir / "survey.json").read_text())
    assert [b["id"] for b in task["breakdowns"]] == [b.id for b in s.breakdowns]
    with SurveyClient(dep.client_dir) as client:
        answers = {"team": "sales", "remote": "yes", "hours": 37, "tools": ["wiki"]}
        measured = client.measurements(answers)
        assert set(measured) >= {"hours_by_team", "tools_by_remote"}
        sent, drawn = device_measurements(client.survey, client.tasks, measured)
        assert {"hours", "tools"} <= drawn
        assert sent["hours_by_team"][-2:] == [sent["hours"] == 60, True]


def test_a_randomized_points_breakdown_deploys_nothing(tmp_path: Path) -> None:
    from veil.cli import main

    text = HEAD.replace("total = 10", "total = 10\nlocal_epsilon = 1") + BREAKDOWNS
    (tmp_path / "s.toml").write_text(text)
    code = main(["survey", "deploy", "--survey", str(tmp_path / "s.toml"), "--out",
                 str(tmp_path / "dep"), "--leader", "127.0.0.1:9", "--helper", "127.0.0.1:9",
                 "--no-tls"])  # fmt: skip
    assert code == 2 and not (tmp_path / "dep").exists()
