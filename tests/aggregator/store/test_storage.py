"""The Datastore contract, run against every backend: SQLite and a real PostgreSQL."""

from __future__ import annotations

import secrets
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from tests.support.backends import Backend
from veil.aggregator.core import share_merge
from veil.aggregator.store import jobs, migrations
from veil.aggregator.store import postgres as postgres_backend
from veil.aggregator.store import reports as report_units
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.ledger import sqlite_ledger
from veil.aggregator.store.migrations import LEGACY_VERSION, MIGRATIONS
from veil.aggregator.store.postgres import PostgresDatastore
from veil.aggregator.store.records import (
    AGGREGATE_SHARDS,
    KEY_ACTIVE,
    KEY_EXPIRED,
    KEY_PENDING,
    BatchAggregate,
    BatchChanged,
    BucketCollected,
    CollectionRecord,
    HelperJob,
    HpkeKey,
    JobReport,
    PrefixQuery,
    QueryCollected,
    QueryConflict,
    ReportIdTaken,
    ReportsAggregated,
    StorageConflict,
    aggregate_shard,
    fold_shards,
)
from veil.aggregator.store.sqlite import _LEGACY_SCHEMA, PAGE_SIZE, SqliteDatastore
from veil.aggregator.store.tx import PostgresTx, Tx, _by_column, _packed_columns
from veil.hpke import generate_keypair
from veil.messages import Ciphertext, Report
from veil.vdaf import Prio3Sum
from veil.vdaf.engine import engine_for

TASK = b"t" * 32
CT = Ciphertext(1, b"e" * 32, b"payload")
VDAF = Prio3Sum(2, 1000)
MERGE = share_merge(engine_for(VDAF))


def report(i: int, time: int = 3600) -> Report:
    return Report(i.to_bytes(16, "big"), time, b"ps", CT, CT)


def job_report(i: int, time: int = 3600) -> JobReport:
    """`report(i)` as a job reads it back."""
    r = report(i, time)
    return JobReport(
        r.report_id, r.time, r.public_share, r.leader_ct.to_bytes(), r.helper_ct.to_bytes()
    )


def share(*values: int) -> bytes:
    """An encoded aggregate share holding the sum of `values`."""
    agg = VDAF.agg_init(None)
    for v in values:
        agg = VDAF.merge(None, [agg, [v % VDAF.field.MODULUS]])
    return VDAF.encode_agg_share(agg)


def fold(rows: list[BatchAggregate]) -> list[BatchAggregate]:
    """A batch's shard rows, one per bucket."""
    return fold_shards(rows, MERGE)


def xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


# A factory per backend: each call opens another handle on the same store, as
# another process would.
Opener = Callable[[], Datastore]


@pytest.fixture
def opener(backend: Backend) -> Opener:
    return lambda: backend.store("s", pool_size=4)


@pytest.fixture
def store(opener: Opener) -> Datastore:
    return opener()


def test_reports_all_or_nothing_and_duplicates(store: Datastore) -> None:
    assert store.put_reports(TASK, [(3600, report(1)), (3600, report(2))]) == (2, 0)
    assert store.put_reports(TASK, [(3600, report(1)), (3600, report(3))]) == (1, 1)
    changed = Report(report(4).report_id, 3600, b"other", CT, CT)
    with pytest.raises(StorageConflict):
        store.put_reports(
            TASK, [(3600, report(4)), (3600, Report(report(1).report_id, 3600, b"x", CT, CT))]
        )
    assert store.put_reports(TASK, [(3600, changed)]) == (1, 0)  # report 4 was not written before
    assert store.unaggregated_count(TASK, 0, 7200) == 4
    assert store.has_unaggregated(TASK, 0, 7200)
    assert not store.has_unaggregated(TASK, 0, 3600)  # the reports are at 3600
    assert not store.has_unaggregated(b"other task".ljust(32, b"\0"), 0, 7200)
    assert fold(store.batch_aggregates(TASK, 0, 7200)) == []  # nothing aggregated yet


def test_insert_new_skips_existing_keys_and_keeps_values(store: Datastore) -> None:
    # The many-rows insert the report and replay-record paths use: one
    # statement over arrays on PostgreSQL, executemany on SQLite.
    columns = (
        ("task_id", "bytea"),
        ("report_id", "bytea"),
        ("time", "bigint"),
        ("job_id", "bytea"),
    )
    job = bytes(16)
    first = [(TASK, bytes(16), 0, job), (TASK, b"\x00\xff" * 8, 2**63 - 1, job)]
    again = [
        (TASK, bytes(16), 5, job),  # its key is stored: skipped, time stays 0
        (TASK, b"\x01" * 16, 7, job),
        (TASK, b"\x01" * 16, 9, job),  # twice in one call: the first is kept
    ]
    inserted = []
    for rows in (first, [], again):

        def insert(tx: Tx, rows: list[tuple[bytes, bytes, int, bytes]] = rows) -> int:
            return tx.insert_new("helper_reports", columns, rows)

        inserted.append(store._write(insert))
    assert inserted == [2, 0, 1]  # what it returns: the rows inserted, none skipped
    stored = store._read(
        lambda tx: tx.rows("SELECT report_id, time, job_id FROM helper_reports ORDER BY report_id")
    )
    assert [(bytes(i), t, bytes(j)) for i, t, j in stored] == [
        (bytes(16), 0, job),
        (b"\x00\xff" * 8, 2**63 - 1, job),
        (b"\x01" * 16, 7, job),
    ]


def test_insert_new_rows_of_every_shape(store: Datastore) -> None:
    # SQLite takes rows of one shape (columns the same in every row, byte
    # strings of one length, one column of 64-bit integers) in one statement
    # and the others one by one; either way each row is stored as given.
    columns = (
        ("task_id", "bytea"),
        ("report_id", "bytea"),
        ("time", "bigint"),
        ("job_id", "bytea"),
    )
    ids = [bytes([i]) * 16 for i in range(8)]
    shapes = [
        # the replay records' shape: one statement on SQLite
        [(TASK, ids[0], -(2**63), b"j" * 16), (TASK, ids[1], 2**63 - 1, b"j" * 16)],
        # job ids of two lengths, a time missing
        [(TASK, ids[2], 1, b"a"), (TASK, ids[3], None, b"bb")],
        # no job id, and an id twice in one statement: the first is kept
        [(TASK, ids[4], 5, None), (TASK, ids[5], 6, None), (TASK, ids[4], 7, None)],
        # one row
        [(TASK, ids[6], 8, b"")],
    ]
    assert [_packed_columns(columns, _by_column(columns, rows)) is not None for rows in shapes] == [
        True,
        False,
        True,
        False,
    ]
    ints = (("a", "bigint"), ("b", "bigint"))
    assert (
        _packed_columns(ints, _by_column(ints, [(1, 2), (3, 4)])) is None
    )  # two integer columns vary
    assert _packed_columns(ints, _by_column(ints, [(1, 2), (2**63, 2)])) is None  # beyond 64 bits
    assert _packed_columns(ints, _by_column(ints, [(True, 2), (0, 2)])) is None  # not an int
    counts = []
    for rows in shapes:

        def insert(tx: Tx, rows: list[tuple[bytes, bytes, int | None, bytes | None]] = rows) -> int:
            return tx.insert_new("helper_reports", columns, rows)

        counts.append(store._write(insert))
    assert counts == [2, 2, 2, 1]
    stored = store._read(
        lambda tx: tx.rows("SELECT report_id, time, job_id FROM helper_reports ORDER BY report_id")
    )
    assert [(bytes(i), t, None if j is None else bytes(j)) for i, t, j in stored] == [
        (ids[0], -(2**63), b"j" * 16),
        (ids[1], 2**63 - 1, b"j" * 16),
        (ids[2], 1, b"a"),
        (ids[3], None, b"bb"),
        (ids[4], 5, None),
        (ids[5], 6, None),
        (ids[6], 8, b""),
    ]


def test_job_reports_read_each_field_back(store: Datastore) -> None:
    """A job reads its reports field for field as uploaded, by report id:
    the two ciphertexts cut back where they were joined, not swapped."""
    reports = [
        Report(
            bytes([9 - i]) * 16,
            3600 + i,
            bytes([i]) * (i + 1),
            Ciphertext(i, bytes([i + 1]) * 32, b"leader" * i),
            Ciphertext(255 - i, bytes([i + 2]) * 32, b"helper" * (i + 2)),
        )
        for i in range(3)
    ]
    store.put_reports(TASK, [(3600, r) for r in reports])
    assert store.create_aggregation_job(TASK, b"j" * 16, 3) == 3
    assert store.job_reports(TASK, b"j" * 16) == [
        JobReport(
            r.report_id, r.time, r.public_share, r.leader_ct.to_bytes(), r.helper_ct.to_bytes()
        )
        for r in reversed(reports)
    ]


