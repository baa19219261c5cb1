"""`veil survey serve` in front of an overloaded leader (issue 26): the
leader's refusal for a full backlog reaches the respondent's page as HTTP
503 with Retry-After (the leader's advice, in whole seconds), at once rather
than after the page's server waited it out, and nothing of the refused
upload is stored. Real leader, helper and page processes on loopback."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from tests.support.survey_site import http, report_json, start_serve, stop, write_survey
from veil.client import Client
from veil.local.launcher import ServerProcess
from veil.task import ClientTask, load_task

pytestmark = pytest.mark.slow

TP = 3600


def _post(url: str, reports: list[dict[str, object]]) -> tuple[int, dict[str, str], object]:
    status, headers, body = http(
        url + "reports",
        json.dumps({"reports": reports}).encode(),
        {"Content-Type": "application/json"},
        "POST",
    )
    return status, {k.lower(): v for k, v in headers.items()}, json.loads(body)


def test_a_full_backlog_is_passed_on_as_503_with_retry_after(tmp_path: Path) -> None:
    now = int(time.time())
    opens = now - now % TP
    dep, leader_addr, helper_addr = write_survey(tmp_path, "none", opens, opens + 2 * TP, TP)
    # One report may wait for aggregation, and none is aggregated: the
    # second upload finds the backlog full.
    with dep.leader_config.open("a") as f:
        f.write(
            "[driver]\nenabled = false\n"
            "[admission]\nmax_pending_per_task = 1\nretry_after_seconds = 2.5\n"
        )
    helper = ServerProcess("helper", dep.helper_config, tmp_path / "helper.log", helper_addr)
    leader = ServerProcess("leader", dep.leader_config, tmp_path / "leader.log", leader_addr)
    serve = None
    try:
        helper.start()
        leader.start()
        serve, url = start_serve(dep.client_dir, tmp_path / "serve.log")
        task = load_task(dep.client_dir / "remote.toml", ClientTask)
        with Client(task) as client:
            first, second = (report_json(task.id_text, r) for r in client.build_reports([1, 0]))
        status, _, doc = _post(url, [first])
        assert (status, doc) == (200, {"accepted": 1, "duplicates": 0})
        began = time.monotonic()
        status, headers, doc = _post(url, [second])
        assert status == 503 and headers["retry-after"] == "3"
        assert isinstance(doc, dict) and "try again in 3 s" in doc["error"]
        # Passed on, not waited out by the page's server.
        assert time.monotonic() - began < 2.5
        assert "default-src 'none'" in headers["content-security-policy"]
        # Nothing of the refused upload was stored.
        db = dep.leader_config.parent / "leader.db"
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT COUNT(*) FROM reports").fetchone()[0] == 1
    finally:
        stop(serve)
        leader.stop()
        helper.stop()
