"""A survey with invitations answered on the page in a real browser: the code
comes from the link's #fragment, the page redeems it at the issuer `veil
survey serve --issuer-dir` serves, and its reports carry their tokens; the
same link again says "This invitation has already been used.", the page
without a code says the survey is by invitation, and the page's POST
/reports refuses a report without a token (nothing stored)."""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import answers, browser, respond, status_text, wait_for
from tests.support.survey_site import SURVEY, post_json, start_serve, stop
from veil.client import Client, prepare_reports
from veil.deploy import deploy_survey
from veil.invite.client import redeem
from veil.invite.issuer import mint
from veil.local.launcher import ServerProcess, free_port
from veil.messages import Ciphertext, Report
from veil.survey import load_description, parse_survey
from veil.task import ClientTask, b64e, load_task
from veil.times import format_time

pytestmark = [pytest.mark.browser, pytest.mark.slow]
__all__ = ["browser"]  # the fixture, used by name

TP = 60


@pytest.fixture(scope="module")
def invited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """One deployment with invitations for the module's tests (servers, page
    and issuer): each test mints codes of its own and counts what it adds."""
    tmp_path = tmp_path_factory.mktemp("invited")
    opens = int(time.time()) // TP * TP
    text = SURVEY.format(
        epsilon="1", mechanism="geometric", tp=TP, opens=format_time(opens),
        closes=format_time(opens + 3600),
    ).replace("[survey]\n", "[survey]\ninvitations = true\n", 1)  # fmt: skip
    leader, helper = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    dep = deploy_survey(parse_survey(text), text, tmp_path / "out", leader, helper, tls=False)
    servers = [
        ServerProcess("helper", dep.helper_config, tmp_path / "helper.log", helper),
        ServerProcess("leader", dep.leader_config, tmp_path / "leader.log", leader),
    ]
    serve = None
    try:
        for s in servers:
            s.start()
        serve, url = start_serve(
            dep.client_dir, tmp_path / "serve.log", "--issuer-dir", str(dep.out / "issuer")
        )
        yield dep.out, url
    finally:
        stop(serve)
        for s in reversed(servers):
            s.stop()


def sealed(client_dir: Path, answer: int = 1, report_id: bytes | None = None) -> Report:
    """A report of question `remote`, sealed without its token."""
    task = load_task(client_dir / "remote.toml", ClientTask)
    with Client(task) as client:
        configs = client.hpke_config(2), client.hpke_config(3)
    ids = None if report_id is None else [report_id]
    (r,) = prepare_reports(task, [answer], *configs, int(time.time()), report_ids=ids, invited=True)
    return r


def as_posted(client_dir: Path, r: Report) -> dict[str, Any]:
    """Report `r` of question `remote` as the page posts it."""
    task = load_task(client_dir / "remote.toml", ClientTask)

    def ct(c: Ciphertext) -> dict[str, Any]:
        return {"config_id": c.config_id, "enc": b64e(c.enc), "payload": b64e(c.payload)}

    return {
        **({"token": b64e(r.token)} if r.token else {}),
        "task_id": task.id_text,
        "report_id": b64e(r.report_id),
        "time": r.time,
        "public_share": b64e(r.public_share),
        "leader_encrypted_input_share": ct(r.leader_ct),
        "helper_encrypted_input_share": ct(r.helper_ct),
    }


def untokened(client_dir: Path, token: bytes = b"") -> dict[str, Any]:
    """A report of question `remote` as the page posts it, with `token`
    (none by default) where a token issued for it would be."""
    return as_posted(client_dir, replace(sealed(client_dir), token=token))


def stored(out: Path) -> int:
    with sqlite3.connect(out / "leader" / "leader.db") as db:
        n: int = db.execute("SELECT COUNT(*) FROM reports").fetchone()[0]
    return n


def used_invitations(out: Path) -> int:
    with sqlite3.connect(out / "issuer" / "issuer.db") as db:
        n: int = db.execute("SELECT COUNT(used) FROM invitations").fetchone()[0]
    return n


def submit(driver: Any, url: str) -> str:
    from selenium.webdriver.common.by import By

    driver.get(url)
    wait_for(driver, lambda d: d.find_element(By.ID, "survey").get_attribute("data-ready"))
    driver.find_element(By.ID, "a-remote-yes").click()
    for j in (0, 1):
        driver.find_element(By.ID, f"a-tools-{j}").click()
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(
        driver, lambda d: any(w in status_text(d) for w in ("Not sent", "Thank", "invitation"))
    )
    return status_text(driver)