def test_a_report_keeps_its_invitation_token(store: Datastore) -> None:
    # The leader sends the helper each report's token with it (the token's
    # challenge commits to the report, so it cannot travel inside a share).
    tokened = replace(report(1), token=b"t" * 354)
    assert store.put_reports(TASK, [(3600, tokened), (3600, report(2))]) == (2, 0)
    # The same content again is a duplicate, whatever token it carries.
    assert store.put_reports(TASK, [(3600, replace(tokened, token=b"u" * 354))]) == (0, 1)
    assert store.create_aggregation_job(TASK, b"j" * 16, 2) == 2
    assert {r.report_id: r.token for r in store.job_reports(TASK, b"j" * 16)} == {
        report(1).report_id: b"t" * 354,
        report(2).report_id: b"",
    }
    assert [r.token for r in store.batch_reports(TASK, 0, 7200)] == [b"t" * 354, b""]


def test_jobs_and_aggregates(store: Datastore) -> None:
    store.put_reports(TASK, [(3600, report(i)) for i in range(5)])
    assert store.create_aggregation_job(TASK, b"j" * 16, 3) == 3
    assert store.create_aggregation_job(TASK, b"k" * 16, 3) == 2
    assert store.create_aggregation_job(TASK, b"l" * 16, 3) == 0
    assert store.open_aggregation_jobs() == [(TASK, b"j" * 16), (TASK, b"k" * 16)]
    ids = [r.report_id for r in store.job_reports(TASK, b"j" * 16)]
    assert len(ids) == 3
    delta = BatchAggregate(3600, share(7), 2, b"c" * 32)
    outcomes: dict[bytes, str | None] = {ids[0]: None, ids[1]: None, ids[2]: "x"}
    store.finish_aggregation_job(TASK, b"j" * 16, outcomes, [delta], MERGE)
    with pytest.raises(StorageConflict):
        store.finish_aggregation_job(TASK, b"j" * 16, {}, [], MERGE)
    assert fold(store.batch_aggregates(TASK, 0, 7200)) == [delta]
    # A second job's delta is added to the bucket, not written over it.
    other = BatchAggregate(3600, share(5), 1, b"d" * 32)
    k_ids = [r.report_id for r in store.job_reports(TASK, b"k" * 16)]
    store.finish_aggregation_job(TASK, b"k" * 16, dict.fromkeys(k_ids, "y"), [other], MERGE)
    assert fold(store.batch_aggregates(TASK, 0, 7200)) == [
        BatchAggregate(3600, share(12), 3, xor(b"c" * 32, b"d" * 32))
    ]
    assert store.rejections(TASK) == {"x": 1, "y": 2}
    assert store.unaggregated_count(TASK, 0, 7200) == 0
    assert store.open_aggregation_jobs() == []


def test_finishing_a_job_accounts_for_each_of_its_reports(store: Datastore) -> None:
    # The aggregated reports are set by the job id, as the reports left in
    # the job once the rejected and deferred ones are set by id: outcomes
    # that leave a report of the job out (or name one of another job) are
    # refused and change nothing.
    store.put_reports(TASK, [(3600, report(i)) for i in range(6)])
    assert store.create_aggregation_job(TASK, b"j" * 16, 3) == 3
    assert store.create_aggregation_job(TASK, b"k" * 16, 3) == 3
    ids = [r.report_id for r in store.job_reports(TASK, b"j" * 16)]
    other = store.job_reports(TASK, b"k" * 16)[0].report_id
    delta = BatchAggregate(3600, share(1), 1, b"c" * 32)
    for outcomes in (
        {ids[0]: None, ids[1]: "x"},
        {ids[0]: None, ids[1]: None, ids[2]: None, other: None},
    ):
        with pytest.raises(StorageConflict):
            store.finish_aggregation_job(TASK, b"j" * 16, outcomes, [delta], MERGE)
        assert fold(store.batch_aggregates(TASK, 0, 7200)) == []
        assert store.rejections(TASK) == {}
        assert [r.report_id for r in store.job_reports(TASK, b"j" * 16)] == ids
    # One aggregated, one rejected, one deferred: each as said.
    store.finish_aggregation_job(
        TASK, b"j" * 16, {ids[0]: None, ids[1]: "x"}, [delta], MERGE, {ids[2]: 3600.0}
    )
    assert fold(store.batch_aggregates(TASK, 0, 7200)) == [delta]
    assert store.rejections(TASK) == {"x": 1}
    assert store.deferred_count(TASK) == 1
    assert store.unaggregated_count(TASK, 0, 7200) == 4  # the deferred one and job k's


def test_job_reports_read_back_exactly(store: Datastore) -> None:
    # PostgreSQL sends the job's reports in binary form: every field must
    # come back as stored, with its type, including a Histogram-sized
    # ciphertext with every byte value and an empty payload.
    wide = Ciphertext(255, secrets.token_bytes(32), bytes(range(256)) * 10)
    empty = Ciphertext(0, b"\0" * 32, b"")
    stored = [
        Report((1).to_bytes(16, "big"), 2**40 + 7, b"", wide, empty),
        Report((2).to_bytes(16, "big"), 3600, secrets.token_bytes(64), empty, wide),
    ]
    assert store.put_reports(TASK, [(3600, r) for r in stored]) == (2, 0)
    assert store.create_aggregation_job(TASK, b"j" * 16, 10) == 2
    read = store.job_reports(TASK, b"j" * 16)
    assert read == [
        JobReport(
            r.report_id, r.time, r.public_share, r.leader_ct.to_bytes(), r.helper_ct.to_bytes()
        )
        for r in stored
    ]
    for r, s in zip(read, stored, strict=True):
        assert type(r.time) is int
        assert all(
            type(b) is bytes
            for b in (r.report_id, r.public_share, r.leader_ct_bytes, r.helper_ct_bytes)
        )
        # The helper's ciphertext, cut from the stored form, is the one uploaded.
        assert r.helper_ct == s.helper_ct
        assert type(r.helper_ct.enc) is bytes and type(r.helper_ct.payload) is bytes


def test_job_leases(store: Datastore) -> None:
    store.put_reports(TASK, [(3600, report(i)) for i in range(4)])
    store.create_aggregation_job(TASK, b"j" * 16, 2)
    store.create_aggregation_job(TASK, b"k" * 16, 2)
    assert store.acquire_aggregation_jobs("a", 60, 1) == [(TASK, b"j" * 16)]
    assert store.acquire_aggregation_jobs("b", 60, 5) == [(TASK, b"k" * 16)]
    assert store.acquire_aggregation_jobs("c", 60, 5) == []  # both held
    # The holder may take its own job again (a retry after the helper was away).
    assert store.acquire_aggregation_jobs("a", 60, 5) == [(TASK, b"j" * 16)]
    assert store.renew_aggregation_job(TASK, b"j" * 16, "a", 60)
    assert not store.renew_aggregation_job(TASK, b"j" * 16, "c", 60)
    # An expired lease is taken over by another worker.
    assert store.acquire_aggregation_jobs("b", -1, 5) == [(TASK, b"k" * 16)]
    assert store.acquire_aggregation_jobs("c", 60, 5) == [(TASK, b"k" * 16)]
    assert not store.renew_aggregation_job(TASK, b"k" * 16, "b", 60)
    ids = [r.report_id for r in store.job_reports(TASK, b"k" * 16)]
    store.finish_aggregation_job(TASK, b"k" * 16, dict.fromkeys(ids, "x"), [], MERGE)
    assert not store.renew_aggregation_job(TASK, b"k" * 16, "c", 60)
    assert store.acquire_aggregation_jobs("c", -1, 5) == []  # j is still a's


def test_collection_leases_and_single_leader_share(store: Datastore) -> None:
    record = CollectionRecord(TASK, b"a" * 16, 0, 3600, "pending")
    store.put_collection(record)
    assert store.acquire_collections("w1", 60, 5) == [record]
    assert store.acquire_collections("w2", 60, 5) == []
    assert store.acquire_collections("w1", 60, 5) == [record]
    with_share = CollectionRecord(TASK, b"a" * 16, 0, 3600, "pending", 3, b"s" * 32, CT)
    store.update_collection(with_share)
    store.update_collection(with_share)  # the same share again is fine
    # A worker that took the job over must not replace the share: it may have left.
    noised_again = Ciphertext(1, b"e" * 32, b"another draw")
    other = CollectionRecord(TASK, b"a" * 16, 0, 3600, "pending", 3, b"s" * 32, noised_again)
    with pytest.raises(StorageConflict):
        store.update_collection(other)
    done = CollectionRecord(TASK, b"a" * 16, 0, 3600, "finished", 3, b"s" * 32, CT, CT)
    store.update_collection(done)
    with pytest.raises(StorageConflict):
        store.update_collection(with_share)  # no way back from finished
    assert store.get_collection(TASK, b"a" * 16) == done
    assert store.acquire_collections("w2", -1, 5) == []


