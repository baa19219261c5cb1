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
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import browser, status_text, wait_for
from tests.support.cli import veil
from tests.support.survey_site import start_serve, stop
from tests.support.window import survey_window
from tests.web.test_browser import axe_violations
from veil.deploy import deploy_survey
from veil.local.launcher import ServerProcess, free_port
from veil.survey import parse_survey
from veil.times import format_time

pytestmark = [pytest.mark.browser, pytest.mark.slow]
__all__ = ["browser"]  # the fixture, used by name

TP = 5
# Six process starts and six respondents inside the window (about 30 s on a
# 2-core machine busy with the suite alone), stretched by the slowdown
# measured as the test deploys (tests/support/window.py).
WINDOW = 70
TEAMS = ["engineering", "design", "sales"]

SURVEY = """\
[survey]
name = "Breakdowns in a browser"
mechanism = "none"
min_batch_size = 1
max_respondents = 1000
time_precision = {tp}
opens = "{opens}"
closes = "{closes}"

[[question]]
id = "remote"
text = "Do you work remotely most days?"
kind = "yes_no"
required = true

[[question]]
id = "commute"
text = "How many minutes is your commute?"
kind = "integer"
max = 180

[[question]]
id = "team"
text = "Which team are you in?"
kind = "choice"
options = ["engineering", "design", "sales"]

[[breakdown]]
id = "remote_by_team"
question = "remote"
by = "team"

[[breakdown]]
id = "commute_by_team"
question = "commute"
by = "team"
"""

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


def test_breakdowns_answered_in_a_browser(tmp_path: Path, browser: Any) -> None:
    window = survey_window(WINDOW, TP)
    now = int(time.time())
    opens = now - now % TP
    closes = opens + window
    text = SURVEY.format(tp=TP, opens=format_time(opens), closes=format_time(closes))
    leader_addr, helper_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    dep = deploy_survey(
        parse_survey(text), text, tmp_path / "out", leader_addr, helper_addr, tls=False
    )
    for config in (dep.leader_config, dep.helper_config):
        # Exact release is an explicit opt-in at each aggregator.
        config.write_text("allow_exact_release = true\n" + config.read_text())
    helper = ServerProcess("helper", dep.helper_config, tmp_path / "helper.log", helper_addr)
    leader = ServerProcess("leader", dep.leader_config, tmp_path / "leader.log", leader_addr)
    serve = None
    try:
        helper.start()
        leader.start()
        serve, url = start_serve(dep.client_dir, tmp_path / "serve.log")
        for remote, commute, team in RESPONDENTS:
            answer(browser, url, remote, commute, team)
        assert time.time() < closes, "the respondents took longer than the survey window"
        time.sleep(max(0.0, closes - time.time() + 0.5))
        results = tmp_path / "results"
        out = veil("survey", "collect", "--survey-dir", dep.collector_dir, "--out", results)
        assert out.returncode == 0, out.stderr
    finally:
        stop(serve)
        leader.stop()
        helper.stop()
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
