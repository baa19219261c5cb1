"""A survey with breakdowns run as its parties run it, each step a real `veil`
process: deploy, the two servers, respondents answering by label with
`veil survey respond` (each breakdown answered from the answers given, one
more report each), the survey closed once they are done, `veil survey
collect`; and `veil simulate --json` with no noise, where every breakdown
cell must be the truth.

The survey is open for an hour (time precision 2 s) and closed as the survey
journey's is (tests/support/window.py)."""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import veil
from tests.support.survey_toml import commute, remote, team
from tests.support.window import LONG_WINDOW, close_survey
from veil.local.launcher import ServerProcess, free_port
from veil.times import format_time

pytestmark = pytest.mark.slow

TP = 2
QUESTIONS = (
    "\n"
    + remote()
    + "\n"
    + commute(120)
    + "\n"
    + team()
    + """
[[question]]
id = "tools"
text = "Which tools do you use daily?"
kind = "multi_choice"
options = ["email", "chat", "wiki"]
max_choices = 2

[[breakdown]]
id = "remote_by_team"
question = "remote"
by = "team"

[[breakdown]]
id = "commute_by_team"
question = "commute"
by = "team"

[[breakdown]]
id = "tools_by_remote"
question = "tools"
by = "remote"
"""
)
TEAMS = ["engineering", "design", "sales"]
TOOLS = ["email", "chat", "wiki"]
# Wide enough that every interval holds the truth but about once in 10^6 runs
# (as the survey journey's); they come from the exact noise distribution.
CONFIDENCE = "0.9999999"


def panel(n: int, seed: int) -> list[dict[str, Any]]:
    """Respondents, one in ten skipping the team question (so in no group)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a: dict[str, Any] = {
            "remote": rng.random() < 0.3,
            "commute": rng.randrange(0, 100),
            "tools": rng.sample(TOOLS, rng.randrange(0, 3)),
        }
        if rng.random() < 0.9:
            a["team"] = rng.choice(["engineering", "engineering", "design", "sales"])
        out.append(a)
    return out


def cells(answers: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each breakdown's true cells, by label."""
    grouped = [a for a in answers if "team" in a]
    remote = {
        f"{t} / {yn}": sum(a["team"] == t and a["remote"] == (yn == "yes") for a in grouped)
        for t in TEAMS
        for yn in ("no", "yes")
    }
    commute = {t: sum(a["commute"] for a in grouped if a["team"] == t) for t in TEAMS}
    tools = {
        f"{yn} / {tool}": sum(a["remote"] == (yn == "yes") and tool in a["tools"] for a in answers)
        for yn in ("no", "yes")
        for tool in TOOLS
    }
    return {"remote_by_team": remote, "commute_by_team": commute, "tools_by_remote": tools}