def test_collection_lease_renewed_by_its_holder_only(store: Datastore) -> None:
    record = CollectionRecord(TASK, b"a" * 16, 0, 3600, "pending")
    store.put_collection(record)
    # A lease already expired (negative length): another worker could take it...
    assert store.acquire_collections("w1", -1, 5) == [record]
    assert not store.renew_collection(TASK, b"a" * 16, "w2", 60)
    # ...until its holder renews it.
    assert store.renew_collection(TASK, b"a" * 16, "w1", 60)
    assert store.acquire_collections("w2", 60, 5) == []
    store.update_collection(replace(record, state="finished"))
    assert not store.renew_collection(TASK, b"a" * 16, "w1", 60)


def test_close_batch_once_and_reopen(store: Datastore) -> None:
    store.close_batch(TASK, 0, 7200, b"a" * 16, 3600)
    store.close_batch(TASK, 0, 7200, b"a" * 16, 3600)  # idempotent for the same job
    with pytest.raises(StorageConflict):
        store.close_batch(TASK, 3600, 7200, b"b" * 16, 3600)
    with pytest.raises(StorageConflict):
        store.put_reports(TASK, [(3600, report(1))])
    record = CollectionRecord(TASK, b"a" * 16, 0, 7200, "pending")
    assert store.put_collection(record) == record
    with pytest.raises(StorageConflict):
        store.put_collection(CollectionRecord(TASK, b"a" * 16, 0, 3600, "pending"))
    store.fail_collection(
        CollectionRecord(TASK, b"a" * 16, 0, 7200, "failed", error_code=9), reopen=True
    )
    assert store.get_collection(TASK, b"a" * 16).state == "failed"  # type: ignore[union-attr]
    assert store.put_reports(TASK, [(3600, report(1))]) == (1, 0)


def test_a_closed_bucket_still_takes_the_jobs_it_waits_for(store: Datastore) -> None:
    # A collection closes its batch first, then waits for the jobs holding the
    # batch's reports: those still add to the closed bucket.
    store.put_reports(TASK, [(3600, report(1))])
    store.create_aggregation_job(TASK, b"j" * 16, 10)
    store.close_batch(TASK, 3600, 7200, b"c" * 16, 3600)
    assert store.unaggregated_count(TASK, 3600, 7200) == 1
    assert store.has_unaggregated(TASK, 3600, 7200)  # in a job still counts
    delta = BatchAggregate(3600, share(1), 1, b"c" * 32)
    store.finish_aggregation_job(TASK, b"j" * 16, {report(1).report_id: None}, [delta], MERGE)
    assert store.unaggregated_count(TASK, 3600, 7200) == 0
    assert not store.has_unaggregated(TASK, 3600, 7200)
    assert fold(store.batch_aggregates(TASK, 3600, 7200)) == [
        BatchAggregate(3600, share(1), 1, b"c" * 32, b"c" * 16)
    ]


def test_helper_records(store: Datastore) -> None:
    delta = BatchAggregate(0, share(3), 1, b"c" * 32)
    assert (
        store.commit_helper_job(
            HelperJob(TASK, b"j" * 16, b"h" * 32, b"resp", [(b"r" * 16, 0)], ["bad"], [delta]),
            MERGE,
        )
        is None
    )
    assert store.helper_job(TASK, b"j" * 16) == (b"h" * 32, b"resp")
    assert store.seen_reports(TASK, [b"r" * 16, b"s" * 16]) == {b"r" * 16}
    assert store.rejections(TASK) == {"bad": 1}
    record = CollectionRecord(TASK, b"c" * 16, 0, 3600, "finished", 1, b"c" * 32, None, CT)
    assert store.commit_helper_collection(record, 3600) == record
    assert store.get_collection(TASK, b"c" * 16) == record
    assert fold(store.batch_aggregates(TASK, 0, 3600)) == [
        BatchAggregate(0, share(3), 1, b"c" * 32, b"c" * 16)
    ]


def test_hpke_keys_persist(opener: Opener) -> None:
    kp = generate_keypair(9)
    opener().add_hpke_key(HpkeKey(kp, KEY_ACTIVE, 100.0))
    assert [k.keypair for k in opener().hpke_keys()] == [kp]


def test_concurrent_workers_count_every_report_once(opener: Opener) -> None:
    """Two handles (as two worker processes) make and finish jobs over one bucket at once:
    every report lands in exactly one job and the bucket's sum is exact."""
    n, job_size = 60, 4
    first = opener()
    first.put_reports(TASK, [(3600, report(i)) for i in range(n)])
    errors: list[BaseException] = []
    finished: list[bytes] = []
    lock = threading.Lock()

    def worker(name: str, store: Datastore) -> None:
        try:
            for k in range(n):
                if not store.create_aggregation_job(
                    TASK, f"{name}{k:03d}".encode().ljust(16), job_size
                ):
                    break
            while leased := store.acquire_aggregation_jobs(name, 60, 1):
                _, job_id = leased[0]
                reports = store.job_reports(TASK, job_id)
                values = [int.from_bytes(r.report_id, "big") for r in reports]
                checksum = bytes(32)
                for r in reports:
                    checksum = xor(checksum, r.report_id.rjust(32, b"\0"))
                delta = BatchAggregate(3600, share(*values), len(values), checksum)
                time.sleep(0.001)  # let the other worker interleave
                store.finish_aggregation_job(
                    TASK, job_id, {r.report_id: None for r in reports}, [delta], MERGE
                )
                with lock:
                    finished.append(job_id)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w, opener())) for w in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(set(finished)) == len(finished) == n // job_size
    (agg,) = fold(first.batch_aggregates(TASK, 0, 7200))
    assert agg.report_count == n
    assert agg.agg_share == share(*range(n))
    assert first.unaggregated_count(TASK, 0, 7200) == 0


# --- operations: key rotation, garbage collection, status -----------------

TP = 3600


def test_hpke_key_states_and_rotation(store: Datastore) -> None:
    old, new = generate_keypair(1), generate_keypair(2)
    store.add_hpke_key(HpkeKey(old, KEY_ACTIVE, 100.0))
    store.add_hpke_key(HpkeKey(new, KEY_PENDING, 200.0))
    with pytest.raises(StorageConflict):
        store.add_hpke_key(HpkeKey(generate_keypair(2), KEY_PENDING, 300.0))
    assert [(k.config_id, k.state) for k in store.hpke_keys()] == [(1, "active"), (2, "pending")]
    assert {k.keypair for k in store.hpke_keys()} == {old, new}

    store.activate_hpke_key(2, now=1000.0, grace=50.0)
    keys = {k.config_id: k for k in store.hpke_keys()}
    assert (keys[1].state, keys[1].expires_at) == (KEY_EXPIRED, 1050.0)
    assert (keys[2].state, keys[2].expires_at) == (KEY_ACTIVE, None)
    assert keys[2].keypair == new
    store.activate_hpke_key(2, now=1001.0, grace=50.0)  # already active: no change
    assert {k.config_id: k.state for k in store.hpke_keys()} == {1: "expired", 2: "active"}
    with pytest.raises(StorageConflict):
        store.activate_hpke_key(1, now=1002.0, grace=50.0)  # an expired key stays expired
    with pytest.raises(StorageConflict):
        store.activate_hpke_key(77, now=1002.0, grace=50.0)

    assert store.delete_expired_hpke_keys(1049.0) == []
    assert store.delete_expired_hpke_keys(1050.0) == [1]
    assert [k.config_id for k in store.hpke_keys()] == [2]


def _aggregate_all(store: Datastore, job: bytes, reject: frozenset[bytes] = frozenset()) -> None:
    assert store.create_aggregation_job(TASK, job, 1000) > 0
    ids = [r.report_id for r in store.job_reports(TASK, job)]
    store.finish_aggregation_job(
        TASK, job, {i: ("x" if i in reject else None) for i in ids}, [], MERGE
    )