def test_invited_respondents_answer_in_a_browser(invited: tuple[Path, str], browser: Any) -> None:
    from selenium.webdriver.common.by import By

    out, url = invited
    codes = mint(out / "issuer", 2)
    before = stored(out)
    browser.get("about:blank")
    respond(browser, f"{url}#invitation={codes[0]}", answers(0))
    # A second link opened in the same tab changes only the fragment: the page
    # starts again from it (issue 41: it kept the first one's "Thank you").
    browser.execute_script("window.earlier = true")
    browser.execute_script(f"location.hash = 'invitation={codes[1]}'")
    wait_for(browser, lambda d: d.execute_script("return window.earlier === undefined"))
    wait_for(browser, lambda d: d.find_element(By.ID, "survey").get_attribute("data-ready"))
    assert "Thank you" not in status_text(browser)
    respond(browser, f"{url}#invitation={codes[1]}", answers(1))
    assert stored(out) == before + 2 * 5
    browser.get("about:blank")
    again = submit(browser, f"{url}#invitation={codes[0]}")
    assert "This invitation has already been used." in again
    # Without a code the page says so as it loads, the form disabled (issue 41:
    # only once the whole form was filled in).
    browser.get("about:blank")
    browser.get(url)
    wait_for(browser, lambda d: d.find_element(By.ID, "survey").get_attribute("data-ready"))
    assert "This survey is by invitation: open the link you were given." in status_text(browser)
    controls = browser.find_elements(By.CSS_SELECTOR, "#survey input, #survey button")
    assert controls and all(not c.is_enabled() for c in controls)
    # The page's own check: a report without its token is malformed here.
    status, answer = post_json(url + "reports", {"reports": [untokened(out / "client")]})
    assert status == 400 and "missing 'token'" in answer["error"]
    # A forged token of the right size: the leader's refusal, as 403.
    forged = untokened(out / "client", b"\x00\x02" + secrets.token_bytes(352))
    status, answer = post_json(url + "reports", {"reports": [forged]})
    assert status == 403 and "invalid invitation token" in answer["error"], answer
    assert stored(out) == before + 2 * 5
    for path in (out / "leader").glob("leader.db*"):
        assert not any(c.encode() in path.read_bytes() for c in codes)


def test_a_spent_token_with_other_content_is_refused(invited: tuple[Path, str]) -> None:
    """A token already spent on one report, sent again with other content
    under its report id: its challenge commits to the first report's
    content, so the leader refuses it as a token of other content and the
    page answers 403 with that (issue 40, items 7 and 2)."""
    out, url = invited
    (code,) = mint(out / "issuer", 1)
    tasks = load_description(out / "client").load_tasks()
    mine = sealed(out / "client", 1)
    reports = [mine if name == "remote" else None for name in tasks]
    answered = redeem(url + "invitation", code, list(tasks.values()), reports)
    tokened = dict(zip(tasks, answered, strict=True))
    first = tokened["remote"]
    assert first is not None
    assert post_json(url + "reports", {"reports": [as_posted(out / "client", first)]})[0] == 200
    other = replace(sealed(out / "client", 0, first.report_id), token=first.token)
    status, answer = post_json(url + "reports", {"reports": [as_posted(out / "client", other)]})
    assert status == 403, answer
    assert "other content under this report id" in answer["error"], answer


def test_the_page_checks_the_issuer_keys_against_the_link(
    invited: tuple[Path, str], browser: Any
) -> None:
    """Key consistency (issue 40, item 4): a link's fingerprint that is not
    the one of the keys the page serves closes the form before anything is
    redeemed; the right one opens it, and the page shows the fingerprint."""
    from selenium.webdriver.common.by import By

    from veil.cli.invite import issuer_keys_fingerprint

    out, url = invited
    (code,) = mint(out / "issuer", 1)
    used = used_invitations(out)
    published = issuer_keys_fingerprint(out / "issuer")
    other = "ab" * 32
    browser.get("about:blank")
    browser.get(f"{url}#invitation={code}&keys={other}")
    wait_for(browser, lambda d: d.find_element(By.ID, "survey").get_attribute("data-ready"))
    said = status_text(browser)
    assert f"This page's issuer keys (fingerprint {published}) are not the ones your link" in said
    assert f"names ({other})" in said and "your invitation is unused" in said
    controls = browser.find_elements(By.CSS_SELECTOR, "#survey input, #survey button")
    assert controls and all(not c.is_enabled() for c in controls)
    assert used_invitations(out) == used
    browser.get("about:blank")
    spelled = ":".join(published[i : i + 2] for i in range(0, 64, 2)).upper()
    browser.get(f"{url}#invitation={code}&keys={spelled}")
    wait_for(browser, lambda d: d.find_element(By.ID, "survey").get_attribute("data-ready"))
    shown = browser.find_element(By.ID, "issuer-keys")
    assert shown.is_displayed() and shown.text == f"Issuer keys fingerprint: {published}"
    assert all(c.is_enabled() for c in browser.find_elements(By.CSS_SELECTOR, "#survey input"))
