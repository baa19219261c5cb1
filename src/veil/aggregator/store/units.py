"""Units of work, written once for both backends (see veil.aggregator.store.tx).

Each function runs inside one transaction the backend opened (and, on
PostgreSQL, runs again from the start after a serialization failure), so a
unit either commits whole or not at all. The contract each one keeps is the
`Datastore` protocol's (veil.aggregator.storage).
"""

from __future__ import annotations

import time as _time
from collections import Counter
from collections.abc import Sequence

from veil.aggregator.store.records import (
    COLLECTION_COLS,
    BatchAggregate,
    BucketCollected,
    CollectionRecord,
    HelperJob,
    ReportsAggregated,
    ShareMerge,
    aggregate_from_row,
    check_batch_unchanged,
    collection_from_row,
    collection_values,
    merge_aggregate,
)
from veil.aggregator.store.tx import Tx

_AGGREGATE_COLS = "bucket, agg_share, report_count, checksum, collected_by"


def seen_reports(tx: Tx, task_id: bytes, report_ids: Sequence[bytes]) -> set[bytes]:
    """Which of the ids have a helper replay record (one query per id list)."""
    seen: set[bytes] = set()
    for where, args in tx.id_lists("report_id", report_ids):
        seen.update(
            bytes(r[0])
            for r in tx.rows(
                f"SELECT report_id FROM helper_reports WHERE task_id = ? AND {where}",
                (task_id, *args),
            )
        )
    return seen


def helper_job(tx: Tx, task_id: bytes, job_id: bytes) -> tuple[bytes, bytes] | None:
    row = tx.one(
        "SELECT request_hash, response FROM helper_jobs WHERE task_id = ? AND job_id = ?",
        (task_id, job_id),
    )
    return None if row is None else (bytes(row[0]), bytes(row[1]))


def get_collection(tx: Tx, task_id: bytes, job_id: bytes) -> CollectionRecord | None:
    row = tx.one(
        f"SELECT {COLLECTION_COLS} FROM collections WHERE task_id = ? AND job_id = ?",
        (task_id, job_id),
    )
    return None if row is None else collection_from_row(row)


def batch_aggregates(tx: Tx, task_id: bytes, start: int, end: int) -> list[BatchAggregate]:
    """The batch's rows, oldest bucket first, without rows that hold nothing
    (made only to be locked)."""
    rows = tx.rows(
        f"SELECT {_AGGREGATE_COLS} FROM batch_aggregates WHERE task_id = ? AND bucket >= ?"
        " AND bucket < ? AND (report_count > 0 OR collected_by IS NOT NULL) ORDER BY bucket",
        (task_id, start, end),
    )
    return [aggregate_from_row(r) for r in rows]


def count_rejections(tx: Tx, task_id: bytes, reasons: Sequence[str]) -> None:
    tx.many(
        "INSERT INTO rejections VALUES (?, ?, ?) ON CONFLICT (task_id, reason)"
        " DO UPDATE SET count = rejections.count + excluded.count",
        [(task_id, reason, n) for reason, n in sorted(Counter(reasons).items())],
    )


def merge_aggregates(
    tx: Tx,
    task_id: bytes,
    deltas: Sequence[BatchAggregate],
    merge: ShareMerge,
    refuse_collected: bool = False,
) -> None:
    """Add each delta to its bucket's row, read and written under the row's lock.

    `refuse_collected`: raise BucketCollected for a collected bucket (the
    helper's jobs; the leader's jobs still add to a bucket closed while they
    held its reports, see merge_aggregate)."""
    # In bucket order, so two jobs over the same buckets cannot deadlock.
    for d in sorted(deltas, key=lambda a: a.bucket):
        # Make the row if missing, so there is always a row to lock. ON
        # CONFLICT: on PostgreSQL a row another transaction made meanwhile
        # makes this one fail to serialise (and run again), never a
        # duplicate-key error.
        tx.run(
            "INSERT INTO batch_aggregates VALUES (?, ?, NULL, 0, ?, NULL) ON CONFLICT DO NOTHING",
            (task_id, d.bucket, bytes(32)),
        )
        row = tx.one(
            f"SELECT {_AGGREGATE_COLS} FROM batch_aggregates WHERE task_id = ? AND bucket = ?"
            + tx.for_update,
            (task_id, d.bucket),
        )
        assert row is not None
        old = aggregate_from_row(row)
        if refuse_collected and old.collected_by is not None:
            raise BucketCollected(d.bucket)
        new = merge_aggregate(old, d, merge)
        tx.run(
            "UPDATE batch_aggregates SET agg_share = ?, report_count = ?, checksum = ?"
            " WHERE task_id = ? AND bucket = ?",
            (new.agg_share, new.report_count, new.checksum, task_id, new.bucket),
        )


