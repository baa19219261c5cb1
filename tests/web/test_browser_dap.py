"""A survey with invitations deployed over DAP answered in a real browser
(Debian's headless Chromium, as tests/support/browser.py drives it): each
respondent opens an invitation link, the page draws each answer's DAP report
keys, redeems the invitation for tokens bound to them at the issuer `veil
survey serve --issuer-dir` serves, and seals each Report with its token in
veil's invitation extension (js/src/dap.js); `veil survey serve` checks and
relays it to the leader as a DAP upload, a real leader and helper aggregate
over DAP with mechanism none, and `veil survey collect` publishes every
answer exactly. The same link again is refused on the page. Hostile DAP
reports at the relay (not base64url, truncated, trailing bytes, shares of
the wrong size, another extension, veil's own report shape for a DAP task,
a body that is not JSON; for the invitation extension: missing, oversized,
given twice, a garbled token or leader key digest, a token for another
report) are refused 400, and a spent token with other content 409, with
nothing stored.

Needs chromium and chromedriver; skips without them, except under CI, where
it fails.
"""

from __future__ import annotations

import base64
import json
import secrets
import sqlite3
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import browser, status_text, wait_for
from tests.support.cli import veil
from tests.support.node import js_dap_reports
from tests.support.survey_site import http, post_json, start_serve, stop
from tests.support.survey_toml import commute, remote, team
from tests.support.window import LONG_WINDOW, close_survey
from veil.client import DapClient
from veil.dap.invitation import INVITATION_EXTENSION, InvitationExtension
from veil.dap.messages import Extension, Report, ReportMetadata
from veil.dap.report import prepare_report
from veil.deploy import deploy_survey
from veil.hpke import HpkeConfig
from veil.invite.client import redeem_tokens
from veil.invite.issuer import mint
from veil.local.launcher import ServerProcess, free_port
from veil.survey import load_description, parse_survey
from veil.task import ClientTask, DapSpec, b64d, load_task
from veil.times import format_time

pytestmark = [pytest.mark.browser, pytest.mark.slow]
__all__ = ["browser"]  # the fixture, used by name

TP = 5

