"""Clients and collectors ride out a server's transient storage failure
(issue 21, item 4): the leader answers UNAVAILABLE while its database is
locked by another process, and the stock Client and Collector resend the
same request (the same report ids, the same collection job id) with backoff
until it succeeds. Real leader and helper behind real gRPC servers on
loopback; before, the leader answered INTERNAL and both gave up at once."""

from __future__ import annotations

import itertools
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

import veil.aggregator.leader.collection as collection
from veil.aggregator.helper import Helper
from veil.aggregator.leader import Leader
from veil.aggregator.leader.helper_client import GrpcHelperClient
from veil.aggregator.leader.settings import LeaderParts, LeaderSettings
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.run.service import HelperService, LeaderService, add_service
from veil.aggregator.run.transport import ConnectionLimits, RpcServer
from veil.aggregator.store.ledger import SqliteLedgerStore
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.client import Client
from veil.collector import CollectionError, Collector
from veil.protocol.v1 import helper_pb2, leader_pb2
from veil.task import DpSpec, TaskFiles, VdafSpec, new_task

TP = 3600


@dataclass
class Servers:
    files: TaskFiles
    leader: Leader
    leader_db: Path
    helper_db: Path
    stop: threading.Event


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    leader_server = RpcServer(limits=ConnectionLimits(workers=4))
    helper_server = RpcServer(limits=ConnectionLimits(workers=4))
    leader_port = leader_server.add_insecure_port("127.0.0.1:0")
    helper_port = helper_server.add_insecure_port("127.0.0.1:0")
    files = new_task(
        VdafSpec("sum", max_measurement=10),
        f"127.0.0.1:{leader_port}",
        f"127.0.0.1:{helper_port}",
        dp=DpSpec("geometric", epsilon="1"),
        min_batch_size=5,
        time_precision=TP,
    )
    helper = Helper(
        {files.helper.task_id: files.helper},
        SqliteDatastore(tmp_path / "helper.db", busy_timeout=0.2),
        # The helper's ledger gives up on a lock as soon as its store does.
        PrivacyEngine(SqliteLedgerStore(tmp_path / "helper.db", timeout=0.2), [files.helper]),
    )
    leader_db = tmp_path / "leader.db"
    # A short busy timeout: another process's write lock makes the leader's
    # database unavailable within the test's patience.
    store = SqliteDatastore(leader_db, busy_timeout=0.2)
    leader = Leader(
        {files.leader.task_id: files.leader},
        LeaderParts(
            store,
            GrpcHelperClient(grpc.insecure_channel),
            PrivacyEngine(str(leader_db), [files.leader]),
        ),
        LeaderSettings(retry_seconds=0.05),
    )
    add_service(
        helper_server, HelperService(helper), helper_pb2.DESCRIPTOR.services_by_name["Helper"], None
    )
    add_service(
        leader_server, LeaderService(leader), leader_pb2.DESCRIPTOR.services_by_name["Leader"], None
    )
    helper_server.start()
    leader_server.start()
    stop = threading.Event()

    def drive() -> None:
        while not stop.is_set():
            try:
                if not leader.run_once():
                    time.sleep(0.05)
            except sqlite3.OperationalError:
                time.sleep(0.05)  # its own database locked: the next pass retries

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    try:
        yield Servers(files, leader, leader_db, tmp_path / "helper.db", stop)
    finally:
        stop.set()
        driver.join()
        leader_server.stop(None)
        helper_server.stop(None)


