"""Issue 25: under add_remove a collector polling the leader learns nothing that
depends on the number of reports, before, while and after they arrive.

Two real aggregators on 127.0.0.1 serve an add_remove survey; between single
uploads (each aggregated before the next poll) the collector calls GetTaskInfo
for every question and runs `veil survey status` (text and JSON): every answer
is the same byte for byte, while the leader's own database counts each report.
Once the survey is closed, one collection per question (`veil collect`,
whose JSON has no count either): the status shows them, still without a
count.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import veil
from tests.support.window import LONG_WINDOW, close_survey
from veil.cli import main
from veil.client import SurveyClient
from veil.collector import Collector
from veil.collector.survey import load_collector_dir
from veil.local.launcher import ServerProcess, free_port
from veil.times import format_time

pytestmark = pytest.mark.slow

TP = 2
SURVEY = """
[survey]
name = "Counts withheld"
epsilon = 2
neighbouring = "add_remove"
min_batch_size = 3
time_precision = {tp}
opens = "{opens}"
closes = "{closes}"

[[question]]
id = "remote"
kind = "yes_no"

[[question]]
id = "team"
kind = "choice"
options = ["a", "b"]
"""


@pytest.fixture
def deployed(tmp_path: Path) -> Iterator[tuple[Path, int, int, list[ServerProcess]]]:
    """The survey deployed, open for an hour, and its servers running: the
    deployment, its window and the servers (tests/support/window.py)."""
    opens = int(time.time()) // TP * TP
    closes = opens + LONG_WINDOW
    survey = tmp_path / "survey.toml"
    survey.write_text(SURVEY.format(tp=TP, opens=format_time(opens), closes=format_time(closes)))
    leader, helper = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    dep = tmp_path / "dep"
    out = veil(
        "survey", "deploy", "--survey", survey, "--out", dep,
        "--leader", leader, "--helper", helper, "--no-tls",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    servers = [
        ServerProcess(role, dep / role / f"{role}.toml", tmp_path / f"{role}.log", address)
        for role, address in (("helper", helper), ("leader", leader))
    ]
    try:
        for server in servers:
            server.start()
        yield dep, opens, closes, servers
    finally:
        for server in servers:
            server.stop()


def leader_counts(dep: Path) -> dict[int, int]:
    """The leader's own view (its operator's): reports by state."""
    with sqlite3.connect(dep / "leader" / "leader.db") as db:
        rows = db.execute("SELECT state, COUNT(*) FROM reports GROUP BY state").fetchall()
    return dict(rows)


def wait_aggregated(dep: Path, expected: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        counts = leader_counts(dep)
        # States 0 and 1 are pending and in a job; 2 aggregated.
        if counts.get(2, 0) == expected and not counts.get(0) and not counts.get(1):
            return
        assert time.monotonic() < deadline, counts
        time.sleep(0.05)


def collector_view(collector_dir: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    """Everything the collector's credentials get from polling: each question's
    GetTaskInfo answer as bytes, and `veil survey status` in text and JSON
    (less the phrase that counts down to the close, which depends on the clock
    only)."""
    files = load_collector_dir(collector_dir)
    infos = {}
    for qid, task in files.tasks.items():
        with Collector(task) as c:
            infos[qid] = c.task_info().SerializeToString(deterministic=True)
    capsys.readouterr()
    assert main(["survey", "status", "--survey-dir", str(collector_dir)]) == 0
    text = re.sub(r"closes in [^;]+;", "closes in …;", capsys.readouterr().out)
    assert main(["survey", "status", "--survey-dir", str(collector_dir), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    return infos, text, status


def test_polling_between_single_uploads_shows_nothing_that_depends_on_the_count(
    deployed: tuple[Path, int, int, list[ServerProcess]], capsys: pytest.CaptureFixture[str]
) -> None:
    dep, opens, closes, servers = deployed
    collector_dir = dep / "collector"
    first = collector_view(collector_dir, capsys)
    _, text, status = first
    assert status["state"] == "open", text
    assert all(q["counts_withheld"] and q["reports"] is None for q in status["questions"])
    assert "withheld" in text and f"ready to collect after {format_time(closes)}" in text
    with SurveyClient(dep / "client") as respondent:
        for n in range(1, 5):
            respondent.respond({"remote": "yes", "team": "b"})
            wait_aggregated(dep, 2 * n)  # two questions, one report each
            assert collector_view(collector_dir, capsys) == first, f"after upload {n}"

    closes = close_survey(dep, servers)
    capsys.readouterr()
    # One collection per question (`veil collect`, whose JSON withholds the count).
    for qid in ("remote", "team"):
        assert main(["collect", "--task", str(collector_dir / f"{qid}.toml"), "--start",
                     str(opens), "--duration", str(closes - opens)]) == 0  # fmt: skip
        collected = json.loads(capsys.readouterr().out)
        assert collected["report_count"] is None, collected
    _, text, status = collector_view(collector_dir, capsys)
    assert status["state"] == "collected", text
    for q in status["questions"]:
        assert (q["collections"], q["reports"], q["rejected"]) == (1, None, None), q
    assert "closed: collected" in text and "withheld" in text
    files = load_collector_dir(collector_dir)
    for task in files.tasks.values():
        with Collector(task) as c:
            info = c.task_info()
        assert (info.reports, info.rejected, info.counts_withheld) == (0, 0, True)
        assert info.collections_finished == 1
