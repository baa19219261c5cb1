"""The Datastore contract, run against the SQLite backend (a new backend reuses these)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from veil.aggregator.storage import (
    BatchAggregate,
    CollectionRecord,
    Datastore,
    SqliteDatastore,
    StorageConflict,
    StoredReport,
)
from veil.hpke import Ciphertext, generate_keypair

TASK = b"t" * 32
CT = Ciphertext(1, b"e" * 32, b"payload")


def report(i: int, time: int = 3600) -> StoredReport:
    return StoredReport(i.to_bytes(16, "big"), time, b"ps", CT, CT)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Datastore]:
    s = SqliteDatastore(tmp_path / "s.db")
    yield s
    s.close()


def test_reports_all_or_nothing_and_duplicates(store: Datastore) -> None:
    assert store.put_reports(TASK, [(3600, report(1)), (3600, report(2))]) == (2, 0)
    assert store.put_reports(TASK, [(3600, report(1)), (3600, report(3))]) == (1, 1)
    changed = StoredReport(report(4).report_id, 3600, b"other", CT, CT)
    with pytest.raises(StorageConflict):
        store.put_reports(
            TASK, [(3600, report(4)), (3600, StoredReport(report(1).report_id, 3600, b"x", CT, CT))]
        )
    assert store.put_reports(TASK, [(3600, changed)]) == (1, 0)  # report 4 was not written before
    assert store.unaggregated_count(TASK, 0, 7200) == 4


def test_jobs_and_aggregates(store: Datastore) -> None:
    store.put_reports(TASK, [(3600, report(i)) for i in range(5)])
    assert store.create_aggregation_job(TASK, b"j" * 16, 3) == 3
    assert store.create_aggregation_job(TASK, b"k" * 16, 3) == 2
    assert store.create_aggregation_job(TASK, b"l" * 16, 3) == 0
    assert store.open_aggregation_jobs() == [(TASK, b"j" * 16), (TASK, b"k" * 16)]
    ids = [r.report_id for r in store.job_reports(TASK, b"j" * 16)]
    agg = BatchAggregate(3600, b"share", 2, b"c" * 32)
    store.finish_aggregation_job(TASK, b"j" * 16, {ids[0]: None, ids[1]: None, ids[2]: "x"}, [agg])
    with pytest.raises(StorageConflict):
        store.finish_aggregation_job(TASK, b"j" * 16, {}, [])
    assert store.batch_aggregates(TASK, 0, 7200) == [agg]
    assert store.rejections(TASK) == {"x": 1}
    assert store.unaggregated_count(TASK, 0, 7200) == 2


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
    assert store.pending_collections() == []
    assert store.put_reports(TASK, [(3600, report(1))]) == (1, 0)


def test_helper_records(store: Datastore) -> None:
    store.commit_helper_job(TASK, b"j" * 16, b"h" * 32, b"resp", [b"r" * 16], ["bad"], [])
    assert store.helper_job(TASK, b"j" * 16) == (b"h" * 32, b"resp")
    assert store.seen_reports(TASK, [b"r" * 16, b"s" * 16]) == {b"r" * 16}
    record = CollectionRecord(TASK, b"c" * 16, 0, 3600, "finished", 1, b"x" * 32, None, CT)
    store.commit_helper_collection(record, 3600)
    assert store.helper_collection(TASK, b"c" * 16) == record
    assert store.batch_aggregates(TASK, 0, 3600)[0].collected_by == b"c" * 16


def test_hpke_keys_persist(tmp_path: Path) -> None:
    kp = generate_keypair(9)
    first = SqliteDatastore(tmp_path / "k.db")
    first.add_hpke_keypair(kp)
    first.close()
    second = SqliteDatastore(tmp_path / "k.db")
    assert second.hpke_keypairs() == [kp]
    second.close()
