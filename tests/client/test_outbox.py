"""The durable outbox: the SQLite file on its own, then `Client` and
`AsyncClient` with an outbox against a real leader and helper that the
tests stop and start again."""

from __future__ import annotations

import asyncio
import sqlite3
import stat
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.deployment import Deployment, start_deployment
from tests.support.times import past_bucket
from veil.client import (
    AsyncClient,
    Client,
    Outbox,
    OutboxError,
    OutboxFull,
    prepare_reports,
)
from veil.hpke import generate_keypair
from veil.task import DpSpec, VdafSpec, new_task

TP = 3600
FILES = new_task(
    VdafSpec("count"),
    "127.0.0.1:1",
    "127.0.0.1:2",
    time_precision=TP,
    min_batch_size=1,
    dp=DpSpec("none"),
)
KEYS = generate_keypair(1), generate_keypair(2)


def reports(n: int, t: int = 7200) -> list:  # type: ignore[type-arg]
    return prepare_reports(FILES.client, [1] * n, KEYS[0].config, KEYS[1].config, t)


# --- the file --------------------------------------------------------------


def test_reports_wait_until_acknowledged_and_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "box"
    batch = reports(3)
    with Outbox(path) as box:
        box.add(FILES.client.task_id, batch)
        box.add(FILES.client.task_id, batch[:1])  # the same report id again: kept once
        assert box.pending_count(FILES.client.task_id) == 3
    with Outbox(path) as box:
        pending = box.pending(FILES.client.task_id, 10)
        assert [r for _, r in pending] == batch
        box.acknowledge(FILES.client.task_id, [batch[0].report_id, batch[0].report_id])
        assert [r for _, r in box.pending(FILES.client.task_id, 10)] == batch[1:]
        assert box.pending(FILES.client.task_id, 10, after=pending[1][0]) == [pending[2]]
        (status,) = box.status()
        assert (status.pending, status.delivered, status.oldest) == (2, 1, 7200)


def test_file_and_its_journal_are_private(tmp_path: Path) -> None:
    path = tmp_path / "box"
    with Outbox(path) as box:
        box.add(FILES.client.task_id, reports(1))
        files = [p for p in tmp_path.iterdir() if p.name.startswith("box")]
        assert len(files) >= 2  # the database and its write-ahead log
        for p in files:
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p.name


