"""A survey deployed over DAP answered in a real browser (Debian's headless
Chromium, as tests/support/browser.py drives it): the page builds each
answer's DAP Report (js/src/dap.js), `veil survey serve` relays it to the
leader as a DAP upload, a real leader and helper aggregate over DAP with
mechanism none, and `veil survey collect` publishes every answer exactly.
Hostile DAP reports at the relay (not base64url, truncated, trailing bytes,
shares of the wrong size, an extension, veil's own report shape for a DAP
task, a body that is not JSON) are refused 400 with nothing stored.

Needs chromium and chromedriver; skips without them, except under CI, where
it fails.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import browser, status_text, wait_for
from tests.support.cli import veil
from tests.support.node import js_dap_reports
from tests.support.survey_site import http, post_json, start_serve, stop
from tests.support.survey_toml import commute, remote, team
from tests.support.window import LONG_WINDOW, close_survey
from veil.dap.messages import Extension, Report
from veil.deploy import deploy_survey
from veil.hpke import HpkeConfig
from veil.local.launcher import ServerProcess, free_port
from veil.survey import parse_survey
from veil.task import ClientTask, DapSpec, b64d, load_task
from veil.times import format_time

pytestmark = [pytest.mark.browser, pytest.mark.slow]
__all__ = ["browser"]  # the fixture, used by name

TP = 5

SURVEY = (
    """\
[survey]
name = "DAP in a browser"
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


def _answer(driver: Any, url: str, remote: bool, commute: int, team: int) -> None:
    from selenium.webdriver.common.by import By

    driver.get(url)
    wait_for(driver, lambda d: d.find_element(By.ID, "survey").get_attribute("data-ready"))
    driver.find_element(By.ID, "a-remote-yes" if remote else "a-remote-no").click()
    driver.find_element(By.ID, "a-commute").send_keys(str(commute))
    driver.find_element(By.ID, f"a-team-{team}").click()
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(driver, lambda d: "Thank you" in status_text(d) or "Not sent" in status_text(d))
    assert "Thank you" in status_text(driver), status_text(driver)


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
    servers: list[ServerProcess] = []
    serve = None
    try:
        for role, config in (("helper", dep.helper_config), ("leader", dep.leader_config)):
            server = ServerProcess(role, config, tmp_path / f"{role}.log", grpc[role])
            server.start()
            servers.append(server)
        serve, url = start_serve(dep.client_dir, tmp_path / "serve.log")
        public = json.loads(http(url + "survey.json")[2])
        assert {q["dap"]["version"] for q in public["questions"]} == {"dap-19"}
        for remote, commute, team in RESPONDENTS:
            _answer(browser, url, remote, commute, team)
        stored = _stored(dep.leader_config)
        assert stored == 3 * len(RESPONDENTS)
        # A real report, built by the page's client code, to spoil.
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
        assert _stored(dep.leader_config) == stored
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
    assert rows["remote"]["yes"] == 2
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
