"""A deployed survey closed early or extended (issue 41, item 6), through
real servers: `veil survey close` and `veil survey extend` on each party's
files, the servers told by SIGHUP or a restart. Closing refuses later
uploads and lets the survey be collected at once; the helper refuses the
leader's jobs while the two organisations' windows differ, naming both, and
takes them once they agree; extending never reopens what was released
(told by SIGHUP on SQLite; long mode, VEIL_TEST_LONG=1, also by a restart
and on PostgreSQL). What the commands write and refuse:
tests/cli/test_window.py."""

from __future__ import annotations

import json
import secrets
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import veil
from tests.support.modes import LONG
from tests.support.window import LONG_WINDOW, close_survey
from veil.aggregator.store.records import AGGREGATED
from veil.client import Client, UploadError
from veil.collector import CollectionError, Collector
from veil.local.launcher import ServerProcess, free_port
from veil.task import ClientTask, CollectorTask, load_task
from veil.times import format_time

pytestmark = pytest.mark.slow

TP = 2
QUESTION = """
[[question]]
id = "remote"
text = "Do you work remotely most days?"
kind = "yes_no"
"""


@dataclass
class Running:
    root: Path
    dep: Path
    opens: int
    closes: int
    servers: dict[str, ServerProcess]

    def log(self, role: str) -> str:
        return (self.root / f"{role}.log").read_text()

    def respond(self, n: int) -> Any:
        answers = self.root / "answers.jsonl"
        answers.write_text("".join(json.dumps({"remote": i % 2 == 0}) + "\n" for i in range(n)))
        return veil("survey", "respond", "--survey-dir", self.dep / "client", "--answers", answers)

    def reload(self, *roles: str) -> None:
        """SIGHUP to each of `roles`, then wait until each logged the new window."""
        marks = {r: self.log(r).count("now takes reports from") for r in roles}
        for role in roles:
            proc = self.servers[role].proc
            assert proc is not None
            proc.send_signal(signal.SIGHUP)
        wait_for(lambda: all(self.log(r).count("now takes reports from") > marks[r] for r in roles))

    def aggregated(self) -> int:
        with sqlite3.connect(self.dep / "leader" / "leader.db") as db:
            n: int = db.execute(
                "SELECT COUNT(*) FROM reports WHERE state = ?", (AGGREGATED,)
            ).fetchone()[0]
        return n


def wait_for(condition: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)


def wait_until(t: int) -> None:
    """Until the clock passes `t` (a window's end, a condition of its own)."""
    while time.time() < t:
        time.sleep(min(0.5, max(0.0, t - time.time()) + 0.01))