def test_an_existing_file_readable_by_others_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "box"
    path.touch(mode=0o644)
    path.chmod(0o644)
    Outbox(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_full_outbox_refuses_the_whole_batch_and_stores_nothing(tmp_path: Path) -> None:
    with Outbox(tmp_path / "box", max_reports=4) as box:
        box.add(FILES.client.task_id, reports(3))
        with pytest.raises(OutboxFull, match="holds 3 reports and its limit is 4"):
            box.add(FILES.client.task_id, reports(2))
        assert box.pending_count(FILES.client.task_id) == 3
        box.add(FILES.client.task_id, reports(1))


def test_expired_reports_are_dropped_and_counted(tmp_path: Path) -> None:
    with Outbox(tmp_path / "box") as box:
        box.add(FILES.client.task_id, reports(2, t=0) + reports(1, t=7200))
        assert box.drop_expired(FILES.client.task_id, None) == 0
        assert box.drop_expired(FILES.client.task_id, 3600) == 2
        (status,) = box.status()
        assert (status.pending, status.expired) == (1, 2)


@pytest.mark.parametrize(
    "content",
    [b"not a database at all, just some text\n" * 200, b""],
    ids=["text", "empty"],
)
def test_a_file_that_is_not_an_outbox(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "box"
    path.write_bytes(content)
    if content:
        with pytest.raises(OutboxError, match="not a veil outbox"):
            Outbox(path)
        assert path.read_bytes() == content
    else:
        Outbox(path).close()  # an empty file is a new outbox


def test_another_sqlite_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "leader.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE reports (x)")
    with pytest.raises(OutboxError, match="another SQLite database"):
        Outbox(path)
    with sqlite3.connect(path) as conn:
        names = [n for (n,) in conn.execute("SELECT name FROM sqlite_master")]
    assert names == ["reports"]


def test_a_damaged_report_is_named(tmp_path: Path) -> None:
    path = tmp_path / "box"
    with Outbox(path) as box:
        box.add(FILES.client.task_id, reports(1))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE reports SET report = x'ffffffff'")
    with Outbox(path) as box, pytest.raises(OutboxError, match="report 1 is damaged"):
        box.pending(FILES.client.task_id, 10)


def test_bound_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Outbox(tmp_path / "box", max_reports=0)


# --- with a real leader and helper -------------------------------------------


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    d = start_deployment(
        tmp_path_factory.mktemp("outbox"),
        {
            "count": (VdafSpec("count"), DpSpec("none"), {"min_batch_size": 1}),
            "expiring": (
                VdafSpec("count"),
                DpSpec("none"),
                {"report_expiry_age": 4 * TP, "min_batch_size": 1},
            ),
        },
    )
    try:
        yield d
    finally:
        d.stop()


def test_leader_outage_keeps_reports_until_flushed_once(dep: Deployment, tmp_path: Path) -> None:
    box = str(tmp_path / "box")
    before = dep.stored_reports("count")
    with Client(dep.tasks["count"].client, outbox=box, retries=0) as client:
        first = client.upload_batch([1, 1], report_time=past_bucket(1))
        assert (first.accepted, first.pending) == (2, 0)
        dep.leader.stop()
        try:
            down = client.upload_batch([1, 1, 1], report_time=past_bucket(1))
            assert (down.accepted, down.pending) == (0, 3)
            assert down.error is not None and "UNAVAILABLE" in down.error
        finally:
            dep.leader.start()
    # Another client, as after a restart, delivers what the first left.
    with Client(dep.tasks["count"].client, outbox=box) as client:
        flushed = client.flush()
        assert (flushed.accepted, flushed.duplicates, flushed.pending) == (3, 0, 0)
        assert client.flush().accepted == 0
    assert dep.stored_reports("count") == before + 5


def test_resent_reports_are_acknowledged_once(dep: Deployment, tmp_path: Path) -> None:
    """A report that reached the leader but was never removed from the outbox
    (the client died in between) is acknowledged as a duplicate and removed."""
    before = dep.stored_reports("count")
    with Client(dep.tasks["count"].client) as plain:
        sent = plain.build_reports([1, 1, 1], report_time=past_bucket(1))
        assert plain.upload_reports(sent[:2]).accepted == 2
    # What the client had written to its outbox before it died.
    with Outbox(tmp_path / "box") as box:
        box.add(dep.tasks["count"].client.task_id, sent)
    with Client(dep.tasks["count"].client, outbox=str(tmp_path / "box")) as client:
        result = client.flush()
    assert (result.accepted, result.duplicates, result.pending) == (1, 2, 0)
    assert dep.stored_reports("count") == before + 3


def test_a_refused_report_is_kept_apart_from_the_good_ones(dep: Deployment, tmp_path: Path) -> None:
    before = dep.stored_reports("count")
    with Client(dep.tasks["count"].client, outbox=str(tmp_path / "box")) as client:
        good = client.build_reports([1, 1], report_time=past_bucket(1))
        bad = replace(good[0], report_id=bytes(16), time=good[0].time + 1)  # unaligned time
        result = client.upload_reports([good[0], bad, good[1]])
        assert (result.accepted, result.refused, result.pending) == (2, 1, 0)
        assert client.flush().refused == 0  # never resent
    with Outbox(tmp_path / "box") as box:
        (status,) = box.status()
        assert (status.pending, status.refused) == (0, 1)
    assert dep.stored_reports("count") == before + 2


def test_a_refusal_not_about_the_reports_keeps_them_pending(
    dep: Deployment, tmp_path: Path
) -> None:
    """A leader that does not know the task says nothing against the reports:
    they stay pending (for a fixed deployment), never marked refused."""
    box = str(tmp_path / "box")
    task = dep.tasks["count"].client
    with Client(task) as client:
        reports = client.build_reports([1, 1], report_time=past_bucket(1))
    unknown = replace(task, task_id=bytes(32))
    with Outbox(box) as outbox:
        outbox.add(unknown.task_id, reports)
    with Client(unknown, outbox=box) as client:
        result = client.flush()
    assert (result.accepted, result.pending, result.refused) == (0, 2, 0)
    assert result.error is not None and "NOT_FOUND" in result.error


def test_expired_reports_are_dropped_unsent(dep: Deployment, tmp_path: Path) -> None:
    task = dep.tasks["expiring"].client
    with Client(task) as client:
        old = client.build_reports([1, 1], report_time=past_bucket(6))
        fresh = client.build_reports([1], report_time=past_bucket(1))
    with Outbox(tmp_path / "box") as box:
        box.add(task.task_id, old + fresh)
    with Client(task, outbox=str(tmp_path / "box")) as client:
        result = client.flush()
    assert (result.accepted, result.expired, result.pending, result.refused) == (1, 2, 0, 0)


def test_async_client_outbox(dep: Deployment, tmp_path: Path) -> None:
    box = str(tmp_path / "box")
    before = dep.stored_reports("count")

    async def run() -> None:
        task = dep.tasks["count"].client
        async with AsyncClient(task, outbox=box, retries=2, backoff=0.1) as client:
            assert (await client.upload_batch([1, 1], report_time=past_bucket(1))).accepted == 2
            dep.leader.stop()
            try:
                down = await asyncio.gather(*(client.upload(1, past_bucket(1)) for _ in range(3)))
                assert all(r.accepted == 0 for r in down)
                assert max(r.pending for r in down) == 3
            finally:
                dep.leader.start()
        # A fresh channel: the old one waits out gRPC's reconnection backoff.
        async with AsyncClient(task, outbox=box) as client:
            flushed = await client.flush()
            assert (flushed.accepted, flushed.pending) == (3, 0)

    asyncio.run(run())
    assert dep.stored_reports("count") == before + 5


def test_no_outbox_no_flush(dep: Deployment) -> None:
    with Client(dep.tasks["count"].client) as client, pytest.raises(ValueError, match="outbox"):
        client.flush()


def test_a_report_keeps_its_invitation_token_in_the_outbox(tmp_path: Path) -> None:
    # The token travels with its sealed report: a retry from the outbox sends
    # the same report id and the same token (an aggregator then sees a duplicate).
    token = bytes(range(256)) + bytes(98)
    batch = [replace(r, token=token) for r in reports(2)]
    with Outbox(tmp_path / "box") as box:
        box.add(FILES.client.task_id, batch)
    with Outbox(tmp_path / "box") as box:
        assert [r for _, r in box.pending(FILES.client.task_id, 10)] == batch