def _locked_for(db: Path, seconds: float) -> threading.Thread:
    """Another process holds the database's write lock for `seconds`."""
    ready = threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(db, timeout=5, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        ready.set()
        time.sleep(seconds)
        conn.execute("ROLLBACK")
        conn.close()

    t = threading.Thread(target=hold)
    t.start()
    ready.wait()
    return t


def _stored(db: Path) -> list[bytes]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return [bytes(r[0]) for r in conn.execute("SELECT report_id FROM reports")]
    finally:
        conn.close()


def test_upload_and_collection_survive_a_locked_leader_database(servers: Servers) -> None:
    now = int(time.time())
    t = now - now % TP - TP
    with Client(servers.files.client, retries=8, backoff=0.2) as client:
        reports = client.build_reports([1, 2, 3, 4, 5, 6], report_time=t)
        holder = _locked_for(servers.leader_db, 1.0)
        result = client.upload_reports(reports)
        holder.join()
    assert (result.accepted, result.duplicates) == (6, 0)
    assert sorted(_stored(servers.leader_db)) == sorted(r.report_id for r in reports)
    with Collector(servers.files.collector) as collector:
        holder = _locked_for(servers.leader_db, 1.0)
        r = collector.collect(t, TP, wait=60)
        holder.join()
    assert r.report_count == 6
    conn = sqlite3.connect(f"file:{servers.leader_db}?mode=ro", uri=True, timeout=30)
    try:
        # One collection job: every retry carried the same id.
        assert conn.execute("SELECT COUNT(*), MIN(state) FROM collections").fetchone() == (
            1,
            "finished",
        )
    finally:
        conn.close()


def _aggregated(servers: Servers, intervals_ago: int) -> int:
    """Five reports uploaded in the interval `intervals_ago` before this one
    and aggregated by the leader's driver; that interval's start."""
    now = int(time.time())
    t = now - now % TP - intervals_ago * TP
    with Client(servers.files.client) as client:
        assert client.upload_batch([1, 2, 3, 4, 5], report_time=t).accepted == 5
    task_id = servers.files.client.task_id
    deadline = time.monotonic() + 60
    while servers.leader.store.has_unaggregated(task_id, t, t + TP):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return t


def test_a_collection_waiting_for_the_helper_says_why(servers: Servers) -> None:
    """The collector polling a collection that the leader retries sees why it
    waits, and resumes it with the same job id once the helper is back."""
    t = _aggregated(servers, intervals_ago=2)
    job = secrets.token_bytes(16)
    holder = _locked_for(servers.helper_db, 4.0)
    try:
        with Collector(servers.files.collector) as collector, pytest.raises(CollectionError) as e:
            collector.collect(t, TP, wait=2.0, collection_job_id=job)
    finally:
        holder.join()
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "retrying: the helper" in e.value.message
    assert "database is unavailable" in e.value.message
    with Collector(servers.files.collector) as collector:
        r = collector.collect(t, TP, wait=60, collection_job_id=job)
    assert r.report_count == 5


def test_an_unexpected_error_in_a_collection_waits_its_backoff(
    servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault of the leader's own (here an exception injected into the
    batch's summing) neither ends the driver nor has it retry on every pass:
    the collection waits a growing backoff, the collector's status says only
    that the leader hit an unexpected error (never the exception's text),
    and once the fault is gone the same job finishes."""
    t = _aggregated(servers, intervals_ago=3)
    calls: list[float] = []

    def faulty(*args: object, **kwargs: object) -> None:
        calls.append(time.monotonic())
        raise TypeError("a secret-looking 0xdeadbeef in an exception's text")

    monkeypatch.setattr(collection, "batch_summary", faulty)
    job = secrets.token_bytes(16)
    with Collector(servers.files.collector) as collector, pytest.raises(CollectionError) as e:
        collector.collect(t, TP, wait=2.0, collection_job_id=job)
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "retrying: an unexpected error in the leader (see its log)" in e.value.message
    assert "deadbeef" not in e.value.message
    # 0.05 s doubling: at most a handful of attempts in the two seconds,
    # where retrying on every pass of a 0.05 s loop would make dozens.
    assert 2 <= len(calls) <= 8, calls
    assert all(b - a >= 0.04 for a, b in itertools.pairwise(calls))
    monkeypatch.undo()
    with Collector(servers.files.collector) as collector:
        r = collector.collect(t, TP, wait=60, collection_job_id=job)
    assert r.report_count == 5
