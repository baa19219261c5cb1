"""A respondent's text answer typed in a real browser (Debian's headless
Chromium, as tests/support/browser.py drives it): the page normalises it and
shards it with the JavaScript Poplar1 client, a real leader and helper take
it, and once the survey is closed (it is open for an hour, and closed when
the respondents are done: tests/support/window.py) `veil survey collect`'s
function finds it level by level."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import browser, status_text, wait_for
from tests.support.survey_site import start_serve, stop
from tests.support.text_survey import editors_survey
from tests.support.window import LONG_WINDOW, close_survey
from veil.collector.survey import collect_survey
from veil.deploy import deploy_survey
from veil.local.launcher import ServerProcess, free_port
from veil.survey import parse_survey

pytestmark = [pytest.mark.browser, pytest.mark.slow]
__all__ = ["browser"]  # the fixture, used by name

TP = 5


def type_answer(driver: Any, url: str, text: str) -> str:
    """Type `text` as the answer and submit; the page's status line after it."""
    from selenium.webdriver.common.by import By

    driver.get(url)
    wait_for(driver, lambda d: d.find_element(By.ID, "survey").get_attribute("data-ready"))
    box = driver.find_element(By.ID, "a-editor")
    box.clear()
    box.send_keys(text)
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(
        driver,
        lambda d: any(w in status_text(d) for w in ("Thank you", "Not sent", "need a change")),
    )
    return status_text(driver)


def test_a_text_answer_typed_in_a_browser_is_counted(tmp_path: Path, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    now = int(time.time())
    opens = now - now % TP
    closes = opens + LONG_WINDOW
    text = editors_survey(opens, closes, TP, max_bytes=6)
    leader_addr, helper_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    dep = deploy_survey(
        parse_survey(text), text, tmp_path / "out", leader_addr, helper_addr, tls=False
    )
    for config in (dep.leader_config, dep.helper_config):
        config.write_text("allow_exact_release = true\n" + config.read_text())
    helper = ServerProcess("helper", dep.helper_config, tmp_path / "helper.log", helper_addr)
    leader = ServerProcess("leader", dep.leader_config, tmp_path / "leader.log", leader_addr)
    serve = None
    try:
        helper.start()
        leader.start()
        serve, url = start_serve(dep.client_dir, tmp_path / "serve.log", "--rate", "1000")
        # Too long: refused on the device with the reason, nothing sent.
        assert "need a change" in type_answer(browser, url, "Sublime")
        error = browser.find_element(By.ID, "err-editor").text
        assert "too long: at most 6 bytes" in error, error
        # The same answer typed three ways, and one given once.
        for typed in ("Vim", "  vim ", "VIM", "Emacs"):
            assert "Thank you" in type_answer(browser, url, typed)
        close_survey(dep.out, [helper, leader])
        outcome = collect_survey(dep.collector_dir, tmp_path / "results", wait=60)
        assert outcome.complete, outcome.pending
    finally:
        stop(serve)
        leader.stop()
        helper.stop()
    (editor,) = json.loads((tmp_path / "results" / "results.json").read_text())
    assert editor["n"] == 4
    # Without noise the threshold is 2: "vim" (three respondents) is released,
    # "emacs" (one) is not.
    assert [(row["label"], row["estimate"]) for row in editor["rows"]] == [("vim", 3)]