def test_gc_leader_keeps_what_replay_protection_needs(store: Datastore) -> None:
    # Buckets 0 and 3600 (old), 7200 (collected), 10800 (current).
    store.put_reports(TASK, [(0, report(1, 0)), (3600, report(2, 3600))])
    store.put_reports(TASK, [(7200, report(3, 7200)), (10800, report(4, 10800))])
    _aggregate_all(store, b"j" * 16, reject=frozenset({report(2).report_id}))
    store.put_reports(TASK, [(10800, report(5, 10800))])  # still pending
    store.close_batch(TASK, 7200, 10800, b"c" * 16, TP)
    # Closed but not finished: the collection may still fail and reopen the bucket.
    assert store.collect_garbage(TASK, TP, None, None).reports == 0
    store.put_collection(CollectionRecord(TASK, b"c" * 16, 7200, 3600, "pending"))
    store.update_collection(CollectionRecord(TASK, b"c" * 16, 7200, 3600, "finished", 1))

    # No expiry: only the finished collection's report goes.
    result = store.collect_garbage(TASK, TP, None, None)
    assert result.reports == 1
    assert store.report_counts(TASK, TP) == {
        0: {"aggregated": 1},
        3600: {"rejected": 1},
        10800: {"aggregated": 1, "pending": 1},
    }
    with pytest.raises(StorageConflict):  # the replay into the collected bucket is still refused
        store.put_reports(TASK, [(7200, report(3, 7200))])

    # Horizon 7200: the aggregated and rejected reports before it go, the job
    # with no report left goes, the pending report stays.
    result = store.collect_garbage(TASK, TP, 7200, None)
    assert result.reports == 2
    assert store.report_counts(TASK, TP) == {10800: {"aggregated": 1, "pending": 1}}
    assert rows_of(store, "report_shares") == 2  # a report's shares go with it
    assert store.open_aggregation_jobs() == []
    assert store.unaggregated_count(TASK, 0, 14400) == 1
    # The job still holds report 4, so it is kept until that report goes.
    assert store.collect_garbage(TASK, TP, 7200, None).aggregation_jobs == 0
    assert store.collect_garbage(TASK, TP, 14400, None).aggregation_jobs == 1


def test_gc_batch_aggregates_and_collections_past_horizon(store: Datastore) -> None:
    store.put_reports(TASK, [(0, report(1, 0))])
    store.create_aggregation_job(TASK, b"j" * 16, 10)
    aggs = [BatchAggregate(0, b"s", 1, b"c" * 32), BatchAggregate(3600, b"s", 1, b"c" * 32)]
    store.finish_aggregation_job(TASK, b"j" * 16, {report(1).report_id: None}, aggs, MERGE)
    store.put_collection(CollectionRecord(TASK, b"c" * 16, 0, 3600, "pending"))
    store.fail_collection(CollectionRecord(TASK, b"c" * 16, 0, 3600, "failed"), reopen=False)
    store.put_collection(CollectionRecord(TASK, b"d" * 16, 3600, 3600, "pending"))
    result = store.collect_garbage(TASK, TP, 3600, None)
    # Bucket 0's rows went: its lock row and the job's shard row.
    assert (result.batch_aggregates, result.collections) == (2, 1)
    assert [a.bucket for a in fold(store.batch_aggregates(TASK, 0, 7200))] == [3600]
    assert [c.job_id for c in store.collections(TASK)] == [b"d" * 16]
    # A pending collection is never deleted, whatever its age.
    assert store.collect_garbage(TASK, TP, 10**9, None).collections == 0
    assert result.total() == result.reports + result.aggregation_jobs + 3


def test_helper_job_commits_once(store: Datastore) -> None:
    # A job id stored first (by any process) wins: a second commit of it
    # writes nothing and returns the stored answer.
    delta = BatchAggregate(0, share(3), 1, b"c" * 32)
    job = (TASK, b"j" * 16, b"h" * 32, b"resp", [(b"r" * 16, 0)], [], [delta], MERGE)
    assert store.commit_helper_job(HelperJob(*job[:-1]), MERGE) is None
    other = (TASK, b"j" * 16, b"H" * 32, b"other", [(b"s" * 16, 0)], ["bad"], [delta], MERGE)
    assert store.commit_helper_job(HelperJob(*other[:-1]), MERGE) == (b"h" * 32, b"resp")
    assert store.seen_reports(TASK, [b"s" * 16]) == set()
    assert store.rejections(TASK) == {}
    assert fold(store.batch_aggregates(TASK, 0, 3600)) == [
        BatchAggregate(0, share(3), 1, b"c" * 32)
    ]


def _refused_for_r(store: Datastore, delta: BatchAggregate) -> None:
    """A job holding report r, which has a replay record, and a new report s
    is refused, naming r, and commits nothing at all."""
    with pytest.raises(ReportsAggregated) as e:
        store.commit_helper_job(
            HelperJob(
                TASK, b"k" * 16, b"h" * 32, b"r", [(b"s" * 16, 0), (b"r" * 16, 0)], [], [delta]
            ),
            MERGE,
        )
    assert e.value.report_ids == [b"r" * 16]
    assert store.helper_job(TASK, b"k" * 16) is None
    assert store.seen_reports(TASK, [b"s" * 16]) == set()


def test_helper_report_aggregated_at_most_once(store: Datastore) -> None:
    delta = BatchAggregate(0, share(3), 1, b"c" * 32)
    store.commit_helper_job(
        HelperJob(TASK, b"j" * 16, b"h" * 32, b"r", [(b"r" * 16, 0)], [], [delta]), MERGE
    )
    # Another job holding the same report id commits nothing at all.
    _refused_for_r(store, delta)
    assert sum(a.report_count for a in fold(store.batch_aggregates(TASK, 0, 3600))) == 1


def test_helper_job_refused_by_a_record_without_job_id(store: Datastore) -> None:
    # A replay record kept from before job ids were (job_id NULL) refuses a
    # job holding its report like any other's; a job naming one report twice
    # records it once and commits.
    delta = BatchAggregate(0, share(3), 1, b"c" * 32)
    store._write(
        lambda tx: tx.run(
            "INSERT INTO helper_reports (task_id, report_id) VALUES (?, ?)", (TASK, b"r" * 16)
        )
    )
    _refused_for_r(store, delta)
    twice = [(b"t" * 16, 0), (b"t" * 16, 0)]
    job = HelperJob(TASK, b"l" * 16, b"h" * 32, b"r", twice, [], [delta])
    assert store.commit_helper_job(job, MERGE) is None
    assert store.seen_reports(TASK, [b"t" * 16]) == {b"t" * 16}
    assert sum(a.report_count for a in fold(store.batch_aggregates(TASK, 0, 3600))) == 1


def test_helper_job_refused_in_a_collected_bucket(store: Datastore) -> None:
    store.commit_helper_collection(
        CollectionRecord(TASK, b"c" * 16, 0, 3600, "finished", 0, bytes(32), None, CT), TP
    )
    delta = BatchAggregate(0, share(3), 1, b"c" * 32)
    with pytest.raises(BucketCollected):
        store.commit_helper_job(
            HelperJob(TASK, b"j" * 16, b"h" * 32, b"r", [(b"r" * 16, 0)], [], [delta]), MERGE
        )
    assert store.helper_job(TASK, b"j" * 16) is None
    assert store.seen_reports(TASK, [b"r" * 16]) == set()


def test_helper_collection_stored_once_for_the_batch_it_read(store: Datastore) -> None:
    delta = BatchAggregate(0, share(3), 1, b"c" * 32)
    store.commit_helper_job(
        HelperJob(TASK, b"j" * 16, b"h" * 32, b"r", [(b"r" * 16, 0)], [], [delta]), MERGE
    )
    # Computed from a batch that has changed since: nothing closed, nothing stored.
    stale = CollectionRecord(TASK, b"c" * 16, 0, 3600, "finished", 0, bytes(32), None, CT)
    with pytest.raises(BatchChanged):
        store.commit_helper_collection(stale, TP)
    assert store.get_collection(TASK, b"c" * 16) is None
    assert fold(store.batch_aggregates(TASK, 0, 3600))[0].collected_by is None
    record = replace(stale, report_count=1, checksum=b"c" * 32)
    assert store.commit_helper_collection(record, TP) == record
    # A second process's share for the same job id: the first one stays.
    other = replace(record, helper_ct=Ciphertext(2, b"e" * 32, b"other"))
    assert store.commit_helper_collection(other, TP) == record
    assert store.get_collection(TASK, b"c" * 16) == record
    with pytest.raises(BucketCollected):
        store.commit_helper_collection(replace(record, job_id=b"d" * 16), TP)


def test_gc_helper_replay_records_and_jobs(store: Datastore) -> None:
    ids = [i.to_bytes(16, "big") for i in range(4)]
    times = [0, 3600, 7200, 5 * 3600]
    pairs = list(zip(ids, times, strict=True))
    store.commit_helper_job(HelperJob(TASK, b"j" * 16, b"h" * 32, b"resp", pairs, [], []), MERGE)
    store.commit_helper_collection(
        CollectionRecord(TASK, b"c" * 16, 7200, 3600, "finished", 0, bytes(32), None, CT), TP
    )
    result = store.collect_garbage(TASK, TP, 3600, None)
    assert result.replay_records == 2  # ids[0] (too old) and ids[2] (bucket collected)
    assert store.seen_reports(TASK, ids) == {ids[1], ids[3]}
    assert store.collect_garbage(TASK, TP, 5 * 3600, None).replay_records == 1
    assert store.seen_reports(TASK, ids) == {ids[3]}
    # The job record stays while a replay record of its reports does (ids[3]).
    assert store.helper_job(TASK, b"j" * 16) is not None
    assert store.collect_garbage(TASK, TP, None, 0.0).helper_jobs == 0
    assert store.collect_garbage(TASK, TP, None, time.time() + 60).helper_jobs == 1
    assert store.helper_job(TASK, b"j" * 16) is None


