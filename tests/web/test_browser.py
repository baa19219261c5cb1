"""Respondents in a real browser: Debian's headless Chromium (driven by
selenium) fills and submits the survey page of `veil survey serve` for 12
respondents with known answers (between them every option of every
question); the page shards and seals each answer; a real leader and helper
aggregate; collection gives the exact sums with mechanism none and sums
within their intervals with geometric noise. A points question is answered
on a page of its own. The three surveys are deployed together, open for an
hour, answered, and closed as soon as the respondents are done (the module's
fixture; tests/support/window.py), then each test collects its own.

Needs chromium and chromedriver (`.ci/run` installs Debian's `chromium` and
`chromium-driver`); skips without them, except under CI, where it fails.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import answers, browser, respond, status_text, wait_for
from tests.support.modes import unavailable
from tests.support.survey_site import SurveyServers, start_serve, stop, survey_servers, write_survey
from tests.support.window import LONG_WINDOW, close_survey
from veil.collector import Collector
from veil.deploy import Deployment
from veil.local.launcher import ServerProcess
from veil.task import CollectorTask, load_task

pytestmark = [pytest.mark.browser, pytest.mark.slow]
__all__ = ["browser"]  # the fixture, used by name

# answers(i) for i < 12 gives each option of each question at least once:
# every team and both answers to remote, each of the four tools, alone and in
# pairs.
RESPONDENTS = 12
NOISY_RESPONDENTS = 5
TP = 5


def expected(n: int) -> dict[str, Any]:
    rows = [answers(i) for i in range(n)]
    team = [0, 0, 0]
    tools = [0, 0, 0, 0]
    for r in rows:
        team[r["team"]] += 1
        for j in r["tools"]:
            tools[j] += 1
    return {
        "remote": sum(r["remote"] for r in rows),
        "commute": sum(r["commute"] for r in rows),
        "team": team,
        "tools": tools,
        "ratings": [sum(r["ratings"][0] for r in rows), sum(r["ratings"][1] for r in rows)],
    }


def skip_optional_questions(driver: Any, url: str) -> None:
    """Answer only the required questions: yes, and no tool (nothing checked
    is the answer "none" for a required multiple choice); the optional ones
    are sent no report."""
    from selenium.webdriver.common.by import By

    driver.get(url)
    wait_for(driver, lambda d: d.find_element(By.ID, "survey").get_attribute("data-ready"))
    assert "An answer is needed." in driver.find_element(By.ID, "hint-remote").text
    driver.find_element(By.ID, "a-remote-yes").click()
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(driver, lambda d: "Thank you" in status_text(d) or "Not sent" in status_text(d))
    assert "Thank you" in status_text(driver), status_text(driver)


def check_refuses_bad_answer(driver: Any, url: str) -> None:
    """An out-of-range answer is shown next to its question; nothing is sent."""
    from selenium.webdriver.common.by import By

    driver.get(url)
    wait_for(driver, lambda d: d.find_element(By.ID, "survey").get_attribute("data-ready"))
    driver.find_element(By.ID, "a-commute").send_keys("999")
    for j in range(3):
        driver.find_element(By.ID, f"a-tools-{j}").click()
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(driver, lambda d: "need a change" in status_text(d))
    assert "from 0 to 180" in driver.find_element(By.ID, "err-commute").text
    assert "at most 2" in driver.find_element(By.ID, "err-tools").text
    # Required, left unanswered; the other questions may be skipped.
    assert driver.find_element(By.ID, "err-remote").text == "This question needs an answer."
    assert driver.find_element(By.ID, "err-team").text == ""
    field = driver.find_element(By.ID, "a-commute")
    assert field.get_attribute("aria-invalid") == "true"


def screenshot_is_not_blank(driver: Any, path: Path) -> None:
    from PIL import Image

    driver.save_screenshot(str(path))
    with Image.open(path) as img:
        rgb = img.convert("RGB")
        colors = rgb.getcolors(maxcolors=1 << 20) or []
        width, height = rgb.size
    assert (width, height) >= (300, 500), (width, height)
    # Text, borders, the button: a blank or single-colour page has a handful.
    assert len(colors) > 50, len(colors)
    dominant = max(count for count, _ in colors)
    assert dominant < 0.95 * width * height


AXE = Path(__file__).resolve().parents[2] / "js" / "node_modules" / "axe-core" / "axe.min.js"


def axe_violations(driver: Any) -> list[Any]:
    """An automated WCAG 2.1 A/AA audit (axe-core, from npm) of the page the
    browser shows, with axe's best practices (landmarks, one main, headings)."""
    if not AXE.exists():
        unavailable("js/node_modules missing: run `npm ci` in js/ (axe-core)")
    driver.execute_script(AXE.read_text())
    found: list[Any] = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        " axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a',"
        " 'wcag21aa', 'best-practice']}})"
        " .then(r => done(r.violations.map(v => [v.id, v.help,"
        " v.nodes.map(n => n.target.join(' '))])))"
        " .catch(e => done([['axe failed', String(e), []]]));"
    )
    return found


