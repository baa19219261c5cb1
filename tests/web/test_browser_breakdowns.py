"""A survey with breakdowns answered in a real browser: Debian's headless
Chromium fills the page of `veil survey serve`, which answers each breakdown
from the answers given (one more sealed report each, nothing more asked); a
real leader and helper aggregate with mechanism none, `veil survey collect`
publishes every cell exactly, and report.html's breakdown tables and heat maps
pass an axe-core audit in the same browser.

Needs chromium and chromedriver, and axe-core from `npm ci` in js/; skips
without them, except under CI, where it fails.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import browser, status_text, wait_for
from tests.support.cli import veil
from tests.support.survey_site import start_serve, stop
from tests.support.survey_toml import commute, remote, team
from tests.support.window import LONG_WINDOW, close_survey
from tests.web.test_browser import axe_violations
from veil.deploy import deploy_survey
from veil.local.launcher import ServerProcess, free_port
from veil.survey import parse_survey
from veil.times import format_time

pytestmark = [pytest.mark.browser, pytest.mark.slow]
__all__ = ["browser"]  # the fixture, used by name

TP = 5
TEAMS = ["engineering", "design", "sales"]

SURVEY = (
    """\
[survey]
name = "Breakdowns in a browser"
mechanism = "none"
min_batch_size = 1
max_respondents = 1000
time_precision = {tp}
opens = "{opens}"
closes = "{closes}"

"""
    + remote(required=True)
    + "\n"
    + commute()
    + "\n"
    + team()
    + """
[[breakdown]]
id = "remote_by_team"
question = "remote"
by = "team"