def test_gc_helper_job_goes_with_its_last_replay_record(store: Datastore) -> None:
    ids = [i.to_bytes(16, "big") for i in range(2)]
    store.commit_helper_job(
        HelperJob(TASK, b"j" * 16, b"h" * 32, b"resp", [(i, 7200) for i in ids], [], []), MERGE
    )
    store.commit_helper_job(
        HelperJob(TASK, b"k" * 16, b"h" * 32, b"resp", [(b"z" * 16, 0)], [], []), MERGE
    )
    store.commit_helper_collection(
        CollectionRecord(TASK, b"c" * 16, 7200, 3600, "finished", 0, bytes(32), None, CT), TP
    )
    result = store.collect_garbage(TASK, TP, None, None)
    assert (result.replay_records, result.helper_jobs) == (2, 1)
    assert store.helper_job(TASK, b"j" * 16) is None
    assert store.helper_job(TASK, b"k" * 16) is not None


def test_gc_only_touches_its_task(store: Datastore) -> None:
    other = b"o" * 32
    store.put_reports(other, [(0, report(1, 0))])
    store.create_aggregation_job(other, b"j" * 16, 10)
    store.finish_aggregation_job(other, b"j" * 16, {report(1).report_id: None}, [], MERGE)
    assert store.collect_garbage(TASK, TP, 10**9, time.time() + 60).total() == 0
    assert store.report_counts(other, TP) == {0: {"aggregated": 1}}


def test_size_and_reclaim_space(store: Datastore) -> None:
    # Sizes relative to the empty database: a server backend has a fixed
    # overhead (catalogs) that no reclaim removes.
    store.reclaim_space(full=True)
    empty = store.size_bytes()
    big = Ciphertext(1, b"e" * 32, secrets.token_bytes(4000))  # random: no compression
    reports = [(0, Report(i.to_bytes(16, "big"), 0, b"ps", big, big)) for i in range(500)]
    store.put_reports(TASK, reports)
    store.reclaim_space()
    full = store.size_bytes()
    assert full - empty > 500 * 8000
    while store.create_aggregation_job(TASK, secrets.token_bytes(16), 100):
        pass
    for _, job in store.open_aggregation_jobs():
        outcomes = {r.report_id: None for r in store.job_reports(TASK, job)}
        store.finish_aggregation_job(TASK, job, outcomes, [], MERGE)
    assert store.collect_garbage(TASK, TP, 3600, None).reports == 500
    store.reclaim_space()  # the background kind: must not grow the database
    assert store.size_bytes() <= full
    store.reclaim_space(full=True)
    assert store.size_bytes() - empty < (full - empty) // 10


def test_no_upload_lands_in_a_bucket_after_it_is_closed(opener: Opener) -> None:
    """Uploads racing a collection's close (two handles, as two processes): every
    report the store accepted was in before the close committed, none after."""
    uploader, collector = opener(), opener()
    uploader.put_reports(TASK, [(3600, report(0))])
    refused = threading.Event()
    errors: list[BaseException] = []

    def upload() -> None:
        i = 1
        try:
            while not refused.is_set():
                try:
                    uploader.put_reports(TASK, [(3600, report(i))])
                except StorageConflict:
                    refused.set()
                i += 1
        except BaseException as e:
            errors.append(e)
            refused.set()

    thread = threading.Thread(target=upload)
    thread.start()
    time.sleep(0.2)
    collector.close_batch(TASK, 3600, 7200, b"c" * 16, 3600)
    at_close = collector.unaggregated_count(TASK, 3600, 7200)
    thread.join(30)
    assert errors == []
    assert refused.is_set()
    assert collector.unaggregated_count(TASK, 3600, 7200) == at_close


def test_sqlite_job_path_looks_reports_up_by_index(tmp_path: Path) -> None:
    """Every statement on the aggregation path finds its rows of `reports`
    and of `report_shares` through an index on more than the task id.
    Without statistics, SQLite once walked all of a task's reports to read
    one job, which made each job slower as the task grew."""
    store = SqliteDatastore(tmp_path / "plan.db")
    db = store._conn()
    statements: list[str] = []
    db.set_trace_callback(statements.append)
    store.put_reports(TASK, [(3600, report(i)) for i in range(20)])
    upload_end = len(
        [q for q in statements if q.lstrip().startswith(("INSERT", "UPDATE", "DELETE"))]
    )
    store.create_aggregation_job(TASK, b"j" * 16, 10)
    ids = [r.report_id for r in store.job_reports(TASK, b"j" * 16)]
    assert ids == sorted(ids) and len(ids) == 10
    store.finish_aggregation_job(TASK, b"j" * 16, dict.fromkeys(ids), [], MERGE)
    db.set_trace_callback(None)
    # A report's shares are written once, on upload: the job path changes
    # only its narrow state row.
    writes = [q for q in statements if q.lstrip().startswith(("INSERT", "UPDATE", "DELETE"))]
    assert any(q.startswith("INSERT INTO report_shares") for q in writes[:upload_end])
    assert [q for q in writes[upload_end:] if "report_shares" in q] == []
    checked: dict[str, int] = {"reports": 0, "report_shares": 0}
    for sql in statements:
        if " report" not in sql or not sql.lstrip().startswith(("SELECT", "UPDATE")):
            continue
        for row in db.execute("EXPLAIN QUERY PLAN " + sql).fetchall():
            detail = row[3]
            for table in checked:
                if f" {table} " in f"{detail} ":
                    checked[table] += 1
                    assert not detail.startswith("SCAN"), (sql, detail)
                    assert "(task_id=?)" not in detail, (sql, detail)
    # The shares are read once, with the job's reports.
    assert checked["reports"] >= 3 and checked["report_shares"] >= 1, checked
    store.close()


@pytest.mark.postgres
def test_both_backends_make_the_same_tables_and_columns(tmp_path: Path, postgres: str) -> None:
    # The two schemas are written in two dialects; their tables and columns
    # (the ledger's included) must not drift apart.
    path = tmp_path / "s.db"
    SqliteDatastore(path).close()
    sqlite_ledger(str(path))
    with sqlite3.connect(path) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        lite = {t: {r[1] for r in db.execute(f"PRAGMA table_info({t})")} for t in tables}
    PostgresDatastore(postgres).close()
    with psycopg.connect(postgres) as conn:
        rows = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema()"
        ).fetchall()
    pg: dict[str, set[str]] = {}
    for table, column in rows:
        pg.setdefault(table, set()).add(column)
    assert lite == pg
    assert "veil_schema" in lite  # one schema-version table on both


def test_an_sqlite_file_from_before_the_numbered_migrations_is_adopted(tmp_path: Path) -> None:
    # A file as the first release made it (no veil_schema, no lease or key
    # columns), holding a report: opened, it gets every column and the
    # current version, and keeps its data.
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as db:
        db.executescript(_LEGACY_SCHEMA)
        db.execute(
            "INSERT INTO reports (task_id, report_id, time, public_share, leader_ct, helper_ct)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (TASK, report(1).report_id, 3600, b"ps", CT.to_bytes(), CT.to_bytes()),
        )
    store = SqliteDatastore(old)
    assert store.unaggregated_count(TASK, 0, 7200) == 1
    # Stored before reports kept their tokens: read back with an empty one.
    assert store.create_aggregation_job(TASK, b"j" * 16, 1) == 1
    assert store.job_reports(TASK, b"j" * 16)[0].token == b""
    assert store.batch_reports(TASK, 0, 7200)[0].token == b""
    store.close()
    fresh = tmp_path / "fresh.db"
    SqliteDatastore(fresh).close()

    def columns(path: Path) -> dict[str, list[str]]:
        with sqlite3.connect(path) as db:
            names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            return {t: sorted(r[1] for r in db.execute(f"PRAGMA table_info({t})")) for t in names}

    assert columns(old) == columns(fresh)
    with sqlite3.connect(old) as db:
        versions = [r[0] for r in db.execute("SELECT version FROM veil_schema ORDER BY version")]
    assert versions == list(range(LEGACY_VERSION, len(MIGRATIONS) + 1))


def test_a_new_sqlite_file_takes_the_page_size_and_an_old_one_keeps_its_own(
    tmp_path: Path,
) -> None:
    def page_size(path: Path) -> int:
        with sqlite3.connect(path) as db:
            return int(db.execute("PRAGMA page_size").fetchone()[0])

    SqliteDatastore(tmp_path / "new.db").close()
    assert page_size(tmp_path / "new.db") == PAGE_SIZE != 4096
    # A file made with SQLite's default pages (as before PAGE_SIZE) is
    # served as it is: its reports are read and written on 4 KB pages.
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as db:
        db.execute("PRAGMA page_size=4096")
        db.execute("PRAGMA journal_mode=WAL")
    store = SqliteDatastore(old)
    assert store.put_reports(TASK, [(3600, report(i)) for i in range(50)]) == (50, 0)
    assert store.unaggregated_count(TASK, 0, 7200) == 50
    store.close()
    assert page_size(old) == 4096


