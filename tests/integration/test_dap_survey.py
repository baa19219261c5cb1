"""A survey over DAP (issue 43): `veil survey deploy --protocol dap`, a `veil
leader` and a `veil helper` from the written configs (each serving DAP on
loopback beside gRPC, SQLite), respondents answering with `veil survey
respond` (veil's DAP client), `veil survey status` (the leader's report
counts), the window closed early with `veil survey close` once they are done
(the servers told by SIGHUP), and `veil survey collect` collecting every
question over DAP, exactly (no DP in the survey), a run stopped once the
leader named a job resumed by polling that job; and a survey with
invitations, a panel answering through a real issuer, each report's token
in veil's invitation extension. What the deploy writes and
refuses: tests/cli/test_survey_dap.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import veil
from tests.support.survey_toml import remote, team
from tests.support.window import close_survey
from veil.collector.dap import DapCollector
from veil.collector.survey import collect_survey
from veil.local.launcher import ServerProcess, free_port
from veil.task import b64e, load_task
from veil.times import format_time

pytestmark = pytest.mark.slow

TP = 2
SURVEY = (
    """\
[survey]
name = "DAP survey"
mechanism = "{mechanism}"
min_batch_size = 3
time_precision = {tp}
opens = {opens}
closes = {closes}
{extra}

"""
    + remote()
    + "\n"
    + team(("red", "green", "blue"), text="Which team?")
)
EXACT = {"team": {"red": 1, "green": 1, "blue": 3}, "remote": {"yes": 3}}
ANSWERS = [
    {"remote": True, "team": "red"},
    {"remote": False, "team": "blue"},
    {"remote": True, "team": "blue"},
    {"remote": True, "team": "green"},
    {"remote": False, "team": "blue"},
]


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for server in reversed(started):
        server.stop()


@dataclass
class Deployed:
    root: Path
    dep: Path
    opens: int
    closes: int

    def close_and_collect(self, servers: list[ServerProcess]) -> dict[str, Any]:
        """`veil survey close` now, the servers told by SIGHUP
        (tests/support/window.py), then `veil survey collect` once the new end
        has passed: the results by question."""
        end = close_survey(self.dep, servers)
        assert self.opens < end < self.closes
        results = self.root / "results"
        collected = veil(
            "survey", "collect", "--survey-dir", self.dep / "collector", "--out", results,
            "--wait", "120",
        )  # fmt: skip
        assert collected.returncode == 0, collected.stderr
        assert time.time() < self.closes
        # A DAP leader names each job (nothing claims a job id of veil's
        # own), and state.json keeps the id it named, as it keeps a gRPC job's.
        jobs = json.loads((results / "state.json").read_text())["jobs"]
        assert sorted(jobs) == ["remote", "team"]
        # Each question's job is its own, though both send the same request.
        assert len(set(jobs.values())) == len(jobs)
        for qid, job in jobs.items():
            assert f"{qid}: collecting over DAP (the leader names the job" in collected.stderr
            assert f"{qid}: the leader named the job {job}" in collected.stderr
        assert "(job " not in collected.stderr
        return {r["question"]: r for r in json.loads((results / "results.json").read_text())}


def deploy(
    root: Path,
    servers: list[ServerProcess],
    extra: str = "",
    *options: str,
    mechanism: str = "none",
) -> Deployed:
    """The survey deployed over DAP with a long window (closed early once the
    respondents are done: nothing here depends on how fast the machine is),
    and its leader and helper started."""
    opens = int(time.time()) // TP * TP
    closes = opens + 3600
    (root / "survey.toml").write_text(
        SURVEY.format(
            tp=TP,
            opens=format_time(opens),
            closes=format_time(closes),
            extra=extra,
            mechanism=mechanism,
        )
    )
    grpc = {role: f"127.0.0.1:{free_port()}" for role in ("leader", "helper")}
    dap = {role: f"http://127.0.0.1:{free_port()}/" for role in ("leader", "helper")}
    dep = root / "dep"
    deployed = veil(
        "survey", "deploy", "--survey", root / "survey.toml", "--out", dep,
        "--leader", grpc["leader"], "--helper", grpc["helper"], "--no-tls",
        "--protocol", "dap", "--dap-leader", dap["leader"], "--dap-helper", dap["helper"],
        *options,
    )  # fmt: skip
    assert deployed.returncode == 0, deployed.stderr
    assert "DAP (dap-19)" in deployed.stdout
    for role in ("helper", "leader"):
        config = dep / role / f"{role}.toml"
        # Exact sums (mechanism none): each operator opts in in its own config.
        config.write_text("allow_exact_release = true\n" + config.read_text())
        server = ServerProcess(role, config, root / f"{role}.log", grpc[role])
        server.start()
        servers.append(server)
    return Deployed(root, dep, opens, closes)


def rows(published: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {q: {row["label"]: row["estimate"] for row in r["rows"]} for q, r in published.items()}


def test_a_survey_over_dap_is_answered_and_collected_exactly(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    d = deploy(tmp_path, servers)
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps(a) + "\n" for a in ANSWERS))
    sent = veil("survey", "respond", "--survey-dir", d.dep / "client", "--answers", answers)
    assert sent.returncode == 0, sent.stderr
    # Stored by the leader's DAP upload route, counted by its GetTaskInfo.
    status = veil("survey", "status", "--survey-dir", d.dep / "collector", "--json")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert shown["state"] == "open"
    assert {q["id"]: q["reports"] for q in shown["questions"]} == {"remote": 5, "team": 5}

    published = d.close_and_collect(servers)
    assert {q: r["n"] for q, r in published.items()} == {"remote": 5, "team": 5}
    assert rows(published) == EXACT


def test_every_question_of_a_survey_over_dap_with_dp_is_collected(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    """With noise, each question's collection is charged to the survey's one
    ledger: two questions over one window send the same CollectionJobReq,
    and their jobs (the ledger's spends) must still be two."""
    d = deploy(tmp_path, servers, "epsilon = 2", mechanism="geometric")
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps(a) + "\n" for a in ANSWERS))
    sent = veil("survey", "respond", "--survey-dir", d.dep / "client", "--answers", answers)
    assert sent.returncode == 0, sent.stderr
    published = d.close_and_collect(servers)
    assert {q: r["n"] for q, r in published.items()} == {"remote": 5, "team": 5}
    status = veil("survey", "status", "--survey-dir", d.dep / "collector", "--json")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    # Both released with noise, each charged once: the survey's whole budget.
    assert {q["id"]: q["spent_in_own_unit"] for q in shown["questions"]} == {
        "remote": "1",
        "team": "1",
    }
    assert shown["spent"] == shown["total"] == "2"