def close_batch(tx: Tx, task_id: bytes, start: int, end: int, job_id: bytes, step: int) -> None:
    """Mark every bucket of [start, end) collected by `job_id` (idempotent for
    that job); BucketCollected if another job collected one of them."""
    tx.many(
        "INSERT INTO batch_aggregates VALUES (?, ?, NULL, 0, ?, ?) ON CONFLICT DO NOTHING",
        [(task_id, b, bytes(32), job_id) for b in range(start, end, step)],
    )
    for bucket, collected_by in tx.rows(
        "SELECT bucket, collected_by FROM batch_aggregates WHERE task_id = ?"
        " AND bucket >= ? AND bucket < ? ORDER BY bucket" + tx.for_update,
        (task_id, start, end),
    ):
        if collected_by is not None and bytes(collected_by) != job_id:
            raise BucketCollected(int(bucket))
    tx.run(
        "UPDATE batch_aggregates SET collected_by = ? WHERE task_id = ?"
        " AND bucket >= ? AND bucket < ? AND collected_by IS NULL",
        (job_id, task_id, start, end),
    )


def commit_helper_job(tx: Tx, job: HelperJob, merge: ShareMerge) -> tuple[bytes, bytes] | None:
    """The helper's whole job in one transaction (see Datastore.commit_helper_job).

    Two processes committing the same job id, or jobs sharing a report id,
    meet on a primary key: on PostgreSQL, ON CONFLICT DO NOTHING at
    REPEATABLE READ makes the later one fail to serialise, and its retry finds
    the winner's rows in the checks below; on SQLite the write lock orders
    them. No process-local lock is involved."""
    task_id, job_id = job.task_id, job.job_id
    stored = helper_job(tx, task_id, job_id)
    if stored is not None:
        return stored
    taken = seen_reports(tx, task_id, [i for i, _ in job.reports])
    if taken:
        raise ReportsAggregated(sorted(taken))
    tx.run(
        "INSERT INTO helper_jobs (task_id, job_id, request_hash, response, created)"
        " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        (task_id, job_id, job.request_hash, job.response, _time.time()),
    )
    tx.many(
        "INSERT INTO helper_reports (task_id, report_id, time, job_id) VALUES (?, ?, ?, ?)"
        " ON CONFLICT DO NOTHING",
        [(task_id, i, t, job_id) for i, t in job.reports],
    )
    count_rejections(tx, task_id, job.rejected)
    merge_aggregates(tx, task_id, job.deltas, merge, refuse_collected=True)
    return None


def commit_helper_collection(tx: Tx, record: CollectionRecord, step: int) -> CollectionRecord:
    """Close the batch and store the sealed, noised share, in one transaction
    (see Datastore.commit_helper_collection)."""
    stored = get_collection(tx, record.task_id, record.job_id)
    if stored is not None:
        return stored
    end = record.start + record.duration
    close_batch(tx, record.task_id, record.start, end, record.job_id, step)
    check_batch_unchanged(batch_aggregates(tx, record.task_id, record.start, end), record)
    # ON CONFLICT: another process storing this job meanwhile makes this one
    # fail to serialise on PostgreSQL; its retry returns the stored record.
    tx.run(
        f"INSERT INTO collections ({COLLECTION_COLS}, created)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        (*collection_values(record), _time.time()),
    )
    return record