# --- shard rows: no hot row per bucket ---------------------------------------


def job_on_shard(shard: int, n: int = 0) -> bytes:
    """A job id whose deltas go to `shard` (1..AGGREGATE_SHARDS); `n` tells ids apart."""
    job_id = (shard - 1 + AGGREGATE_SHARDS * n).to_bytes(4, "big") + b"j" * 12
    assert aggregate_shard(job_id) == shard
    return job_id


def one_report_job(job_id: bytes, value: int, bucket: int = 3600) -> HelperJob:
    report_id = job_id[:4] + b"r" * 12
    delta = BatchAggregate(bucket, share(value), 1, report_id.rjust(32, b"\0"))
    return HelperJob(TASK, job_id, b"h" * 32, b"resp", [(report_id, bucket)], [], [delta])


class Holder:
    """A helper job's transaction held open on its own PostgreSQL connection,
    as another process in the middle of its commit."""

    def __init__(self, conninfo: str) -> None:
        self.conn = psycopg.connect(conninfo, autocommit=True)
        self.conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ

    def __enter__(self) -> Holder:
        self.tx = self.conn.transaction()
        self.tx.__enter__()
        return self

    def commit_job(self, job: HelperJob) -> None:
        assert jobs.commit_helper_job(PostgresTx(self.conn), job, MERGE) is None

    def __exit__(self, *exc: object) -> None:
        self.tx.__exit__(None, None, None)
        self.conn.close()


def in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as e:
            out.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.mark.postgres
def test_jobs_on_other_shards_of_a_bucket_do_not_wait(postgres: str) -> None:
    """A job holding its shard row of a bucket (uncommitted, as a process in
    the middle of its commit) does not hold up a job on another shard of the
    same bucket; a job on the same shard waits for it, then adds to it."""
    store = PostgresDatastore(postgres, pool_size=4)
    # The bucket's lock row exists from its first job (or on the leader, its
    # first upload): making it is the one step jobs of a bucket take in turn.
    store.commit_helper_job(one_report_job(job_on_shard(3), 8), MERGE)
    with Holder(postgres) as holder:
        holder.commit_job(one_report_job(job_on_shard(1), 1))
        other, out = in_thread(
            lambda: store.commit_helper_job(one_report_job(job_on_shard(2), 2), MERGE)
        )
        other.join(10)
        assert not other.is_alive() and out == [None]
        same, same_out = in_thread(
            lambda: store.commit_helper_job(one_report_job(job_on_shard(1, 1), 4), MERGE)
        )
        same.join(1)
        assert same.is_alive()  # waiting on shard 1's row lock
    same.join(30)
    assert same_out == [None]
    rows = store.batch_aggregates(TASK, 0, 7200)
    # Shard 1 holds two jobs; shards 2 and 3 one each.
    assert sorted(a.report_count for a in rows) == [1, 1, 2]
    (total,) = fold(rows)
    assert (total.report_count, total.agg_share) == (4, share(1, 2, 4, 8))
    store.close()


@pytest.mark.postgres
def test_jobs_made_at_once_take_disjoint_reports(postgres: str) -> None:
    """A job being made (its transaction open on another connection, as
    another worker's) holds its reports: a job made meanwhile takes the
    others without waiting for it, and none of the same."""
    store = PostgresDatastore(postgres, pool_size=4)
    store.put_reports(TASK, [(3600, report(i)) for i in range(4)])
    with Holder(postgres) as holder:
        assert jobs.create_aggregation_job(PostgresTx(holder.conn), TASK, b"j" * 16, 2) == 2
        other, out = in_thread(lambda: store.create_aggregation_job(TASK, b"k" * 16, 5))
        other.join(10)
        assert not other.is_alive() and out == [2]
    assert store.create_aggregation_job(TASK, b"l" * 16, 5) == 0
    held = {r.report_id for r in store.job_reports(TASK, b"j" * 16)}
    taken = {r.report_id for r in store.job_reports(TASK, b"k" * 16)}
    assert len(held) == len(taken) == 2 and held | taken == {report(i).report_id for i in range(4)}
    store.close()


@pytest.mark.postgres
def test_helper_close_reads_the_jobs_it_waited_for(postgres: str) -> None:
    """The helper's collection closes the bucket while a job is committing
    into another shard of it: the close waits for the job's lock on the
    bucket, and then reads the batch as it is after that job, not as it was
    when the close began. Its share, computed before the job, is refused
    (BatchChanged) instead of being released without the job's report."""
    store = PostgresDatastore(postgres, pool_size=4)
    store.commit_helper_job(one_report_job(job_on_shard(3), 5), MERGE)
    (before,) = fold(store.batch_aggregates(TASK, 3600, 7200))
    record = CollectionRecord(
        TASK, b"c" * 16, 3600, 3600, "finished", before.report_count, before.checksum, None, CT
    )
    with Holder(postgres) as holder:
        holder.commit_job(one_report_job(job_on_shard(4), 6))
        close, out = in_thread(lambda: store.commit_helper_collection(record, TP))
        close.join(1)
        assert close.is_alive()  # waiting on the bucket's lock row
    close.join(30)
    assert len(out) == 1 and isinstance(out[0], BatchChanged), out
    assert store.get_collection(TASK, b"c" * 16) is None
    (after,) = fold(store.batch_aggregates(TASK, 3600, 7200))
    assert after.collected_by is None and after.report_count == 2
    # Computed again from the batch as it is, the share is stored.
    again = replace(record, report_count=after.report_count, checksum=after.checksum)
    assert store.commit_helper_collection(again, TP) == again
    store.close()


def test_rows_from_before_shards_become_shard_0(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database at the schema before shard rows (version 4), holding a
    bucket's aggregate and a closed bucket, migrates: the rows are kept (as
    shard 0), and new jobs add to them through their shards."""
    monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS[:4])
    monkeypatch.setattr(postgres_backend, "MIGRATIONS", MIGRATIONS[:4])
    backend.store("m")
    old_rows = [
        (TASK, 3600, share(7), 2, b"c" * 32, None),
        (TASK, 7200, None, 0, bytes(32), b"x" * 16),
    ]
    insert = "INSERT INTO batch_aggregates VALUES (?, ?, ?, ?, ?, ?)"
    conninfo = backend.conninfo("m")
    if conninfo is None:
        with sqlite3.connect(backend.path("m")) as db:
            db.executemany(insert, old_rows)
    else:
        with psycopg.connect(conninfo) as conn:
            conn.cursor().executemany(insert.replace("?", "%s"), old_rows)
    monkeypatch.undo()
    store = backend.store("m")
    assert store.batch_aggregates(TASK, 0, 3 * 3600) == [
        BatchAggregate(3600, share(7), 2, b"c" * 32),
        BatchAggregate(7200, None, 0, bytes(32), b"x" * 16),
    ]
    store.commit_helper_job(one_report_job(job_on_shard(5), 3), MERGE)
    (total,) = fold(store.batch_aggregates(TASK, 3600, 7200))
    assert (total.report_count, total.agg_share) == (3, share(10))
    with pytest.raises(BucketCollected):
        store.commit_helper_job(one_report_job(job_on_shard(6), 3, bucket=7200), MERGE)


def rows_of(store: Datastore, table: str) -> int:
    """How many rows `table` holds (a constant name)."""
    row = store._read(lambda tx: tx.one(f"SELECT count(*) FROM {table}"))
    assert row is not None
    return int(row[0])


def test_reports_from_before_report_shares_migrate_in_every_state(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database at the schema before report_shares (version 7), holding a
    report in every state (pending, deferred as too early, in an open job,
    aggregated, rejected), migrates: each keeps its state, job, reason,
    retry time and content, and the leader's work goes on from there."""
    monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS[:7])
    monkeypatch.setattr(postgres_backend, "MIGRATIONS", MIGRATIONS[:7])
    backend.store("m")
    job, done = b"j" * 16, b"d" * 16
    ct = CT.to_bytes()
    old_rows = [
        (TASK, report(1).report_id, 3600, b"ps", ct, ct, 0, None, None, 0.0),
        (TASK, report(2).report_id, 3600, b"ps", ct, ct, 0, None, "report_too_early", 4e9),
        (TASK, report(3).report_id, 3600, b"ps", ct, ct, 1, job, None, 0.0),
        (TASK, report(4).report_id, 3600, b"ps", ct, ct, 1, job, None, 0.0),
        (TASK, report(5).report_id, 3600, b"ps", ct, ct, 2, done, None, 0.0),
        (TASK, report(6).report_id, 3600, b"ps", ct, ct, 3, done, "invalid_proof", 0.0),
    ]
    insert = "INSERT INTO reports VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    jobs_insert = (
        "INSERT INTO aggregation_jobs (task_id, job_id, state, created) VALUES (?, ?, ?, 0)"
    )
    job_rows = [(TASK, job, "open"), (TASK, done, "finished")]
    conninfo = backend.conninfo("m")
    if conninfo is None:
        with sqlite3.connect(backend.path("m")) as db:
            db.executemany(insert, old_rows)
            db.executemany(jobs_insert, job_rows)
    else:
        with psycopg.connect(conninfo) as conn:
            conn.cursor().executemany(insert.replace("?", "%s"), old_rows)
            conn.cursor().executemany(jobs_insert.replace("?", "%s"), job_rows)
    monkeypatch.undo()
    store = backend.store("m")
    assert (rows_of(store, "reports"), rows_of(store, "report_shares")) == (6, 6)
    assert store.report_counts(TASK, TP) == {
        3600: {"pending": 2, "in_job": 2, "aggregated": 1, "rejected": 1}
    }
    assert store.deferred_count(TASK) == 1
    assert store.unaggregated_count(TASK, 3600, 7200) == 4
    assert store.batch_reports(TASK, 0, 7200) == [report(i) for i in range(1, 7)]
    # The open job reads its reports whole, and finishes.
    assert store.job_reports(TASK, job) == [job_report(3), job_report(4)]
    store.finish_aggregation_job(
        TASK, job, {report(3).report_id: None, report(4).report_id: "x"}, [], MERGE
    )
    # An upload again is a duplicate; another report under a taken id is refused.
    assert store.put_reports(TASK, [(3600, report(5))]) == (0, 1)
    with pytest.raises(ReportIdTaken):
        store.put_reports(TASK, [(3600, replace(report(5), public_share=b"other"))])
    # The pending report goes into a job; the deferred one waits.
    assert store.create_aggregation_job(TASK, b"k" * 16, 10) == 1
    assert store.job_reports(TASK, b"k" * 16) == [job_report(1)]
    assert store.report_counts(TASK, TP) == {
        3600: {"pending": 1, "in_job": 1, "aggregated": 2, "rejected": 2}
    }
    # Garbage collection takes both rows of each done report.
    assert store.collect_garbage(TASK, TP, 7200, None).reports == 4
    assert (rows_of(store, "reports"), rows_of(store, "report_shares")) == (2, 2)