def collect(s: SurveyServers, qid: str) -> Any:
    with Collector(
        load_task(s.deployment.collector_dir / f"{qid}.toml", CollectorTask)
    ) as collector:
        return collector.collect(s.opens, s.closes - s.opens, wait=60, confidence=1 - 1e-7)


@dataclass
class Answered:
    """The module's three surveys, answered and closed."""

    exact: SurveyServers
    noisy: SurveyServers
    points: Deployment


@pytest.fixture(scope="module")
def answered(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Iterator[Answered]:
    """The team survey without noise and with geometric noise, and the points
    survey, deployed with one window and their servers running: each answered
    in the browser (the team page also refusing a bad answer, shown on a phone
    and audited), then closed. Collection is each test's."""
    now = int(time.time())
    opens = now - now % TP
    closes = opens + LONG_WINDOW
    root = tmp_path_factory.mktemp("browser")
    with ExitStack() as stack:
        exact = stack.enter_context(
            survey_servers(root / "exact", "none", opens, closes, TP, "--rate", "1000")
        )
        noisy = stack.enter_context(
            survey_servers(root / "noisy", "geometric", opens, closes, TP, "--rate", "1000")
        )
        points, points_url, points_run = stack.enter_context(
            points_servers(root / "points", opens, closes)
        )
        check_refuses_bad_answer(browser, exact.url)
        # The page as a respondent first sees it, on a phone-sized screen.
        browser.get(exact.url)
        screenshot_is_not_blank(browser, root / "survey-page.png")
        assert axe_violations(browser) == []
        for i in range(RESPONDENTS):
            respond(browser, exact.url, answers(i), keyboard=i == 0)
        skip_optional_questions(browser, exact.url)
        for i in range(NOISY_RESPONDENTS):
            respond(browser, noisy.url, answers(i))
        answer_points(browser, points_url)
        for s in (exact, noisy):
            s.closes = close_survey(s.deployment.out, [s.helper, s.leader])
        close_survey(points.out, points_run)
        yield Answered(exact, noisy, points)


def test_respondents_in_a_browser(answered: Answered) -> None:
    exact, noisy = answered.exact, answered.noisy
    want = expected(RESPONDENTS)
    want["remote"] += 1  # the respondent who skipped the optional questions said yes
    for qid, value in want.items():
        r = collect(exact, qid)
        # Each question's n: those who answered it.
        answered_it = RESPONDENTS + (qid in ("remote", "tools"))
        assert r.report_count == answered_it, qid
        assert r.mechanism == "none"
        assert r.estimate == value, qid

    want = expected(NOISY_RESPONDENTS)
    for qid, value in want.items():
        r = collect(noisy, qid)
        assert r.report_count == NOISY_RESPONDENTS, qid
        assert r.mechanism == "geometric" and r.epsilon_spent > 0
        if isinstance(value, list):
            for v, lo, hi in zip(value, r.lower, r.upper, strict=True):
                assert lo <= v <= hi, qid
        else:
            assert r.lower <= value <= r.upper, qid


def test_report_page_passes_an_accessibility_audit(tmp_path: Path, browser: Any) -> None:
    # report.html had no main landmark and content outside landmarks.
    from tests.support.results import SEVEN_SURVEY, seven
    from veil.collector.survey import write_results
    from veil.survey import parse_survey

    write_results(parse_survey(SEVEN_SURVEY), seven(), tmp_path)
    browser.get((tmp_path / "report.html").as_uri())
    assert axe_violations(browser) == []


def test_page_before_the_window_opens_and_after_it_closes(tmp_path: Path, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    now = int(time.time())
    hour = now - now % 3600
    for name, opens, closes, says, moment in (
        ("early", hour + 7200, hour + 10800, "This survey opens on ", hour + 7200),
        ("late", hour - 10800, hour - 3600, "This survey closed on ", hour - 3600),
    ):
        dep, _, _ = write_survey(tmp_path / name, "none", opens, closes, 3600)
        # The page alone: no aggregator is needed to show it.
        serve, url = start_serve(dep.client_dir, tmp_path / f"{name}.log")
        try:
            browser.get(url)
            wait_for(
                browser, lambda d: d.find_element(By.ID, "survey").get_attribute("data-window")
            )
            shown = status_text(browser)
            assert shown.startswith(says) and str(time.gmtime(moment).tm_year) in shown, shown
            controls = browser.find_elements(By.CSS_SELECTOR, "#survey input, #survey button")
            assert controls and all(not c.is_enabled() for c in controls)
            assert axe_violations(browser) == []
        finally:
            stop(serve)


POINTS_SURVEY = """\
[survey]
name = "Priorities"
mechanism = "none"
min_batch_size = 1
time_precision = {tp}
opens = "{opens}"
closes = "{closes}"

[[question]]
id = "budget"
text = "Split 100 points across what we should improve"
kind = "points"
options = ["training", "tools", "travel"]
total = 100
"""


def type_points(driver: Any, values: list[str]) -> str:
    """Type each option's points (an empty string leaves its box empty); the
    running total as it then reads."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    for i, value in enumerate(values):
        box = driver.find_element(By.ID, f"a-budget-{i}")
        # As a person empties a box: each key an input event.
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(Keys.BACKSPACE)
        if value:
            box.send_keys(value)
    return str(driver.find_element(By.ID, "total-budget").text)


@contextmanager
def points_servers(
    root: Path, opens: int, closes: int
) -> Iterator[tuple[Deployment, str, list[ServerProcess]]]:
    """The points survey deployed (mechanism none) with its leader, helper and
    page running: the deployment, the page's address and the two servers."""
    from veil.deploy import deploy_survey
    from veil.local.launcher import free_port
    from veil.survey import parse_survey
    from veil.times import format_time

    text = POINTS_SURVEY.format(tp=TP, opens=format_time(opens), closes=format_time(closes))
    leader_addr, helper_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    dep = deploy_survey(parse_survey(text), text, root / "out", leader_addr, helper_addr, tls=False)
    for config in (dep.leader_config, dep.helper_config):
        config.write_text("allow_exact_release = true\n" + config.read_text())
    helper = ServerProcess("helper", dep.helper_config, root / "helper.log", helper_addr)
    leader = ServerProcess("leader", dep.leader_config, root / "leader.log", leader_addr)
    serve = None
    try:
        helper.start()
        leader.start()
        serve, url = start_serve(dep.client_dir, root / "serve.log")
        yield dep, url, [helper, leader]
    finally:
        stop(serve)
        leader.stop()
        helper.stop()


def answer_points(browser: Any, url: str) -> None:
    """The points page as issue 42 asks (see the test below), then three
    splits sent: 70/30/0, 0/0/100 and 10/20/30."""
    from selenium.webdriver.common.by import By

    browser.get(url)
    wait_for(browser, lambda d: d.find_element(By.ID, "survey").get_attribute("data-ready"))
    line = browser.find_element(By.ID, "total-budget")
    assert line.get_attribute("aria-live") == "polite"
    assert line.text == "0 of 100 points given."
    labels = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#q-budget label")]
    assert labels == ["training", "tools", "travel"]
    assert axe_violations(browser) == []

    assert type_points(browser, ["40", "", "25"]) == "65 of 100 points given."
    assert type_points(browser, ["70", "50", ""]) == "120 of 100 points given: 20 too many."
    assert "over" in str(line.get_attribute("class"))
    assert axe_violations(browser) == []  # the total's error colour still contrasts
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(browser, lambda d: "need a change" in status_text(d))
    error = browser.find_element(By.ID, "err-budget").text
    assert error == "These add up to 120 points, over the 100 you have: take 20 off."
    box = browser.find_element(By.ID, "a-budget-0")
    assert box.get_attribute("aria-invalid") == "true"

    sent = [["70", "30", ""], ["", "", "100"], ["10", "20", "30"]]
    for i, split in enumerate(sent):
        if i:
            browser.get(url)
            wait_for(browser, lambda d: d.find_element(By.ID, "survey").get_attribute("data-ready"))
        type_points(browser, split)
        browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait_for(browser, lambda d: "Thank you" in status_text(d) or "Not sent" in status_text(d))
        assert "Thank you" in status_text(browser), status_text(browser)


def test_a_points_question_in_a_browser(answered: Answered, browser: Any, tmp_path: Path) -> None:
    """Issue 42: a number box per option, the running total kept as the respondent
    types (a polite live region), a split over the total refused on the page and
    nothing sent, the page and the report audited by axe-core (the page's part
    is the module fixture's, answer_points); the splits sent summed exactly
    through a real leader and helper."""
    from veil.collector.survey import collect_survey

    outcome = collect_survey(answered.points.collector_dir, tmp_path / "results", wait=60)
    assert outcome.complete, outcome.pending
    (r,) = outcome.results
    assert r.n == 3
    # Mechanism none: each option's mean points exactly (80, 50 and 130 over 3).
    assert [row.estimate for row in r.rows] == pytest.approx([80 / 3, 50 / 3, 130 / 3])
    browser.get((tmp_path / "results" / "report.html").as_uri())
    assert "Split 100 points" in browser.page_source
    assert axe_violations(browser) == []
