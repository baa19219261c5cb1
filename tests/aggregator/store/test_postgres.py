"""What the PostgreSQL backend does its own way: the round trips a unit of
work costs (each one is CPU at the client, per aggregation job), and two
units that meet on a row's lock."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.aggregator.store.test_storage import MERGE, TASK, report, share
from tests.support.wait import wait_until
from veil.aggregator.store import batches, collection_jobs, upkeep
from veil.aggregator.store.postgres import PostgresDatastore
from veil.aggregator.store.records import (
    BatchAggregate,
    CollectionGone,
    CollectionRecord,
    GcResult,
    leader_selected_bucket,
)
from veil.aggregator.store.tx import PostgresTx

pytestmark = pytest.mark.postgres

# True when the statement began its own transaction (autocommit), False
# inside a transaction block opened by an earlier BEGIN.
_OWN_TRANSACTION = (
    "SELECT xact_start = query_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
)


def test_a_read_is_one_statement_without_begin_and_commit(postgres: str) -> None:
    store = PostgresDatastore(postgres, pool_size=1)
    try:
        assert store._read(lambda tx: tx.one(_OWN_TRANSACTION)) == (True,)
        # A write unit is one transaction: BEGIN went first.
        assert store._write(lambda tx: tx.one(_OWN_TRANSACTION)) == (False,)
    finally:
        store.close()


def test_many_without_rows_sends_nothing(postgres: str, tmp_path: Path) -> None:
    trace = tmp_path / "libpq.trace"
    with psycopg.connect(postgres, autocommit=True) as conn, trace.open("w") as out:
        conn.pgconn.trace(out.fileno())
        tx = PostgresTx(conn)
        tx.many("INSERT INTO no_such_table VALUES (?)", [])
        out.flush()
        assert trace.read_text() == ""  # no message at all (executemany syncs)
        with pytest.raises(psycopg.errors.UndefinedTable):
            tx.many("INSERT INTO no_such_table VALUES (?)", [(1,)])
        conn.pgconn.untrace()


def _blocked_by(watch: psycopg.Connection[Any], pid: int) -> bool:
    """Whether another backend waits for a lock that backend `pid` holds."""
    row = watch.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (pid,)
    ).fetchone()
    return row is not None and row[0] > 0


def _while_held(
    postgres: str, hold: Callable[[PostgresTx], object], then: Callable[[], object]
) -> list[object]:
    """Run `hold` in a transaction of its own, then `then` in another thread,
    wait until that thread waits for a lock `hold` took, and commit: what
    `then` returned or raised."""
    got: list[object] = []

    def run() -> None:
        try:
            got.append(then())
        except Exception as e:
            got.append(e)

    with psycopg.connect(postgres) as conn, psycopg.connect(postgres, autocommit=True) as watch:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        thread = threading.Thread(target=run, daemon=True)
        with conn.transaction():
            hold(PostgresTx(conn))
            thread.start()
            wait_until(lambda: _blocked_by(watch, conn.info.backend_pid), "the other unit to wait")
        thread.join(timeout=60)
    return got


def test_a_deletion_and_the_closing_of_its_batch_wait_for_each_other(postgres: str) -> None:
    """A collector's deletion and the collection driver's closing of the
    job's batch, run at once in two transactions: whichever comes second
    waits for the first's row lock, and then sees what it did (PostgreSQL
    has it start again, from a fresh snapshot). The job is either kept as
    deleted, its batch closed, or discarded, its batch open: never
    discarded with its batch closed."""
    store = PostgresDatastore(postgres, pool_size=2)
    try:
        first = CollectionRecord(TASK, b"a" * 16, 0, 3600, "pending")
        second = CollectionRecord(TASK, b"b" * 16, 3600, 3600, "pending")
        for record in (first, second):
            store.put_collection(record)
        # The driver closes first: the deletion keeps the job.
        got = _while_held(
            postgres,
            lambda tx: collection_jobs.close_collection_batch(tx, first, 3600),
            lambda: store.delete_collection(TASK, first.job_id),
        )
        assert got == ["deleted"]
        assert [a.collected_by for a in store.batch_aggregates(TASK, 0, 3600)] == [first.job_id]
        # The deletion comes first: the driver closes nothing.
        got = _while_held(
            postgres,
            lambda tx: collection_jobs.delete_collection(tx, TASK, second.job_id),
            lambda: store.close_collection_batch(second, 3600),
        )
        assert len(got) == 1 and isinstance(got[0], CollectionGone), got
        assert store.batch_aggregates(TASK, 3600, 7200) == []
        assert [c.state for c in store.collections(TASK)] == ["deleted"]
    finally:
        store.close()


def _spent_batch(store: PostgresDatastore, task: bytes) -> None:
    """Batch A of two reports aggregated at 3600, short of the floor of 3,
    and a fresh report pending: a GC with its horizon at 5000 finds A spent."""
    store.put_reports(task, [(3600, report(n, 3600)) for n in (0, 1)])
    assert store.create_batch_job(task, b"0" * 16, 10, 3, b"A" * 32, None) == 2
    delta = BatchAggregate(leader_selected_bucket(b"A" * 32), share(1, 2), 2, b"c" * 32)
    ids = {r.report_id: None for r in store.job_reports(task, b"0" * 16)}
    store.finish_aggregation_job(task, b"0" * 16, ids, [delta], MERGE)
    store.put_reports(task, [(10**6, report(2, 10**6))])


def test_gc_and_a_job_joining_its_batch_wait_for_each_other(postgres: str) -> None:
    """GC taking a spent leader-selected batch and a new job joining it, run
    at once in two transactions (without the rule of batches.joinable_from,
    which keeps the two from both deciding): the job's write of the batch's
    row makes the second wait and start again from a fresh snapshot. GC
    first: the job makes a new batch; the job first: GC keeps the batch,
    its new report in a job. Never a job in a batch without its record."""
    store = PostgresDatastore(postgres, pool_size=2)
    a, bucket = b"A" * 32, leader_selected_bucket(b"A" * 32)
    try:
        _spent_batch(store, TASK)
        got = _while_held(
            postgres,
            lambda tx: upkeep.collect_garbage(tx, TASK, 3600, 5000, None),
            lambda: store.create_batch_job(TASK, b"1" * 16, 10, 3, b"B" * 32, None),
        )
        assert got == [1]
        assert store.batch_of_bucket(TASK, bucket) is None
        assert store.job_batch(TASK, b"1" * 16) == b"B" * 32
        other = b"u" * 32
        _spent_batch(store, other)
        got = _while_held(
            postgres,
            lambda tx: batches.create_batch_job(tx, other, b"1" * 16, 10, 3, b"B" * 32, None),
            lambda: store.collect_garbage(other, 3600, 5000, None),
        )
        assert len(got) == 1 and isinstance(got[0], GcResult) and not got[0].leader_batches
        assert store.batch_of_bucket(other, bucket) == a
        assert store.job_batch(other, b"1" * 16) == a
    finally:
        store.close()
