"""A survey over DAP (issue 43): `veil survey deploy --protocol dap`, a `veil
leader` and a `veil helper` from the written configs (each serving DAP on
loopback beside gRPC, SQLite), respondents answering with `veil survey
respond` (veil's DAP client), `veil survey status` (the leader's report
counts), the window closed early with `veil survey close` once they are done
(the servers told by SIGHUP), and `veil survey collect` collecting every
question over DAP, exactly (no DP in the survey). What the deploy writes and
refuses: tests/cli/test_survey_dap.py."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.cli import veil
from veil.local.launcher import ServerProcess, free_port
from veil.task import ClientTask, load_task
from veil.times import format_time

pytestmark = pytest.mark.slow

TP = 2
SURVEY = """\
[survey]
name = "DAP survey"
mechanism = "none"
min_batch_size = 3
time_precision = {tp}
opens = {opens}
closes = {closes}

[[question]]
id = "remote"
text = "Do you work remotely most days?"
kind = "yes_no"

[[question]]
id = "team"
text = "Which team?"
kind = "choice"
options = ["red", "green", "blue"]
"""
ANSWERS = [
    {"remote": True, "team": "red"},
    {"remote": False, "team": "blue"},
    {"remote": True, "team": "blue"},
    {"remote": True, "team": "green"},
    {"remote": False, "team": "blue"},
]


def wait_for(condition: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for server in reversed(started):
        server.stop()


def test_a_survey_over_dap_is_answered_and_collected_exactly(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    # A long window, closed early once the respondents are done: nothing
    # here depends on how fast the machine is.
    opens = int(time.time()) // TP * TP
    closes = opens + 3600
    (tmp_path / "survey.toml").write_text(
        SURVEY.format(tp=TP, opens=format_time(opens), closes=format_time(closes))
    )
    grpc = {role: f"127.0.0.1:{free_port()}" for role in ("leader", "helper")}
    dap = {role: f"http://127.0.0.1:{free_port()}/" for role in ("leader", "helper")}
    dep = tmp_path / "dep"
    deployed = veil(
        "survey", "deploy", "--survey", tmp_path / "survey.toml", "--out", dep,
        "--leader", grpc["leader"], "--helper", grpc["helper"], "--no-tls",
        "--protocol", "dap", "--dap-leader", dap["leader"], "--dap-helper", dap["helper"],
    )  # fmt: skip
    assert deployed.returncode == 0, deployed.stderr
    assert "DAP (dap-19)" in deployed.stdout
    for role in ("helper", "leader"):
        config = dep / role / f"{role}.toml"
        # Exact sums (mechanism none): each operator opts in in its own config.
        config.write_text("allow_exact_release = true\n" + config.read_text())
        server = ServerProcess(role, config, tmp_path / f"{role}.log", grpc[role])
        server.start()
        servers.append(server)

    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps(a) + "\n" for a in ANSWERS))
    sent = veil("survey", "respond", "--survey-dir", dep / "client", "--answers", answers)
    assert sent.returncode == 0, sent.stderr
    # Stored by the leader's DAP upload route, counted by its GetTaskInfo.
    status = veil("survey", "status", "--survey-dir", dep / "collector", "--json")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert shown["state"] == "open"
    assert {q["id"]: q["reports"] for q in shown["questions"]} == {"remote": 5, "team": 5}

    closed = veil("survey", "close", dep)
    assert closed.returncode == 0, closed.stderr
    end = load_task(dep / "client" / "remote.toml", ClientTask).not_after
    assert opens < end < closes
    marks = {s.role: _log(tmp_path, s.role).count("now takes reports from") for s in servers}
    for server in servers:
        assert server.proc is not None
        server.proc.send_signal(signal.SIGHUP)
    wait_for(
        lambda: all(_log(tmp_path, r).count("now takes reports from") > n for r, n in marks.items())
    )
    while time.time() < end:  # the new end, a condition of its own
        time.sleep(min(0.5, max(0.0, end - time.time()) + 0.01))
    results = tmp_path / "results"
    collected = veil(
        "survey", "collect", "--survey-dir", dep / "collector", "--out", results, "--wait", "120"
    )
    assert collected.returncode == 0, collected.stderr
    assert time.time() < closes
    published = {r["question"]: r for r in json.loads((results / "results.json").read_text())}
    assert {q: r["n"] for q, r in published.items()} == {"remote": 5, "team": 5}
    rows = {q: {row["label"]: row["estimate"] for row in r["rows"]} for q, r in published.items()}
    assert rows["team"] == {"red": 1, "green": 1, "blue": 3}
    assert rows["remote"] == {"yes": 3}


def _log(root: Path, role: str) -> str:
    path = root / f"{role}.log"
    return path.read_text() if path.exists() else ""