def job_index(store: Datastore) -> str:
    """How reports_job is defined, in the database's own words."""
    sql = (
        "SELECT sql FROM sqlite_master WHERE name = 'reports_job'"
        if isinstance(store, SqliteDatastore)
        else "SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema()"
        " AND indexname = 'reports_job'"
    )
    row = store._read(lambda tx: tx.one(sql))
    assert row is not None
    return str(row[0])


def test_reports_job_holds_only_reports_with_a_job_after_migrating(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database at the schema before the partial reports_job (version 8),
    holding reports pending, deferred, in an open job and aggregated,
    migrates: the index now leaves out the reports without a job, and every
    look-up by job (a job's reports, finishing it, a new job, garbage
    collection of finished jobs) finds what it found before."""
    monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS[:8])
    monkeypatch.setattr(postgres_backend, "MIGRATIONS", MIGRATIONS[:8])
    # Reports read as before their tokens were stored (migration 10).
    monkeypatch.setattr(
        report_units, "_REPORT_COLS", "report_id, time, public_share, leader_ct, helper_ct"
    )
    old = backend.store("m")
    assert "WHERE" not in job_index(old)
    old.put_reports(TASK, [(3600, report(i)) for i in range(1, 6)])
    old.create_aggregation_job(TASK, b"d" * 16, 1)
    old.finish_aggregation_job(TASK, b"d" * 16, {report(1).report_id: None}, [], MERGE)
    old.create_aggregation_job(TASK, b"j" * 16, 2)
    old.create_aggregation_job(TASK, b"e" * 16, 1)
    old.finish_aggregation_job(TASK, b"e" * 16, {}, [], MERGE, {report(4).report_id: 1e9})
    old.close()
    monkeypatch.undo()
    store = backend.store("m")
    assert "job_id IS NOT NULL" in job_index(store)
    assert store.report_counts(TASK, TP) == {3600: {"pending": 2, "in_job": 2, "aggregated": 1}}
    assert store.job_reports(TASK, b"j" * 16) == [job_report(2), job_report(3)]
    assert store.job_reports(TASK, b"e" * 16) == []  # its report was sent back, deferred
    store.finish_aggregation_job(
        TASK, b"j" * 16, {report(2).report_id: None, report(3).report_id: "x"}, [], MERGE
    )
    # The one pending report that is not deferred goes into a new job.
    assert store.create_aggregation_job(TASK, b"k" * 16, 10) == 1
    assert store.job_reports(TASK, b"k" * 16) == [job_report(5)]
    # Finished jobs without reports left are collected; jobs with reports stay.
    assert store.collect_garbage(TASK, TP, 7200, None).reports == 3
    left = {job for _, job in store.open_aggregation_jobs()}
    assert left == {b"k" * 16}
    assert rows_of(store, "aggregation_jobs") == 1


def test_sqlite_finds_a_job_through_the_partial_index(tmp_path: Path) -> None:
    """Every statement that looks reports up by job id (a job's reports,
    its aggregated reports when it finishes, garbage collection's test for a
    finished job's last report) uses
    reports_job, which holds only reports with a job: the test `job_id = ?`
    is what lets SQLite use a partial index, so a reworded statement that
    lost it would read every report of the task instead."""
    store = SqliteDatastore(tmp_path / "plan.db")
    db = store._conn()
    store.put_reports(TASK, [(3600, report(i)) for i in range(4)])
    store.create_aggregation_job(TASK, b"j" * 16, 2)
    statements: list[str] = []
    db.set_trace_callback(statements.append)
    ids = [r.report_id for r in store.job_reports(TASK, b"j" * 16)]
    store.finish_aggregation_job(TASK, b"j" * 16, dict.fromkeys(ids), [], MERGE)
    store.collect_garbage(TASK, TP, 7200, None)
    db.set_trace_callback(None)
    by_job = [
        q
        for q in statements
        if "r.job_id = aggregation_jobs.job_id" in q
        or (q.lstrip().startswith("SELECT") and "report_shares" in q and "job_id = " in q)
        or (q.lstrip().startswith("UPDATE reports") and " AND job_id = " in q)
    ]
    assert len(by_job) == 3, statements
    for sql in by_job:
        plan = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + sql).fetchall()]
        assert any("INDEX reports_job (task_id=? AND job_id=?)" in s for s in plan), (sql, plan)
    store.close()


# --- Poplar1 queries (prefix_queries, prefix_reports) -------------------------


def query(level: int, start: int = 0, duration: int = 3600, by: bytes | None = None) -> PrefixQuery:
    return PrefixQuery(TASK, start, duration, level, bytes([level]), collected_by=by)


def test_prefix_query_recorded_once_per_level_and_batch(store: Datastore) -> None:
    seen: list[list[int]] = []

    def check(previous: list[PrefixQuery]) -> None:
        seen.append([q.level for q in previous])

    assert store.record_prefix_query(query(7), check, 3600) == query(7)
    # The same (batch, level) again: the stored query, the check not run.
    assert store.record_prefix_query(replace(query(7), agg_param=b"x"), check, 3600) == query(7)
    store.record_prefix_query(query(15), check, 3600)
    assert seen == [[], [7]]
    assert [q.level for q in store.prefix_queries(TASK, 0, 3600)] == [7, 15]
    # An overlapping batch is refused; a refused check records nothing.
    with pytest.raises(QueryConflict):
        store.record_prefix_query(query(7, 0, 7200), check, 3600)

    def refuse(previous: list[PrefixQuery]) -> None:
        raise ValueError("no")

    with pytest.raises(ValueError):
        store.record_prefix_query(query(23), refuse, 3600)
    assert store.prefix_query(TASK, 0, 23) is None
    # The batch's buckets are closed to Prio3 uploads and collections.
    with pytest.raises(BucketCollected):
        store.close_batch(TASK, 0, 3600, b"c" * 16, 3600)


def test_prefix_job_commits_once_and_reports_once_per_level(store: Datastore) -> None:
    store.record_prefix_query(query(7), lambda _: None, 3600)
    delta = BatchAggregate(0, share(3), 1, b"c" * 32)
    job = HelperJob(TASK, b"j" * 16, b"h" * 32, b"resp", [(b"r" * 16, 0)], [], [delta])
    assert store.commit_prefix_job(job, 0, 7, MERGE) is None
    assert store.commit_prefix_job(replace(job, response=b"x"), 0, 7, MERGE) == (
        b"h" * 32,
        b"resp",
    )
    with pytest.raises(ReportsAggregated):
        store.commit_prefix_job(replace(job, job_id=b"k" * 16), 0, 7, MERGE)
    assert store.seen_prefix_reports(TASK, 0, 7, [b"r" * 16, b"s" * 16]) == {b"r" * 16}
    # Another level takes the same report.
    store.record_prefix_query(query(15), lambda _: None, 3600)
    assert store.seen_prefix_reports(TASK, 0, 15, [b"r" * 16]) == set()
    stored = store.prefix_query(TASK, 0, 7)
    assert stored is not None and (stored.agg_share, stored.report_count) == (share(3), 1)
    # Released once: then no job adds to it, and no other collection takes it.
    record = CollectionRecord(
        TASK, b"c" * 16, 0, 3600, "finished", 1, b"c" * 32, None, CT, agg_param=bytes([7])
    )
    assert store.collect_prefix_query(record, 7) == record
    assert store.get_collection(TASK, b"c" * 16) == record
    with pytest.raises(QueryCollected):
        store.commit_prefix_job(replace(job, job_id=b"m" * 16, reports=[]), 0, 7, MERGE)
    with pytest.raises(QueryCollected):
        store.collect_prefix_query(replace(record, job_id=b"d" * 16), 7)
    with pytest.raises(BatchChanged):
        store.collect_prefix_query(replace(record, job_id=b"e" * 16, report_count=2), 15)


def test_leader_prefix_collection_claims_its_level(store: Datastore) -> None:
    record = CollectionRecord(TASK, b"c" * 16, 0, 3600, "pending", agg_param=bytes([7]))
    made = store.create_prefix_collection(record, query(7, by=b"c" * 16), lambda _: None, 3600)
    assert made == record
    assert store.create_prefix_collection(record, query(7, by=b"c" * 16), lambda _: None, 3600)
    other = replace(record, job_id=b"d" * 16)
    with pytest.raises(QueryCollected):
        store.create_prefix_collection(other, query(7, by=b"d" * 16), lambda _: None, 3600)
    with pytest.raises(StorageConflict):
        store.create_prefix_collection(
            replace(record, agg_param=b"x"), query(7, by=b"c" * 16), lambda _: None, 3600
        )
    done = replace(record, state="finished", report_count=4, leader_ct=CT, helper_ct=CT)
    store.finish_prefix_collection(done, 7, share(4))
    assert store.get_collection(TASK, b"c" * 16) == done
    stored = store.prefix_query(TASK, 0, 7)
    assert stored is not None and (stored.agg_share, stored.report_count) == (share(4), 4)


# --- garbage collection of Poplar1 state -------------------------------------

LAST = 15  # the last level of a 16-bit Poplar1 task


def _leader_level(store: Datastore, level: int, job: bytes, state: str = "finished") -> None:
    record = CollectionRecord(TASK, job, 0, 3600, "pending", agg_param=bytes([level]))
    store.create_prefix_collection(record, query(level, by=job), lambda _: None, 3600)
    if state == "finished":
        done = replace(record, state="finished", report_count=2, leader_ct=CT, helper_ct=CT)
        store.finish_prefix_collection(done, level, share(2))
    else:
        store.fail_collection(replace(record, state="failed"), reopen=False)


def _leader_batch(store: Datastore) -> None:
    # Batch [0, 3600) holds two reports; a report of the next hour is outside it.
    store.put_reports(TASK, [(0, report(1, 10)), (0, report(2, 20)), (3600, report(3, 3700))])


def test_gc_keeps_a_poplar1_batch_while_a_level_may_follow(store: Datastore) -> None:
    _leader_batch(store)
    _leader_level(store, 7, b"c" * 16)
    # No expiry, level 7 of 16 bits released: the next levels need the reports.
    result = store.collect_garbage(TASK, TP, None, None, LAST)
    assert result.total() == 0
    assert store.report_counts(TASK, TP) == {0: {"pending": 2}, 3600: {"pending": 1}}
    # A Prio3 pass (no last level) never deletes a pending report either.
    assert store.collect_garbage(TASK, TP, None, None).total() == 0


def test_gc_frees_a_done_poplar1_batch_and_keeps_its_query_records(store: Datastore) -> None:
    _leader_batch(store)
    _leader_level(store, 7, b"c" * 16)
    _leader_level(store, LAST, b"d" * 16)
    result = store.collect_garbage(TASK, TP, None, None, LAST)
    # The batch's reports go; the other hour's stay; the records that refuse
    # every level of the batch again stay, with their collections.
    assert (result.reports, result.total()) == (2, 2)
    assert store.report_counts(TASK, TP) == {3600: {"pending": 1}}
    assert store.batch_reports(TASK, 0, 7200) == [report(3, 3700)]
    assert rows_of(store, "report_shares") == 1
    assert [q.level for q in store.prefix_queries(TASK, 0, 3600)] == [7, LAST]
    assert {c.job_id for c in store.collections(TASK)} == {b"c" * 16, b"d" * 16}
    with pytest.raises(QueryCollected):
        _leader_level(store, 7, b"e" * 16)


def test_gc_frees_a_poplar1_batch_whose_level_failed(store: Datastore) -> None:
    _leader_batch(store)
    _leader_level(store, 7, b"c" * 16, state="failed")
    assert store.collect_garbage(TASK, TP, None, None, LAST).reports == 2
    assert store.prefix_query(TASK, 0, 7) is not None


def test_gc_deletes_poplar1_query_records_with_their_collections_and_reports(
    store: Datastore,
) -> None:
    _leader_batch(store)
    _leader_level(store, 7, b"c" * 16)
    # Horizon 3600: the batch ends there. Its reports, query records and
    # collections go in the one transaction; the next hour's report stays.
    result = store.collect_garbage(TASK, TP, 3600, None, LAST)
    assert (result.reports, result.prefix_queries, result.collections) == (2, 1, 1)
    assert store.prefix_queries(TASK, 0, 3600) == []
    assert store.get_collection(TASK, b"c" * 16) is None
    assert store.report_counts(TASK, TP) == {3600: {"pending": 1}}


def test_gc_never_leaves_a_released_level_without_its_query_record(store: Datastore) -> None:
    # The helper's side: while the collection that released a level is kept
    # (it answers a retried request with the same bytes), so is the query
    # record saying the level was released; once the collection goes, the
    # query record goes in the same transaction.
    store.record_prefix_query(query(7), lambda _: None, 3600)
    delta = BatchAggregate(0, share(3), 1, b"c" * 32)
    job = HelperJob(TASK, b"j" * 16, b"h" * 32, b"resp", [(b"r" * 16, 10)], [], [delta])
    assert store.commit_prefix_job(job, 0, 7, MERGE) is None
    released = CollectionRecord(
        TASK, b"c" * 16, 0, 3600, "finished", 1, b"c" * 32, None, CT, agg_param=bytes([7])
    )
    for horizon in (None, 1800, 3600):
        store.collect_garbage(TASK, TP, horizon, None, LAST)
        kept = store.prefix_query(TASK, 0, 7) is not None
        assert kept == (store.get_collection(TASK, b"c" * 16) is not None or horizon is None)
        if horizon is None:
            store.collect_prefix_query(released, 7)
    assert store.prefix_query(TASK, 0, 7) is None
    assert store.get_collection(TASK, b"c" * 16) is None


def test_gc_helper_prefix_replay_records_and_jobs(store: Datastore) -> None:
    store.record_prefix_query(query(7), lambda _: None, 3600)
    delta = BatchAggregate(0, share(3), 1, b"c" * 32)
    job = HelperJob(TASK, b"j" * 16, b"h" * 32, b"resp", [(b"r" * 16, 10)], [], [delta])
    store.commit_prefix_job(job, 0, 7, MERGE)
    # Level 7 not released yet: its replay records and the job's record stay
    # (a retried job gets its stored answer, not "replayed" for each report).
    assert store.collect_garbage(TASK, TP, None, None, LAST).total() == 0
    assert store.helper_job(TASK, b"j" * 16) == (b"h" * 32, b"resp")
    released = CollectionRecord(
        TASK, b"c" * 16, 0, 3600, "finished", 1, b"c" * 32, None, CT, agg_param=bytes([7])
    )
    store.collect_prefix_query(released, 7)
    # Released: no job is taken at level 7 any more, so its replay records
    # and job records go; the query record stays and refuses the level.
    result = store.collect_garbage(TASK, TP, None, None, LAST)
    assert (result.prefix_reports, result.helper_jobs) == (1, 1)
    assert store.seen_prefix_reports(TASK, 0, 7, [b"r" * 16]) == set()
    with pytest.raises(QueryCollected):
        store.commit_prefix_job(replace(job, job_id=b"k" * 16), 0, 7, MERGE)