[[breakdown]]
id = "commute_by_team"
question = "commute"
by = "team"
"""
)

# The same survey with the remote question and the commute randomized on the
# device (a local layer).
RANDOMIZED = SURVEY.replace('kind = "yes_no"', 'kind = "yes_no"\nlocal_epsilon = 0.5').replace(
    "max = 180", "max = 180\nlocal_epsilon = 1"
)

# (remote, commute, team index or None for a respondent who skips it)
RESPONDENTS = [
    (True, 10, 0),
    (False, 45, 0),
    (True, 30, 1),
    (False, 0, 2),
    (True, 60, None),
    (False, 25, 1),
]


def answer(driver: Any, url: str, remote: bool, commute: int, team: int | None) -> None:
    from selenium.webdriver.common.by import By

    driver.get(url)
    wait_for(driver, lambda d: d.find_element(By.ID, "survey").get_attribute("data-ready"))
    driver.find_element(By.ID, "a-remote-yes" if remote else "a-remote-no").click()
    driver.find_element(By.ID, "a-commute").send_keys(str(commute))
    if team is not None:
        driver.find_element(By.ID, f"a-team-{team}").click()
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(driver, lambda d: "Thank you" in status_text(d) or "Not sent" in status_text(d))
    assert "Thank you" in status_text(driver), status_text(driver)


@dataclass
class Served:
    """One deployed survey with its leader, helper and page."""

    deployment: Path
    servers: list[ServerProcess]
    url: str
    results: Path


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> dict[str, Path]:
    """Both surveys of this module (the breakdowns answered exactly, and the
    randomized question drawn once) deployed and served together, open for
    an hour, answered in the browser, closed as soon as the respondents are
    done (tests/support/window.py) and collected: each survey's results
    directory by name."""
    now = int(time.time())
    opens = now - now % TP
    closes = opens + LONG_WINDOW
    root = tmp_path_factory.mktemp("breakdowns")
    surveys = {
        "exact": (SURVEY, RESPONDENTS),
        "randomized": (RANDOMIZED, [r for r in RESPONDENTS if r[2] is not None]),
    }
    started: list[ServerProcess] = []
    pages: list[Any] = []
    served: dict[str, Served] = {}
    try:
        for name, (text, _) in surveys.items():
            text = text.format(tp=TP, opens=format_time(opens), closes=format_time(closes))
            leader_addr, helper_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
            dep = deploy_survey(
                parse_survey(text), text, root / name, leader_addr, helper_addr, tls=False
            )
            for config in (dep.leader_config, dep.helper_config):
                # Exact release is an explicit opt-in at each aggregator.
                config.write_text("allow_exact_release = true\n" + config.read_text())
            servers = []
            for role, config, addr in (
                ("helper", dep.helper_config, helper_addr),
                ("leader", dep.leader_config, leader_addr),
            ):
                server = ServerProcess(role, config, root / f"{name}-{role}.log", addr)
                server.start()
                started.append(server)
                servers.append(server)
            serve, url = start_serve(dep.client_dir, root / f"{name}-serve.log")
            pages.append(serve)
            served[name] = Served(dep.out, servers, url, root / f"{name}-results")
        for name, (_, respondents) in surveys.items():
            for remote, commute, team in respondents:
                answer(browser, served[name].url, remote, commute, team)
        for s in served.values():
            close_survey(s.deployment, s.servers)
            collector_dir = s.deployment / "collector"
            out = veil("survey", "collect", "--survey-dir", collector_dir, "--out", s.results)
            assert out.returncode == 0, out.stderr
    finally:
        for serve in pages:
            stop(serve)
        for server in reversed(started):
            server.stop()
    return {name: s.results for name, s in served.items()}


def test_breakdowns_answered_in_a_browser(collected: dict[str, Path], browser: Any) -> None:
    results = collected["exact"]
    published = {q["question"]: q for q in json.loads((results / "results.json").read_text())}
    grouped = [r for r in RESPONDENTS if r[2] is not None]
    remote = published["remote_by_team"]
    assert remote["n"] == len(grouped)  # one skipped the team: no breakdown report
    want = {
        f"{t} / {yn}": sum(r[2] == i and r[0] == (yn == "yes") for r in grouped)
        for i, t in enumerate(TEAMS)
        for yn in ("no", "yes")
    }
    assert {row["label"]: row["estimate"] for row in remote["rows"]} == want
    commute = published["commute_by_team"]
    assert [row["estimate"] for row in commute["rows"]] == [
        sum(r[1] for r in grouped if r[2] == i) for i in range(3)
    ]
    assert published["remote"]["n"] == len(RESPONDENTS)
    # The report's tables and heat maps, audited in the same browser.
    browser.get((results / "report.html").as_uri())
    from selenium.webdriver.common.by import By

    assert len(browser.find_elements(By.CSS_SELECTOR, "table.breakdown")) == 2
    assert axe_violations(browser) == []


def test_a_randomized_answer_is_drawn_once_on_the_page(collected: dict[str, Path]) -> None:
    # The remote question randomized on the device, no servers' noise, every
    # respondent in a group: the page sends one draw to the question and to its
    # breakdown, so the breakdown's de-biased yes cells add up to exactly the
    # question's de-biased count of yes (both are (Y - other·n)/(keep - other)).
    # The commute randomized too (drawn as 180 or 0): its breakdown sends the draw's
    # bit and the group's count, and its de-biased group sums add up to exactly the
    # question's de-biased sum (both are (180·bits - b·n)/a).
    grouped = [r for r in RESPONDENTS if r[2] is not None]
    results = collected["randomized"]
    published = {q["question"]: q for q in json.loads((results / "results.json").read_text())}
    b = published["remote_by_team"]
    assert b["intervals"] == "simultaneous (Bonferroni)" and b["n"] == len(grouped)
    for row in b["rows"]:
        team, yn = row["label"].split(" / ")
        true = sum(TEAMS[r[2] or 0] == team and r[0] == (yn == "yes") for r in grouped)
        assert row["ci_low"] <= true <= row["ci_high"], row
    remote = published["remote"]
    assert remote["local_epsilon"] == "0.5" and remote["n"] == len(grouped)
    yes = sum(row["raw_estimate"] for row in b["rows"] if row["label"].endswith(" / yes"))
    assert yes == pytest.approx(remote["rows"][0]["raw_estimate"], abs=1e-4)
    commute = published["commute_by_team"]
    assert commute["intervals"] == "simultaneous (Bonferroni)" and commute["n"] == len(grouped)
    for i, row in enumerate(commute["rows"]):
        true = sum(r[1] for r in grouped if r[2] == i)
        assert row["ci_low"] <= true <= row["ci_high"], row
    total = next(r for r in published["commute"]["rows"] if r["label"] == "sum")
    by_team = sum(row["raw_estimate"] for row in commute["rows"])
    assert by_team == pytest.approx(total["raw_estimate"], abs=1e-3)