@pytest.fixture
def survey(tmp_path: Path) -> Iterator[Callable[..., Running]]:
    started: list[ServerProcess] = []

    def run(window: int, min_batch_size: int = 3, dsn: str | None = None) -> Running:
        opens = int(time.time()) // TP * TP
        closes = opens + window
        (tmp_path / "survey.toml").write_text(
            f'[survey]\nname = "Lifecycle"\nepsilon = 1\nmin_batch_size = {min_batch_size}\n'
            f"time_precision = {TP}\nopens = {format_time(opens)}\n"
            f"closes = {format_time(closes)}  # as planned\n" + QUESTION
        )
        leader, helper = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        out = veil(
            "survey", "deploy", "--survey", tmp_path / "survey.toml", "--out", tmp_path / "dep",
            "--leader", leader, "--helper", helper, "--no-tls",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        dep = tmp_path / "dep"
        if dsn is not None:  # each aggregator in a schema of its own on PostgreSQL
            from bench.postgres import as_url, with_schema

            for role in ("leader", "helper"):
                config = dep / role / f"{role}.toml"
                url = as_url(with_schema(dsn, f"{role}_{secrets.token_hex(4)}"))
                config.write_text(config.read_text().replace(f'"{role}.db"', json.dumps(url)))
        servers = {
            role: ServerProcess(role, dep / role / f"{role}.toml", tmp_path / f"{role}.log", a)
            for role, a in (("helper", helper), ("leader", leader))
        }
        for server in servers.values():
            server.start()
            started.append(server)
        return Running(tmp_path, dep, opens, closes, servers)

    yield run
    for server in started:
        server.stop()


def test_a_survey_closed_early_refuses_later_answers_and_is_collected_at_once(
    survey: Callable[..., Running],
) -> None:
    s = survey(window=3600)
    sent = s.respond(3)
    assert sent.returncode == 0, sent.stderr
    # The client's task file as it was before: a respondent who never got the
    # new files.
    stale = load_task(s.dep / "client" / "remote.toml", ClientTask)
    began = time.time()
    closed = veil("survey", "close", s.dep)
    assert closed.returncode == 0, closed.stderr
    end = load_task(s.dep / "client" / "remote.toml", ClientTask).not_after
    assert f"the survey closes at {format_time(end)}" in closed.stdout
    # Now, rounded up to the time precision, as the command read its clock.
    assert began <= end < s.closes and end % TP == 0
    s.reload("leader", "helper")
    assert f"now takes reports from {format_time(s.opens)} to {format_time(end)}" in s.log("leader")
    wait_until(end)
    # A respondent with the new files is told before anything is sent ...
    late = s.respond(1)
    assert late.returncode == 2
    assert f"the survey closed at {format_time(end)}: nothing was sent" in late.stderr
    # ... and the leader refuses one with the old files.
    with Client(stale, retries=0) as client, pytest.raises(UploadError) as refused:
        client.upload(1, end)
    assert "outside the task's window" in str(refused.value)
    assert "the survey is closed" in str(refused.value)
    # The status shows the new window, and the survey is collected now, long
    # before its planned end.
    status = veil("survey", "status", "--survey-dir", s.dep / "collector", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["closes"] == format_time(end)
    results = s.root / "results"
    collected = veil("survey", "collect", "--survey-dir", s.dep / "collector", "--out", results)
    assert collected.returncode == 0, collected.stderr
    assert time.time() < s.closes
    published = json.loads((results / "results.json").read_text())
    assert published[0]["n"] == 3


def test_the_helper_waits_while_the_windows_differ(survey: Callable[..., Running]) -> None:
    s = survey(window=3600)
    at = format_time(s.closes - 600)
    # The leader's organisation closes first.
    closed = veil("survey", "close", s.dep / "leader", "--at", at)
    assert closed.returncode == 0, closed.stderr
    assert f"veil survey close DIRECTORY --at {at}" in closed.stdout
    s.reload("leader")
    sent = s.respond(3)
    assert sent.returncode == 0, sent.stderr
    # The helper refuses the leader's job, retryably, naming both windows;
    # nothing is aggregated meanwhile.
    said = (
        f"the leader's window is [{format_time(s.opens)}, {at}), the helper's"
        f" [{format_time(s.opens)}, {format_time(s.closes)})"
    )
    wait_for(lambda: said in s.log("leader"))
    assert "waits for the helper" in s.log("leader")
    assert s.aggregated() == 0
    assert s.servers["leader"].proc is not None and s.servers["leader"].proc.poll() is None
    # The helper's organisation closes at the same time: the job goes through.
    closed = veil("survey", "close", s.dep / "helper", "--at", at)
    assert closed.returncode == 0, closed.stderr
    s.reload("helper")
    wait_for(lambda: s.aggregated() == 3)


# The refusal of a collected batch is the store's (BucketCollected, held to
# both backends by tests/aggregator/store/test_storage.py), so a server
# restarted or on PostgreSQL refuses as one reloaded on SQLite does: those two
# variants run in long mode only.
_LONG_ONLY = pytest.mark.skipif(not LONG, reason="long mode only (VEIL_TEST_LONG=1)")


@pytest.mark.parametrize(
    ("restart", "backend"),
    [
        (False, "sqlite"),
        pytest.param(True, "sqlite", marks=_LONG_ONLY),
        pytest.param(False, "postgres", marks=[pytest.mark.postgres, _LONG_ONLY]),
    ],
    ids=["sighup", "restart", "sighup-postgres"],
)
def test_an_extension_never_reopens_a_released_batch(
    survey: Callable[..., Running], restart: bool, backend: str, request: pytest.FixtureRequest
) -> None:
    dsn = request.getfixturevalue("postgres_server") if backend == "postgres" else None
    s = survey(window=LONG_WINDOW, dsn=dsn)
    sent = s.respond(3)
    assert sent.returncode == 0, sent.stderr
    servers = [s.servers["helper"], s.servers["leader"]]
    close_survey(s.dep, servers)
    results = s.root / "results"
    collected = veil("survey", "collect", "--survey-dir", s.dep / "collector", "--out", results)
    assert collected.returncode == 0, collected.stderr
    # The operator's collector/ knows: refused, nothing written. An hour
    # more, closed again below once the uploads are done.
    until = (int(time.time()) // TP) * TP + LONG_WINDOW
    refused = veil("survey", "extend", s.dep, "--until", format_time(until))
    assert refused.returncode == 2
    assert "extending never reopens it" in refused.stderr
    # The servers' and the client's files do not: each aggregator refuses
    # what would reopen the batch.
    for part in ("leader", "helper", "client"):
        done = veil("survey", "extend", s.dep / part, "--until", format_time(until))
        assert done.returncode == 0, done.stderr
    if restart:
        for server in s.servers.values():
            server.stop()
            server.start()
    else:
        s.reload("leader", "helper")
    task = load_task(s.dep / "client" / "remote.toml", ClientTask)
    assert task.not_after == until
    with Client(task, retries=0) as client:
        with pytest.raises(UploadError) as late:
            client.upload(1, s.opens)
        assert "was already collected; reports for it are no longer accepted" in str(late.value)
        # The extension's own time takes reports.
        assert client.upload(1).accepted == 1
    # The extension closed now by both organisations (and the client's
    # files): a collection over it, the released batch included, is refused.
    end = close_survey([s.dep / part for part in ("leader", "helper", "client")], servers)
    old = load_task(s.dep / "collector" / "remote.toml", CollectorTask)
    with (
        Collector(replace(old, not_after=end)) as collector,
        pytest.raises(CollectionError) as again,
    ):
        collector.collect(s.opens, end - s.opens, wait=30)
    assert "already collected" in str(again.value)