SURVEY = (
    """\
[survey]
name = "DAP in a browser"
invitations = true
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
)

RESPONDENTS = [(True, 10, 0), (False, 45, 2), (True, 30, 2)]


def _answer(driver: Any, url: str, remote: bool, commute: int, team: int) -> str:
    """Answer on the page at `url` (a link with its invitation); what the page says."""
    from selenium.webdriver.common.by import By

    driver.get("about:blank")
    driver.get(url)
    wait_for(driver, lambda d: d.find_element(By.ID, "survey").get_attribute("data-ready"))
    driver.find_element(By.ID, "a-remote-yes" if remote else "a-remote-no").click()
    driver.find_element(By.ID, "a-commute").send_keys(str(commute))
    driver.find_element(By.ID, f"a-team-{team}").click()
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(driver, lambda d: "Thank you" in status_text(d) or "Not sent" in status_text(d))
    return status_text(driver)


def _stored(leader_config: Path) -> int:
    with sqlite3.connect(leader_config.parent / "leader.db") as conn:
        return int(conn.execute("SELECT COUNT(*) FROM reports").fetchone()[0])


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _hostile(task_id: str, real: bytes) -> list[tuple[str, Any]]:
    """(what, the POST body's one report) for hostile DAP reports of a task."""
    report = Report.decode(real)
    extended = Report(
        report.metadata.__class__(
            report.metadata.report_id, report.metadata.time, (Extension(0xFF00, b""),)
        ),
        report.public_share,
        report.leader_encrypted_input_share,
        report.helper_encrypted_input_share,
    )
    short_share = report.leader_encrypted_input_share.__class__(
        report.leader_encrypted_input_share.config_id,
        report.leader_encrypted_input_share.enc,
        report.leader_encrypted_input_share.payload[:-1],
    )
    short = Report(
        report.metadata, report.public_share, short_share, report.helper_encrypted_input_share
    )
    return [
        ("not base64url", {"task_id": task_id, "dap_report": "not base64!"}),
        ("truncated", {"task_id": task_id, "dap_report": _b64(real[:-1])}),
        ("trailing bytes", {"task_id": task_id, "dap_report": _b64(real + b"\0")}),
        ("empty", {"task_id": task_id, "dap_report": ""}),
        ("a share too short", {"task_id": task_id, "dap_report": _b64(short.encode())}),
        ("an extension", {"task_id": task_id, "dap_report": _b64(extended.encode())}),
        ("a number", {"task_id": task_id, "dap_report": 7}),
        ("veil's report shape", {"task_id": task_id, "report_id": _b64(bytes(16)), "time": 0}),
        ("an extra key", {"task_id": task_id, "dap_report": _b64(real), "token": "AA"}),
    ]


def _invited_report(url: str, client_dir: Path, code: str) -> Report:
    """A report of question `remote` (yes) with its token in the invitation
    extension, as the Python client builds it (DapClient.prepare_invited),
    redeemed at the page's issuer with invitation `code` and sealed, not sent."""
    description = load_description(client_dir)
    tasks = description.load_tasks()
    task = tasks["remote"]
    with DapClient(task) as client:
        when = int(time.time()) // TP * TP
        invited = client.prepare_invited(1, when)
        contexts = [invited.context if q == "remote" else None for q in tasks]
        tokens = redeem_tokens(url + "invitation", code, list(tasks.values()), contexts)
        token = tokens[list(tasks).index("remote")]
        assert token is not None
        extension = InvitationExtension(token, invited.leader_key_digest).extension()
        assert task.dap is not None
        return prepare_report(
            task.dap.dap_version, task.task_id, client.configuration, client.vdaf,
            1, invited.pending.time, *invited.configs, report_id=invited.pending.report_id,
            rand=invited.pending.rand, public_extensions=(extension,),
            ephemerals=invited.ephemerals,
        )  # fmt: skip


def _with(report: Report, extensions: tuple[Extension, ...], report_id: bytes | None = None) -> str:
    """`report` with other public extensions (and report id), encoded as the page posts it."""
    metadata = ReportMetadata(
        report.metadata.report_id if report_id is None else report_id,
        report.metadata.time,
        extensions,
    )
    return _b64(
        Report(
            metadata,
            report.public_share,
            report.leader_encrypted_input_share,
            report.helper_encrypted_input_share,
        ).encode()
    )


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]


def _hostile_invitations(report: Report) -> list[tuple[str, bytes, str]]:
    """(what, the report as posted, the error's words) for reports of a task
    with invitations whose invitation extension is not what the relay takes."""
    (ext,) = report.metadata.public_extensions
    data = ext.extension_data
    token_size = len(data) - 32

    def extension(d: bytes) -> tuple[Extension, ...]:
        return (Extension(INVITATION_EXTENSION, d),)

    return [
        ("no extension", _with(report, ()), "carries one extension"),
        ("oversized", _with(report, extension(data + b"\0")), "is 386 bytes, not 387"),
        ("given twice", _with(report, (ext, ext)), "carries one extension"),
        ("a garbled token", _with(report, extension(_flip(data, token_size - 1))),
         "signature does not verify"),
        ("another token type", _with(report, extension(_flip(data, 1))), "token type"),
        ("a garbled key digest", _with(report, extension(_flip(data, token_size))),
         "leader key digest"),
        ("a token for another report", _with(report, (ext,), secrets.token_bytes(16)),
         "belongs to another report"),
    ]  # fmt: skip


def test_a_survey_over_dap_answered_in_a_browser(tmp_path: Path, browser: Any) -> None:
    now = int(time.time())
    opens = now - now % TP
    closes = opens + LONG_WINDOW
    text = SURVEY.format(tp=TP, opens=format_time(opens), closes=format_time(closes))
    grpc = {role: f"127.0.0.1:{free_port()}" for role in ("leader", "helper")}
    dap = DapSpec(
        f"http://127.0.0.1:{free_port()}/", f"http://127.0.0.1:{free_port()}/", "dap-19", ""
    )
    dep = deploy_survey(
        parse_survey(text), text, tmp_path / "dep", grpc["leader"], grpc["helper"], tls=False,
        dap=dap,
    )  # fmt: skip
    for config in (dep.leader_config, dep.helper_config):
        config.write_text("allow_exact_release = true\n" + config.read_text())
    codes = mint(dep.out / "issuer", len(RESPONDENTS) + 1)
    servers: list[ServerProcess] = []
    serve = None
    try:
        for role, config in (("helper", dep.helper_config), ("leader", dep.leader_config)):
            server = ServerProcess(role, config, tmp_path / f"{role}.log", grpc[role])
            server.start()
            servers.append(server)
        serve, url = start_serve(
            dep.client_dir, tmp_path / "serve.log", "--issuer-dir", str(dep.out / "issuer")
        )
        public = json.loads(http(url + "survey.json")[2])
        assert {q["dap"]["version"] for q in public["questions"]} == {"dap-19"}
        assert {q["dap"]["invitation"] for q in public["questions"]} == {"public"}
        for code, (remote, commute, team) in zip(codes, RESPONDENTS, strict=False):
            said = _answer(browser, f"{url}#invitation={code}", remote, commute, team)
            assert "Thank you" in said, said
        stored = _stored(dep.leader_config)
        assert stored == 3 * len(RESPONDENTS)
        # The same invitation again: the issuer refuses it, nothing is sent.
        again = _answer(browser, f"{url}#invitation={codes[0]}", True, 1, 0)
        assert "This invitation has already been used." in again, again
        assert _stored(dep.leader_config) == stored
        # A real report, built by the page's client code, to spoil (it
        # carries no invitation extension: refused for that too).
        task_id = public["questions"][0]["task_id"]
        real = _js_report(url, dep.client_dir, task_id)
        for what, item in _hostile(task_id, real):
            status, answer = post_json(url + "reports", {"reports": [item]})
            assert status == 400 and answer["error"].startswith("report 1"), (what, answer)
        status, _, _ = http(
            url + "reports",
            real,
            {"Content-Type": "application/ppm-dap;message=upload-req"},
            "POST",
        )
        assert 400 <= status < 500
        # An invited report with its token (the last code's), spoilt at the
        # invitation extension; then sent whole, again, and with other content.
        invited = _invited_report(url, dep.client_dir, codes[-1])
        for what, posted, words in _hostile_invitations(invited):
            item = {"task_id": task_id, "dap_report": posted}
            status, answer = post_json(url + "reports", {"reports": [item]})
            assert status == 400 and answer["error"].startswith("report 1"), (what, answer)
            assert words in answer["error"], (what, answer)
        assert _stored(dep.leader_config) == stored
        item = {"task_id": task_id, "dap_report": _b64(invited.encode())}
        assert post_json(url + "reports", {"reports": [item]}) == (
            200, {"accepted": 1, "duplicates": 0}
        )  # fmt: skip
        assert post_json(url + "reports", {"reports": [item]})[0] == 200
        helper = invited.helper_encrypted_input_share
        other = Report(
            invited.metadata,
            invited.public_share,
            invited.leader_encrypted_input_share,
            replace(helper, payload=_flip(helper.payload, 0)),
        )
        item = {"task_id": task_id, "dap_report": _b64(other.encode())}
        status, answer = post_json(url + "reports", {"reports": [item]})
        assert status == 409 and "invitation was already used" in answer["error"], answer
        assert _stored(dep.leader_config) == stored + 1
        close_survey(dep.out, servers)
        results = tmp_path / "results"
        out = veil("survey", "collect", "--survey-dir", dep.out / "collector", "--out", results)
        assert out.returncode == 0, out.stderr
    finally:
        stop(serve)
        for server in reversed(servers):
            server.stop()
    published = {q["question"]: q for q in json.loads((results / "results.json").read_text())}
    rows = {q: {r["label"]: r["estimate"] for r in p["rows"]} for q, p in published.items()}
    # The browser's three respondents, and the relayed Python report (yes).
    assert rows["remote"]["yes"] == 3
    assert rows["commute"]["sum"] == 85
    assert rows["team"] == {"engineering": 1, "design": 0, "sales": 2}


def _js_report(url: str, client_dir: Path, task_id: str) -> bytes:
    """One DAP report of the task, built by the JS client (node) from the
    configs the relay hands the page."""
    configs = json.loads(http(url + "hpke-configs.json")[2])[task_id]
    task = next(
        t for t in (load_task(p, ClientTask) for p in client_dir.glob("*.toml"))
        if t.id_text == task_id
    )  # fmt: skip

    def config(d: dict[str, Any]) -> HpkeConfig:
        return HpkeConfig(
            d["config_id"], b64d(d["public_key"]), d["kem_id"], d["kdf_id"], d["aead_id"]
        )

    (report,) = js_dap_reports(
        task, config(configs["leader"][0]), config(configs["helper"][0]), [1], int(time.time())
    )
    assert isinstance(report, bytes), report
    return report