def test_breakdowns_through_real_servers(tmp_path: Path) -> None:
    opens = int(time.time()) // TP * TP
    closes = opens + LONG_WINDOW
    survey = tmp_path / "survey.toml"
    survey.write_text(
        '[survey]\nname = "Breakdowns"\nepsilon = 2.1\nmin_batch_size = 50\n'
        f'time_precision = {TP}\nopens = "{format_time(opens)}"\n'
        f'closes = "{format_time(closes)}"\n' + QUESTIONS
    )
    plan = veil("survey", "plan", survey, "--respondents", "300")
    assert plan.returncode == 0, plan.stderr
    assert re.search(r"remote_by_team +respondents per cell", plan.stdout)
    # Six cells of 50 each at 300 respondents, against the noise of two options a report.
    assert "the cells of these breakdowns will be noise-dominated" in plan.stdout
    leader, helper = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    dep = tmp_path / "dep"
    out = veil(
        "survey", "deploy", "--survey", survey, "--out", dep,
        "--leader", leader, "--helper", helper, "--no-tls",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "(7 tasks)" in out.stdout
    public = json.loads((dep / "client" / "survey.json").read_text())
    assert [b["id"] for b in public["breakdowns"]] == [
        "remote_by_team",
        "commute_by_team",
        "tools_by_remote",
    ]
    servers = [
        ServerProcess(role, dep / role / f"{role}.toml", tmp_path / f"{role}.log", address)
        for role, address in (("helper", helper), ("leader", leader))
    ]
    try:
        for server in servers:
            server.start()
        answers = panel(300, seed=3)
        jsonl = tmp_path / "panel.jsonl"
        jsonl.write_text("".join(json.dumps(a) + "\n" for a in answers))
        done = veil("survey", "respond", "--survey-dir", dep / "client", "--answers", jsonl)
        assert done.returncode == 0, done.stderr
        grouped = sum("team" in a for a in answers)
        sent = 300 * 3 + grouped + grouped + 300 + grouped
        assert f"sent {sent} answers of 300 respondents" in done.stdout
        assert f"remote_by_team: {grouped}" in done.stdout
        close_survey(dep, servers)
        results = tmp_path / "results"
        out = veil(
            "survey", "collect", "--survey-dir", dep / "collector", "--out", results,
            "--confidence", CONFIDENCE,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
    finally:
        for server in servers:
            server.stop()
    published = {q["question"]: q for q in json.loads((results / "results.json").read_text())}
    expected = cells(answers)
    for bid, truth in expected.items():
        q = published[bid]
        assert q["kind"] == "breakdown"
        assert q["n"] == (300 if bid == "tools_by_remote" else grouped)
        assert [r["label"] for r in q["rows"]] == list(truth)
        for row in q["rows"]:
            assert row["ci_low"] <= truth[row["label"]] <= row["ci_high"], (bid, row)
            assert "raw_estimate" in row  # the raw release is kept
    single = published["remote_by_team"]["rows"]
    assert sum(r["estimate"] for r in single) == pytest.approx(grouped, abs=1e-3)
    # Published with the questions they measure again (veil.survey.reconciled): the
    # team's counts are remote_by_team's row sums (the same respondents), the
    # tools' counts tools_by_remote's column sums; remote and commute, answered by
    # those without a team too, keep their own.
    team = published["team"]
    assert team["reconciled_with"] == ["remote_by_team"]
    for t, row in zip(TEAMS, team["rows"], strict=True):
        assert row["estimate"] == pytest.approx(
            sum(r["estimate"] for r in single if r["label"].startswith(f"{t} / ")), abs=1e-4
        )
        assert row["ci_low"] <= sum(a.get("team") == t for a in answers) <= row["ci_high"]
    by_remote = published["tools_by_remote"]["rows"]
    assert published["tools"]["reconciled_with"] == ["tools_by_remote"]
    for tool, row in zip(TOOLS, published["tools"]["rows"], strict=True):
        assert row["estimate"] == pytest.approx(
            sum(r["estimate"] for r in by_remote if r["label"].endswith(f" / {tool}")), abs=1e-4
        )
    assert "reconciled_with" not in published["remote"]
    assert "reconciled_with" not in published["commute"]
    assert published["commute_by_team"]["breakdown"]["groups"] == TEAMS
    csv_text = (results / "results.csv").read_text()
    assert "commute_by_team,breakdown," in csv_text
    page = (results / "report.html").read_text()
    assert page.count('<table class="breakdown">') == 3
    assert "Heat map of Which tools do you use daily? (by Do you work remotely most days?)" in page


SIMULATED = (
    """
[survey]
name = "Exact breakdowns"
mechanism = "none"
min_batch_size = 10
"""
    + QUESTIONS
    + """
[[question]]
id = "budget"
text = "Split 10 points"
kind = "points"
options = ["pay", "tools"]
total = 10

[[breakdown]]
id = "budget_by_team"
question = "budget"
by = "team"

[[breakdown]]
id = "budget_by_remote"
question = "budget"
by = "remote"
"""
)


def test_simulate_json_lists_each_breakdown_cell_by_cell(tmp_path: Path) -> None:
    survey = tmp_path / "survey.toml"
    survey.write_text(SIMULATED)
    out = veil(
        "simulate", "--survey", survey, "--respondents", "60", "--json", timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    entries = {e["question"]: e for e in json.loads(out.stdout)}
    remote = entries["remote_by_team"]
    assert remote["kind"] == "breakdown"
    assert remote["labels"] == [f"{t} / {yn}" for t in TEAMS for yn in ("no", "yes")]
    assert entries["commute_by_team"]["labels"] == TEAMS
    assert entries["tools_by_remote"]["labels"] == [
        f"{yn} / {t}" for yn in ("no", "yes") for t in TOOLS
    ]
    assert entries["budget_by_team"]["labels"] == [
        f"{t} / {o}" for t in TEAMS for o in ("pay", "tools")
    ]
    assert entries["budget_by_remote"]["labels"] == [
        f"{yn} / {o}" for yn in ("no", "yes") for o in ("pay", "tools")
    ]
    breakdowns = ("remote_by_team", "commute_by_team", "tools_by_remote", "budget_by_team")
    for bid in (*breakdowns, "budget_by_remote"):
        e = entries[bid]
        # No noise: through both servers, every cell is exactly the truth.
        assert e["estimate"] == e["truth"] == e["ci_low"] == e["ci_high"], e
        assert len(e["truth"]) == len(e["labels"])
    assert sum(remote["truth"]) == 60  # every simulated respondent answers every question
    assert sum(entries["commute_by_team"]["truth"]) == pytest.approx(
        60 * entries["commute"]["truth"]
    )  # the groups' sums add up to the question's (its truth is the mean)
    # budget is measured by two breakdowns, reconciled together: each one's
    # option totals are the question's (its truth the mean points per respondent).
    for bid, groups in (("budget_by_team", 3), ("budget_by_remote", 2)):
        per_option = [sum(entries[bid]["estimate"][o::2]) / 60 for o in range(2)]
        assert per_option == pytest.approx(entries["budget"]["estimate"])
        assert len(entries[bid]["estimate"]) == 2 * groups


RANDOMIZED = (
    """
[survey]
name = "Randomized breakdowns"
epsilon = 2
min_batch_size = 10

"""
    + remote()
    + "\n"
    + team()
    + """
[[question]]
id = "hours"
text = "How many hours a week do you work?"
kind = "integer"
max = 60

[[question]]
id = "tools"
text = "Which tools do you use daily?"
kind = "multi_choice"
options = ["email", "chat", "wiki"]
max_choices = 2

[[breakdown]]
id = "remote_by_team"
question = "remote"
by = "team"

[[breakdown]]
id = "hours_by_team"
question = "hours"
by = "team"

[[breakdown]]
id = "tools_by_team"
question = "tools"
by = "team"
"""
)


def test_a_local_layer_reaches_the_breakdown_debiased(tmp_path: Path) -> None:
    # Every answer randomized on the device (ε_L = 2), through both servers: the
    # breakdown sends the randomized answers and is de-biased for both channels.
    survey = tmp_path / "survey.toml"
    survey.write_text(RANDOMIZED)
    out = veil(
        "simulate", "--survey", survey, "--respondents", "400", "--json",
        "--local-epsilon", "2", timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    entries = {e["question"]: e for e in json.loads(out.stdout)}
    b = entries["remote_by_team"]
    assert b["intervals"] == "simultaneous (Bonferroni)"
    assert sum(b["truth"]) == 400
    for truth, low, high in zip(b["truth"], b["ci_low"], b["ci_high"], strict=True):
        assert low <= truth <= high, b
    # A^-1 keeps each column's sum: the de-biased cells add up to the reports, noise aside.
    assert abs(sum(b["raw_estimate"]) - 400) < 100
    # A randomized number and multiple choice by a randomized group: each report
    # carries its bits and its group's count, and every cell is de-biased.
    for bid, labels in (("hours_by_team", 3), ("tools_by_team", 9)):
        e = entries[bid]
        assert e["intervals"] == "simultaneous (Bonferroni)" and len(e["truth"]) == labels
        for truth, low, high in zip(e["truth"], e["ci_low"], e["ci_high"], strict=True):
            assert low <= truth <= high, e
    assert sum(entries["hours_by_team"]["truth"]) == 400 * entries["hours"]["truth"]