def test_an_invited_panel_over_dap_is_collected_exactly(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    # Each report's token in veil's invitation extension, checked by the
    # leader at upload and by the helper in aggregation; a real issuer.
    d = deploy(tmp_path, servers, "invitations = true")
    codes = tmp_path / "codes.txt"
    minted = veil("survey", "invite", d.dep, "--count", "5", "--out", codes)
    assert minted.returncode == 0, minted.stderr
    panel = tmp_path / "panel.jsonl"
    panel.write_text("".join(json.dumps(a) + "\n" for a in ANSWERS))
    port = free_port()
    issuer = subprocess.Popen(
        [sys.executable, "-m", "veil.cli", "survey", "issuer", "--issuer-dir", str(d.dep),
         "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert issuer.stdout is not None
        assert "issuing on" in issuer.stdout.readline()

        def respond() -> subprocess.CompletedProcess[str]:
            return veil(
                "survey", "respond", "--survey-dir", d.dep / "client", "--answers", panel,
                "--invitations", codes, "--issuer", f"http://127.0.0.1:{port}/invitation",
                "--no-progress",
            )  # fmt: skip

        done = respond()
        assert done.returncode == 0, done.stderr
        assert "answered 5 of 5 invited respondents" in done.stdout
        # The same panel again: every invitation is used, nothing is sent twice.
        again = respond()
        assert "answered 0 of 5 invited respondents" in again.stdout, again.stderr
    finally:
        issuer.terminate()
        issuer.wait(timeout=20)
        if issuer.stdout is not None:
            issuer.stdout.close()
    published = d.close_and_collect(servers)
    assert {q: r["n"] for q, r in published.items()} == {"remote": 5, "team": 5}
    assert rows(published) == EXACT


def test_a_collection_stopped_once_its_job_is_named_polls_that_job(
    tmp_path: Path, servers: list[ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`veil survey collect` over DAP keeps the job id the leader named in
    state.json: a run stopped once the first question's job exists polls
    that job when run again (only GETs of it), and a job id the leader does
    not hold (404) is asked for again by the same request, which finds or
    recreates the job; exact results."""
    d = deploy(tmp_path, servers)
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps(a) + "\n" for a in ANSWERS))
    sent = veil("survey", "respond", "--survey-dir", d.dep / "client", "--answers", answers)
    assert sent.returncode == 0, sent.stderr
    close_survey(d.dep, servers)
    collector, results = d.dep / "collector", tmp_path / "results"
    state = results / "state.json"

    class Stop(Exception):
        pass

    def stop_once_named(line: str) -> None:
        if line.startswith("remote: the leader named the job"):
            raise Stop

    with pytest.raises(Stop):
        collect_survey(collector, results, wait=120, say=stop_once_named)
    kept = json.loads(state.read_text())["jobs"]
    assert list(kept) == ["remote"]
    # A job the leader never held, kept for the other question.
    stale = "5a" * 16
    doc = json.loads(state.read_text())
    doc["jobs"]["team"] = stale
    state.write_text(json.dumps(doc))

    # Every request the collector sends, seen on its way to the real leader.
    seen: list[tuple[str, str]] = []
    urlopen = DapCollector._urlopen

    def record(self: DapCollector, request: urllib.request.Request) -> Any:
        seen.append((request.get_method(), request.full_url))
        return urlopen(self, request)

    monkeypatch.setattr(DapCollector, "_urlopen", record)
    said: list[str] = []
    outcome = collect_survey(collector, results, wait=120, say=said.append)
    assert outcome.complete, outcome.pending
    task = {qid: load_task(collector / f"{qid}.toml").id_text for qid in ("remote", "team")}

    def calls(qid: str) -> list[tuple[str, str]]:
        return [(m, url.split("/collection_jobs", 1)[1]) for m, url in seen if task[qid] in url]

    remote = calls("remote")
    assert remote and set(remote) == {("GET", f"/{b64e(bytes.fromhex(kept['remote']))}")}
    assert f"remote: resuming job {kept['remote']}" in said
    team = calls("team")
    assert team[:2] == [("GET", f"/{b64e(bytes.fromhex(stale))}"), ("POST", "")], team
    assert any(line.startswith(f"team: the leader holds no job {stale}") for line in said)
    jobs = json.loads(state.read_text())["jobs"]
    assert jobs["remote"] == kept["remote"] and jobs["team"] != stale
    assert {m for m, _ in team[2:]} == {"GET"}
    assert f"team: the leader named the job {jobs['team']}" in said
    published = {r["question"]: r for r in json.loads((results / "results.json").read_text())}
    assert {q: r["n"] for q, r in published.items()} == {"remote": 5, "team": 5}
    assert rows(published) == EXACT
