"""Units of work of Poplar1's prefix queries (both roles), written once for
both backends over veil.aggregator.store.tx: a batch's queries and the
draft's rule across them, the collection that runs one, its jobs' merges
into a query's counts, and the collection of a level. One transaction each,
as in veil.aggregator.store.reports.
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable, Sequence

from veil.aggregator.store.collection_jobs import get_collection, update_collection
from veil.aggregator.store.jobs import helper_job, insert_helper_job
from veil.aggregator.store.records import (
    COLLECTION_COLS,
    COLLECTION_PLACEHOLDERS,
    PREFIX_QUERY_COLS,
    BatchAggregate,
    BatchChanged,
    CollectionRecord,
    HelperJob,
    PrefixQuery,
    QueryCollected,
    QueryConflict,
    ReportsAggregated,
    ShareMerge,
    StorageConflict,
    collection_values,
    merge_aggregate,
    prefix_query_from_row,
)
from veil.aggregator.store.reports import close_batch, count_rejections
from veil.aggregator.store.tx import Tx

# What closes a Poplar1 batch's buckets on its first query (close_batch): no
# upload or Prio3 job may add to them after, and garbage collection, which
# looks for a finished collection under this id, keeps their reports for the
# later levels.
PREFIX_BATCH_MARK = bytes.fromhex("706f706c617231206261746368000000")


def prefix_queries(tx: Tx, task_id: bytes, start: int, end: int) -> list[PrefixQuery]:
    """The queries of every batch overlapping [start, end), by batch and level."""
    rows = tx.rows(
        f"SELECT {PREFIX_QUERY_COLS} FROM prefix_queries WHERE task_id = ? AND start < ?"
        " AND start + duration > ? ORDER BY start, level",
        (task_id, end, start),
    )
    return [prefix_query_from_row(r) for r in rows]


def record_prefix_query(
    tx: Tx,
    query: PrefixQuery,
    check: Callable[[list[PrefixQuery]], None],
    step: int,
) -> PrefixQuery:
    """Record a Poplar1 batch's query at a level, or return the one stored for
    that (batch, level) (the caller compares the parameters). QueryConflict if
    the batch overlaps another queried batch; `check` raises on a parameter
    the batch's earlier queries (in level order) do not allow. The first query
    of a batch closes its buckets (PREFIX_BATCH_MARK)."""
    # The bucket lock rows first, so that two first queries of one batch wait
    # for each other, and uploads into the batch wait for this one.
    close_batch(tx, query.task_id, query.start, query.end, PREFIX_BATCH_MARK, step)
    known = prefix_queries(tx, query.task_id, query.start, query.end)
    for q in known:
        if (q.start, q.duration) != (query.start, query.duration):
            raise QueryConflict(
                f"the batch [{query.start}, +{query.duration}) overlaps the batch"
                f" [{q.start}, +{q.duration}), already queried: a report is queried in one"
                " batch only"
            )
        if q.level == query.level:
            return q
    check(known)
    tx.run(
        f"INSERT INTO prefix_queries ({PREFIX_QUERY_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            query.task_id,
            query.start,
            query.duration,
            query.level,
            query.agg_param,
            None,
            0,
            bytes(32),
            query.collected_by,
        ),
    )
    return query


def create_prefix_collection(
    tx: Tx,
    record: CollectionRecord,
    query: PrefixQuery,
    check: Callable[[list[PrefixQuery]], None],
    step: int,
) -> CollectionRecord:
    """The leader's new Poplar1 collection job and its query, in one
    transaction; returns the stored job if its id is known (StorageConflict
    if for another batch or parameter). The query is recorded as collected by
    this job: QueryCollected if the (batch, level) already has a collection."""
    old = get_collection(tx, record.task_id, record.job_id)
    if old is not None:
        if (old.start, old.duration, old.agg_param) != (
            record.start,
            record.duration,
            record.agg_param,
        ):
            raise StorageConflict("collection job id reused for another batch or parameter")
        return old
    stored = record_prefix_query(tx, query, check, step)
    if stored.collected_by != record.job_id:
        raise QueryCollected(
            f"level {query.level} of the batch [{query.start}, +{query.duration}) was already"
            " collected (or is being collected) by another collection job: a batch is"
            " collected once per level"
        )
    tx.run(
        f"INSERT INTO collections ({COLLECTION_COLS}, created) VALUES ({COLLECTION_PLACEHOLDERS})",
        (*collection_values(record), _time.time()),
    )
    return record


def total_prefix_query(
    tx: Tx, record: CollectionRecord, level: int, agg_share: bytes | None
) -> None:
    """The leader's sum of a Poplar1 level (the record's count and checksum)
    in the row of the query its collection job holds."""
    tx.run(
        "UPDATE prefix_queries SET agg_share = ?, report_count = ?, checksum = ?"
        " WHERE task_id = ? AND start = ? AND level = ? AND collected_by = ?",
        (
            agg_share,
            record.report_count,
            record.checksum,
            record.task_id,
            record.start,
            level,
            record.job_id,
        ),
    )


def finish_prefix_collection(
    tx: Tx, record: CollectionRecord, level: int, agg_share: bytes | None
) -> None:
    """The leader's finished Poplar1 collection: its sum in the query's row and
    the job's record (update_collection's checks), in one transaction."""
    total_prefix_query(tx, record, level, agg_share)
    update_collection(tx, record)


def prefix_query(tx: Tx, task_id: bytes, start: int, level: int) -> PrefixQuery | None:
    row = tx.one(
        f"SELECT {PREFIX_QUERY_COLS} FROM prefix_queries WHERE task_id = ? AND start = ?"
        " AND level = ?",
        (task_id, start, level),
    )
    return None if row is None else prefix_query_from_row(row)


def seen_prefix_reports(
    tx: Tx, task_id: bytes, start: int, level: int, report_ids: Sequence[bytes]
) -> set[bytes]:
    """Which of the ids were aggregated at this (batch, level) already."""
    seen: set[bytes] = set()
    for where, args in tx.id_lists("report_id", report_ids):
        seen.update(
            bytes(r[0])
            for r in tx.rows(
                "SELECT report_id FROM prefix_reports WHERE task_id = ? AND start = ?"
                f" AND level = ? AND {where}",
                (task_id, start, level, *args),
            )
        )
    return seen


def asked_prefix_reports(tx: Tx, task_id: bytes, start: int, level: int) -> int:
    """How many reports this (batch, level) verified, accepted or rejected:
    its replay records (the helper's floor counts these, not the accepted)."""
    row = tx.one(
        "SELECT COUNT(*) FROM prefix_reports WHERE task_id = ? AND start = ? AND level = ?",
        (task_id, start, level),
    )
    return 0 if row is None else int(row[0])


def commit_prefix_job(
    tx: Tx, job: HelperJob, start: int, level: int, merge: ShareMerge
) -> tuple[bytes, bytes] | None:
    """The helper's second Poplar1 round in one transaction: the job record,
    a replay record per (batch, level, report) it aggregated, the rejection
    counts, and the job's sum added to the query's. Returns the stored
    (request_hash, response) if the job id is already stored (nothing
    written); ReportsAggregated if a report was aggregated at this level by
    another job; QueryCollected if the level was released meanwhile."""
    task_id, job_id = job.task_id, job.job_id
    stored = helper_job(tx, task_id, job_id)
    if stored is not None:
        return stored
    row = tx.one(
        f"SELECT {PREFIX_QUERY_COLS} FROM prefix_queries WHERE task_id = ? AND start = ?"
        " AND level = ?" + tx.for_update,
        (task_id, start, level),
    )
    if row is None:
        raise QueryConflict(f"no query of the batch at {start} at level {level}")
    query = prefix_query_from_row(row)
    if query.collected_by is not None:
        raise QueryCollected(f"level {level} of the batch at {start} was already collected")
    taken = seen_prefix_reports(tx, task_id, start, level, [i for i, _ in job.reports])
    if taken:
        raise ReportsAggregated(sorted(taken))
    insert_helper_job(tx, job)
    tx.many(
        "INSERT INTO prefix_reports (task_id, start, level, report_id) VALUES (?, ?, ?, ?)",
        [(task_id, start, level, i) for i, _ in job.reports],
    )
    count_rejections(tx, task_id, job.rejected)
    add_to_query(tx, query, job.deltas, merge)
    return None


def add_to_query(
    tx: Tx, query: PrefixQuery, deltas: Sequence[BatchAggregate], merge: ShareMerge
) -> None:
    """Add job sums to a query's row (the row is locked by the caller)."""
    total = BatchAggregate(0, query.agg_share, query.report_count, query.checksum)
    for d in deltas:
        total = merge_aggregate(total, d, merge)
    tx.run(
        "UPDATE prefix_queries SET agg_share = ?, report_count = ?, checksum = ?"
        " WHERE task_id = ? AND start = ? AND level = ?",
        (
            total.agg_share,
            total.report_count,
            total.checksum,
            query.task_id,
            query.start,
            query.level,
        ),
    )


def collect_prefix_query(tx: Tx, record: CollectionRecord, level: int) -> CollectionRecord:
    """The helper's release of one (batch, level): mark the query collected
    by the record's job and store the record, in one transaction; returns the
    stored record (another process's, if it stored one first). QueryCollected
    if another collection released the level; BatchChanged if the query's
    count or checksum is no longer the record's."""
    stored = get_collection(tx, record.task_id, record.job_id)
    if stored is not None:
        return stored
    row = tx.one(
        f"SELECT {PREFIX_QUERY_COLS} FROM prefix_queries WHERE task_id = ? AND start = ?"
        " AND level = ?" + tx.for_update,
        (record.task_id, record.start, level),
    )
    if row is None:
        raise QueryConflict(f"no query of the batch at {record.start} at level {level}")
    query = prefix_query_from_row(row)
    if query.collected_by not in (None, record.job_id):
        raise QueryCollected(f"level {level} of this batch was already collected")
    if (query.report_count, query.checksum) != (record.report_count, record.checksum):
        raise BatchChanged(
            f"the query now holds {query.report_count} reports, not the"
            f" {record.report_count} its share was computed from"
        )
    tx.run(
        "UPDATE prefix_queries SET collected_by = ? WHERE task_id = ? AND start = ? AND level = ?",
        (record.job_id, record.task_id, record.start, level),
    )
    tx.run(
        f"INSERT INTO collections ({COLLECTION_COLS}, created) VALUES ({COLLECTION_PLACEHOLDERS})",
        (*collection_values(record), _time.time()),
    )
    return record
