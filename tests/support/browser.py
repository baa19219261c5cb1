"""A real browser for the web tests: Debian's headless Chromium driven by
selenium, in a phone-sized window, and the page helpers that wait on it, read
its status line and answer the team survey (tests.support.survey_site.SURVEY)
as a respondent would.

Needs chromium and chromedriver (`.ci/run` installs Debian's `chromium` and
`chromium-driver`); the fixture skips without them, except under CI, where it
fails. A test module takes the fixture by importing `browser`.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.modes import unavailable


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        unavailable(
            "chromium and chromedriver not found: install Debian's chromium and chromium-driver"
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        unavailable("selenium not installed: pip install -e '.[test]'")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    # A phone-sized window: the page must work there.
    options.add_argument("--window-size=390,844")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver: Any, condition: Any, timeout: float = 30.0) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition)


def status_text(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.ID, "status").text)


def respond(driver: Any, url: str, a: dict[str, Any], keyboard: bool = False) -> None:
    """Open the page, fill the form as a respondent would, submit, and wait
    for the page to say the answers were received."""
    from selenium.webdriver.common.by import By

    driver.get(url)
    wait_for(driver, lambda d: d.find_element(By.ID, "survey").get_attribute("data-ready"))
    find = driver.find_element
    if keyboard:
        keyboard_only(driver, a)
    else:
        find(By.ID, "a-remote-yes" if a["remote"] else "a-remote-no").click()
        find(By.ID, "a-commute").send_keys(str(a["commute"]))
        find(By.ID, f"a-team-{a['team']}").click()
        for j in a["tools"]:
            find(By.ID, f"a-tools-{j}").click()
        for j, v in enumerate(a["ratings"]):
            find(By.ID, f"a-ratings-{j}").send_keys(str(v))
        find(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(driver, lambda d: "Thank you" in status_text(d) or "Not sent" in status_text(d))
    assert "Thank you" in status_text(driver), status_text(driver)


def answers(i: int) -> dict[str, Any]:
    """Respondent i's known answers, in the page's terms."""
    tools = [j for j in range(4) if (i >> j) & 1][:2]
    return {
        "remote": i % 2 == 0,
        "commute": (i * 37) % 181,
        "team": i % 3,
        "tools": tools,
        "ratings": [i % 11, (3 * i + 1) % 11],
    }


def keyboard_only(driver: Any, a: dict[str, Any]) -> None:
    """Answer with the keyboard alone: Tab between questions, arrows and Space
    in radio groups, Space on checkboxes, Enter to submit."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    def keys(*k: str) -> None:
        ActionChains(driver).send_keys(*k).perform()

    keys(Keys.TAB)  # the first control: the exact privacy statement's summary
    assert driver.switch_to.active_element.tag_name == "summary"
    keys(Keys.TAB)  # then the first radio of "remote"
    assert driver.switch_to.active_element.get_attribute("id") == "a-remote-yes"
    keys(Keys.SPACE if a["remote"] else Keys.ARROW_DOWN)
    keys(Keys.TAB)
    keys(str(a["commute"]))
    keys(Keys.TAB)
    keys(*([Keys.SPACE] if a["team"] == 0 else [Keys.ARROW_DOWN] * a["team"]))
    keys(Keys.TAB)
    for j in range(4):
        if j in a["tools"]:
            keys(Keys.SPACE)
        keys(Keys.TAB)
    keys(str(a["ratings"][0]), Keys.TAB, str(a["ratings"][1]), Keys.ENTER)
