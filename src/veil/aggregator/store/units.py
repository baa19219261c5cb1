"""Units of work, written once for both backends (see veil.aggregator.store.tx).

Each function runs inside one transaction the backend opened (and, on
PostgreSQL, runs again from the start after a serialization failure), so a
unit either commits whole or not at all. The contract each one keeps is the
`Datastore` class's (veil.aggregator.store.base).
"""

from __future__ import annotations

import time as _time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from veil.aggregator.store.records import (
    AGGREGATED,
    COLLECTION_COLS,
    COLLECTION_PLACEHOLDERS,
    IN_JOB,
    PENDING,
    PREFIX_QUERY_COLS,
    REJECTED,
    REPORT_STATE_NAMES,
    Backoff,
    BatchAggregate,
    BatchChanged,
    BucketCollected,
    CollectionRecord,
    HelperJob,
    PrefixQuery,
    QueryCollected,
    QueryConflict,
    ReportIdTaken,
    ReportsAggregated,
    ShareMerge,
    StorageConflict,
    aggregate_from_row,
    aggregate_shard,
    check_batch_unchanged,
    collection_from_row,
    collection_values,
    merge_aggregate,
    prefix_query_from_row,
)
from veil.aggregator.store.tx import Tx
from veil.messages import Ciphertext, Report

# The reason a pending report carries while it waits for the helper's clock.
TOO_EARLY = "report_too_early"


def check_collection_update(
    stored_leader_ct: Ciphertext | None, stored_state: str, record: CollectionRecord
) -> None:
    """Refuse an update that would replace a stored leader share or revive a done job."""
    if stored_state != "pending":
        raise StorageConflict(f"collection job {record.job_id.hex()} is already {stored_state}")
    if stored_leader_ct is not None and record.leader_ct != stored_leader_ct:
        raise StorageConflict(
            f"collection job {record.job_id.hex()} already holds another leader share"
        )


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
    """The batch's shard rows, oldest bucket first and shard 0 (the lock row,
    the only one that may say collected) first in each; without rows that
    hold nothing (made only to be locked). A bucket's rows add up to its
    aggregate (fold_shards)."""
    rows = tx.rows(
        f"SELECT {_AGGREGATE_COLS} FROM batch_aggregates WHERE task_id = ? AND bucket >= ?"
        " AND bucket < ? AND (report_count > 0 OR collected_by IS NOT NULL)"
        " ORDER BY bucket, shard",
        (task_id, start, end),
    )
    return [aggregate_from_row(r) for r in rows]


def make_aggregate_rows(
    tx: Tx, task_id: bytes, rows: Sequence[tuple[int, int]], collected_by: bytes | None = None
) -> None:
    """Make the (bucket, shard) rows that are missing, empty, so that there
    is a row to lock. ON CONFLICT: on PostgreSQL a row another transaction
    made meanwhile makes this one fail to serialise (and run again), never a
    duplicate-key error."""
    tx.many(
        "INSERT INTO batch_aggregates (task_id, bucket, shard, report_count, checksum,"
        " collected_by) VALUES (?, ?, ?, 0, ?, ?) ON CONFLICT DO NOTHING",
        [(task_id, bucket, shard, bytes(32), collected_by) for bucket, shard in rows],
    )


def count_rejections(tx: Tx, task_id: bytes, reasons: Sequence[str]) -> None:
    tx.many(
        "INSERT INTO rejections VALUES (?, ?, ?) ON CONFLICT (task_id, reason)"
        " DO UPDATE SET count = rejections.count + excluded.count",
        [(task_id, reason, n) for reason, n in sorted(Counter(reasons).items())],
    )


def merge_aggregates(
    tx: Tx,
    task_id: bytes,
    job_id: bytes,
    deltas: Sequence[BatchAggregate],
    merge: ShareMerge,
    refuse_collected: bool = False,
) -> None:
    """Add each delta to the job's shard row of its bucket (aggregate_shard),
    read and written under that row's lock: jobs on other shards of the
    bucket do not wait for this one.

    `refuse_collected`: raise BucketCollected for a collected bucket (the
    helper's jobs). Such a job also holds the bucket's lock row (shard 0)
    `FOR SHARE` until it commits, so that a collection closing the bucket
    (close_batch, `FOR UPDATE`) waits for it. The leader's jobs skip that:
    they still add to a bucket closed while they held its reports, and the
    leader's collection waits for those jobs by their reports' state
    (see merge_aggregate)."""
    shard = aggregate_shard(job_id)
    # In bucket order, so two jobs over the same buckets cannot deadlock.
    for d in sorted(deltas, key=lambda a: a.bucket):
        make_aggregate_rows(tx, task_id, [(d.bucket, 0), (d.bucket, shard)])
        if refuse_collected:
            lock = tx.one(
                "SELECT collected_by FROM batch_aggregates WHERE task_id = ? AND bucket = ?"
                " AND shard = 0" + tx.for_share,
                (task_id, d.bucket),
            )
            if lock is not None and lock[0] is not None:
                raise BucketCollected(d.bucket)
        row = tx.one(
            f"SELECT {_AGGREGATE_COLS} FROM batch_aggregates WHERE task_id = ? AND bucket = ?"
            " AND shard = ?" + tx.for_update,
            (task_id, d.bucket, shard),
        )
        assert row is not None
        new = merge_aggregate(aggregate_from_row(row), d, merge)
        tx.run(
            "UPDATE batch_aggregates SET agg_share = ?, report_count = ?, checksum = ?"
            " WHERE task_id = ? AND bucket = ? AND shard = ?",
            (new.agg_share, new.report_count, new.checksum, task_id, new.bucket, shard),
        )


def close_batch(tx: Tx, task_id: bytes, start: int, end: int, job_id: bytes, step: int) -> None:
    """Mark every bucket of [start, end) collected by `job_id` (idempotent for
    that job) on its lock row; BucketCollected if another job collected one
    of them. The lock rows are taken `FOR UPDATE`: this waits for uploads and
    helper jobs holding them, and holds off new ones until it commits."""
    make_aggregate_rows(tx, task_id, [(b, 0) for b in range(start, end, step)], job_id)
    for bucket, collected_by in tx.rows(
        "SELECT bucket, collected_by FROM batch_aggregates WHERE task_id = ?"
        " AND bucket >= ? AND bucket < ? AND shard = 0 ORDER BY bucket" + tx.for_update,
        (task_id, start, end),
    ):
        if collected_by is not None and bytes(collected_by) != job_id:
            raise BucketCollected(int(bucket))
    tx.run(
        "UPDATE batch_aggregates SET collected_by = ? WHERE task_id = ?"
        " AND bucket >= ? AND bucket < ? AND shard = 0 AND collected_by IS NULL",
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
    tx.insert_new(
        "helper_reports",
        (("task_id", "bytea"), ("report_id", "bytea"), ("time", "bigint"), ("job_id", "bytea")),
        [(task_id, i, t, job_id) for i, t in job.reports],
    )
    count_rejections(tx, task_id, job.rejected)
    merge_aggregates(tx, task_id, job_id, job.deltas, merge, refuse_collected=True)
    return None


def commit_helper_collection(tx: Tx, record: CollectionRecord, step: int) -> CollectionRecord:
    """Close the batch and store the sealed, noised share, in one transaction
    (see Datastore.commit_helper_collection).

    The batch is read after close_batch holds its lock rows, and must be
    read as it is then: a helper job that held a lock row while this waited
    has added to its own shard row, which a snapshot taken before the wait
    would not show. So on PostgreSQL this unit runs at READ COMMITTED
    (Datastore._write_fresh), where each statement sees what committed
    before it."""
    stored = get_collection(tx, record.task_id, record.job_id)
    if stored is not None:
        return stored
    end = record.start + record.duration
    close_batch(tx, record.task_id, record.start, end, record.job_id, step)
    check_batch_unchanged(batch_aggregates(tx, record.task_id, record.start, end), record)
    written = tx.run(
        f"INSERT INTO collections ({COLLECTION_COLS}, created)"
        f" VALUES ({COLLECTION_PLACEHOLDERS}) ON CONFLICT DO NOTHING",
        (*collection_values(record), _time.time()),
    )
    if written == 0:
        # Another process stored this job while this one waited for the lock rows.
        stored = get_collection(tx, record.task_id, record.job_id)
        assert stored is not None
        return stored
    return record


# --- reads for both roles and for status ------------------------------------


def rejections(tx: Tx, task_id: bytes) -> dict[str, int]:
    rows = tx.rows("SELECT reason, count FROM rejections WHERE task_id = ?", (task_id,))
    return {str(r): int(n) for r, n in rows}


def unaggregated_count(tx: Tx, task_id: bytes, start: int, end: int) -> int:
    row = tx.one(
        "SELECT count(*) FROM reports WHERE task_id = ? AND state IN (?, ?)"
        " AND time >= ? AND time < ?",
        (task_id, PENDING, IN_JOB, start, end),
    )
    assert row is not None
    return int(row[0])


def has_unaggregated(tx: Tx, task_id: bytes, start: int, end: int) -> bool:
    # One row of the reports_state index, where counting them all (above)
    # walks every pending report: 5.8 ms at 100,000 on PostgreSQL.
    row = tx.one(
        "SELECT 1 FROM reports WHERE task_id = ? AND state IN (?, ?)"
        " AND time >= ? AND time < ? LIMIT 1",
        (task_id, PENDING, IN_JOB, start, end),
    )
    return row is not None


def open_aggregation_jobs(tx: Tx) -> list[tuple[bytes, bytes]]:
    rows = tx.rows(
        "SELECT task_id, job_id FROM aggregation_jobs WHERE state = 'open' ORDER BY created"
    )
    return [(bytes(t), bytes(j)) for t, j in rows]


def job_reports(tx: Tx, task_id: bytes, job_id: bytes) -> list[Report]:
    # Sorted here, not by ORDER BY: without table statistics SQLite would
    # walk the primary key (every report of the task) to avoid a sort
    # instead of looking the job up in reports_job.
    rows = tx.rows(
        "SELECT report_id, time, public_share, leader_ct, helper_ct FROM reports"
        " WHERE task_id = ? AND job_id = ?",
        (task_id, job_id),
    )
    return [
        Report(
            bytes(i),
            int(t),
            bytes(p),
            Ciphertext.from_bytes(bytes(lc)),
            Ciphertext.from_bytes(bytes(hc)),
        )
        for i, t, p, lc, hc in sorted(rows, key=lambda r: bytes(r[0]))
    ]


def deferred_count(tx: Tx, task_id: bytes) -> int:
    """Pending reports that wait because the helper found them too early."""
    row = tx.one(
        "SELECT count(*) FROM reports WHERE task_id = ? AND state = ? AND reason = ?",
        (task_id, PENDING, TOO_EARLY),
    )
    assert row is not None
    return int(row[0])


def record_peer_clock(
    tx: Tx, peer: str, offset: float, uncertainty: float, measured: float
) -> None:
    tx.run(
        "INSERT INTO peer_clocks VALUES (?, ?, ?, ?) ON CONFLICT (peer) DO UPDATE SET"
        " offset_seconds = excluded.offset_seconds, uncertainty = excluded.uncertainty,"
        " measured = excluded.measured",
        (peer, offset, uncertainty, measured),
    )


def peer_clocks(tx: Tx) -> list[tuple[str, float, float, float]]:
    """(peer, offset, uncertainty, measured) of each peer, by address."""
    rows = tx.rows(
        "SELECT peer, offset_seconds, uncertainty, measured FROM peer_clocks ORDER BY peer"
    )
    return [(str(p), float(o), float(u), float(m)) for p, o, u, m in rows]


def aggregation_job_errors(tx: Tx, task_id: bytes) -> dict[bytes, tuple[str, int, str]]:
    """Jobs of a task that failed at least once: job id -> (state, failures, error)."""
    rows = tx.rows(
        "SELECT job_id, state, failures, error FROM aggregation_jobs WHERE task_id = ?"
        " AND error IS NOT NULL",
        (task_id,),
    )
    return {bytes(j): (str(st), int(n), str(e)) for j, st, n, e in rows}


def report_counts(tx: Tx, task_id: bytes, time_precision: int) -> dict[int, dict[str, int]]:
    rows = tx.rows(
        "SELECT time - time % ?, state, count(*) FROM reports WHERE task_id = ?"
        " GROUP BY 1, 2 ORDER BY 1",
        (time_precision, task_id),
    )
    out: dict[int, dict[str, int]] = {}
    for bucket, state, n in rows:
        out.setdefault(int(bucket), {})[REPORT_STATE_NAMES[int(state)]] = int(n)
    return out


def collections(tx: Tx, task_id: bytes) -> list[CollectionRecord]:
    rows = tx.rows(
        f"SELECT {COLLECTION_COLS} FROM collections WHERE task_id = ? ORDER BY created, job_id",
        (task_id,),
    )
    return [collection_from_row(r) for r in rows]


# --- collection jobs ----------------------------------------------------------


def put_collection(tx: Tx, record: CollectionRecord) -> CollectionRecord:
    """Insert a collection job, or return the stored one with the same id;
    StorageConflict if the id is taken by a job for another interval."""
    old = get_collection(tx, record.task_id, record.job_id)
    if old is not None:
        if (old.start, old.duration) != (record.start, record.duration):
            raise StorageConflict("collection job id reused for another interval")
        return old
    tx.run(
        f"INSERT INTO collections ({COLLECTION_COLS}, created) VALUES ({COLLECTION_PLACEHOLDERS})",
        (*collection_values(record), _time.time()),
    )
    return record


def update_collection(tx: Tx, record: CollectionRecord) -> None:
    """Store a collection job's progress; StorageConflict if the job already
    holds another leader share or is no longer pending: a share that may have
    been released is never replaced by a second, differently noised one."""
    row = tx.one(
        "SELECT leader_ct, state FROM collections WHERE task_id = ? AND job_id = ?" + tx.for_update,
        (record.task_id, record.job_id),
    )
    if row is None:
        raise StorageConflict(f"no collection job {record.job_id.hex()}")
    check_collection_update(
        None if row[0] is None else Ciphertext.from_bytes(bytes(row[0])), str(row[1]), record
    )
    _, _, _, _, *values, _agg_param = collection_values(record)
    tx.run(
        "UPDATE collections SET state = ?, report_count = ?, checksum = ?, leader_ct = ?,"
        " helper_ct = ?, error_code = ?, error_message = ? WHERE task_id = ? AND job_id = ?",
        (*values, record.task_id, record.job_id),
    )


def fail_collection(tx: Tx, record: CollectionRecord, reopen: bool) -> None:
    """Store a failed collection job; with `reopen`, release the buckets it
    closed (nothing was released from them), in the same transaction."""
    if reopen:
        tx.run(
            "UPDATE batch_aggregates SET collected_by = NULL"
            " WHERE task_id = ? AND collected_by = ?",
            (record.task_id, record.job_id),
        )
        tx.run(
            "DELETE FROM batch_aggregates WHERE task_id = ? AND report_count = 0"
            " AND agg_share IS NULL AND collected_by IS NULL",
            (record.task_id,),
        )
    update_collection(tx, record)


# --- the leader's aggregation and collection jobs ---------------------------


def create_aggregation_job(tx: Tx, task_id: bytes, job_id: bytes, limit: int) -> int:
    """Put up to `limit` pending reports, oldest first, in a new open job;
    returns how many (0: none pending, no job made)."""
    # SKIP LOCKED: two workers making jobs at once take disjoint reports.
    # Reports sent back by the helper as too early wait until their retry_at.
    ids = [
        bytes(r[0])
        for r in tx.rows(
            "SELECT report_id FROM reports WHERE task_id = ? AND state = ?"
            f" AND retry_at <= {tx.now} ORDER BY time LIMIT ?" + tx.skip_locked,
            (task_id, PENDING, limit),
        )
    ]
    if not ids:
        return 0
    tx.run(
        "INSERT INTO aggregation_jobs (task_id, job_id, state, created) VALUES (?, ?, 'open', ?)",
        (task_id, job_id, _time.time()),
    )
    for where, args in tx.id_lists("report_id", ids):
        tx.run(
            f"UPDATE reports SET state = ?, job_id = ? WHERE task_id = ? AND {where}",
            (IN_JOB, job_id, task_id, *args),
        )
    return len(ids)


def acquire_aggregation_jobs(
    tx: Tx, owner: str, lease_seconds: float, limit: int
) -> list[tuple[bytes, bytes]]:
    """Lease up to `limit` open jobs nobody else holds (or whose lease
    expired) and that are not waiting to be retried, oldest first."""
    rows = tx.rows(
        f"UPDATE aggregation_jobs SET lease_owner = ?, lease_expiry = {tx.now} + ?,"
        " attempts = attempts + 1 WHERE (task_id, job_id) IN ("
        " SELECT task_id, job_id FROM aggregation_jobs WHERE state = 'open'"
        f" AND (lease_expiry < {tx.now} OR lease_owner = ?) AND retry_at <= {tx.now}"
        f" ORDER BY created LIMIT ?{tx.skip_locked}) RETURNING task_id, job_id, created",
        (owner, lease_seconds, owner, limit),
    )
    return [(bytes(t), bytes(j)) for t, j, _ in sorted(rows, key=lambda r: (r[2], r[0], r[1]))]


def renew_aggregation_job(
    tx: Tx, task_id: bytes, job_id: bytes, owner: str, lease_seconds: float
) -> bool:
    """Extend `owner`'s lease; False if the job is finished or leased to another."""
    return (
        tx.run(
            f"UPDATE aggregation_jobs SET lease_expiry = {tx.now} + ? WHERE task_id = ?"
            " AND job_id = ? AND state = 'open' AND lease_owner = ?",
            (lease_seconds, task_id, job_id, owner),
        )
        == 1
    )


def finish_aggregation_job(
    tx: Tx,
    task_id: bytes,
    job_id: bytes,
    outcomes: Mapping[bytes, str | None],
    deltas: Sequence[BatchAggregate],
    merge: ShareMerge,
    deferred: Mapping[bytes, float],
) -> None:
    """Record each report as aggregated (None) or rejected (reason), one
    statement per outcome; put each `deferred` report back to pending, not to
    be put in a job for the given seconds, with reason report_too_early; add
    the job's deltas to the batch aggregates; close the job. StorageConflict
    if the job is not open (another worker finished it)."""
    row = tx.one(
        "SELECT state FROM aggregation_jobs WHERE task_id = ? AND job_id = ?" + tx.for_update,
        (task_id, job_id),
    )
    if row is None or row[0] != "open":
        raise StorageConflict(f"aggregation job {job_id.hex()} is not open")
    by_outcome: dict[str | None, list[bytes]] = {}
    for report_id, reason in outcomes.items():
        by_outcome.setdefault(reason, []).append(report_id)
    for reason, ids in sorted(by_outcome.items(), key=lambda kv: kv[0] or ""):
        for where, args in tx.id_lists("report_id", ids):
            tx.run(
                f"UPDATE reports SET state = ?, reason = ? WHERE task_id = ? AND {where}",
                (AGGREGATED if reason is None else REJECTED, reason, task_id, *args),
            )
    tx.many(
        f"UPDATE reports SET state = ?, job_id = NULL, reason = ?, retry_at = {tx.now} + ?"
        " WHERE task_id = ? AND report_id = ?",
        [(PENDING, TOO_EARLY, wait, task_id, i) for i, wait in sorted(deferred.items())],
    )
    count_rejections(tx, task_id, [r for r in outcomes.values() if r is not None])
    merge_aggregates(tx, task_id, job_id, deltas, merge)
    tx.run(
        "UPDATE aggregation_jobs SET state = 'finished', lease_owner = NULL, lease_expiry = 0"
        " WHERE task_id = ? AND job_id = ?",
        (task_id, job_id),
    )


def acquire_collections(
    tx: Tx, owner: str, lease_seconds: float, limit: int
) -> list[CollectionRecord]:
    """Lease up to `limit` pending collection jobs (as acquire_aggregation_jobs)."""
    rows = tx.rows(
        f"UPDATE collections SET lease_owner = ?, lease_expiry = {tx.now} + ?,"
        " attempts = attempts + 1 WHERE (task_id, job_id) IN ("
        " SELECT task_id, job_id FROM collections WHERE state = 'pending'"
        f" AND (lease_expiry < {tx.now} OR lease_owner = ?) AND retry_at <= {tx.now}"
        f" ORDER BY created LIMIT ?{tx.skip_locked}) RETURNING {COLLECTION_COLS}, created",
        (owner, lease_seconds, owner, limit),
    )
    ordered = sorted(rows, key=lambda r: (r[-1], bytes(r[0]), bytes(r[1])))
    return [collection_from_row(r[:-1]) for r in ordered]


def defer_collection(
    tx: Tx, task_id: bytes, job_id: bytes, code: int, message: str, backoff: Backoff
) -> float:
    """Record a failed attempt at a pending collection job that will be
    retried: why (`code`, `message`, shown while it is pending), and no new
    lease for backoff(failures so far) seconds. Returns that delay (0 if the
    job is no longer pending)."""
    row = tx.one(
        "SELECT failures FROM collections WHERE task_id = ? AND job_id = ?"
        " AND state = 'pending'" + tx.for_update,
        (task_id, job_id),
    )
    if row is None:
        return 0.0
    failures = int(row[0]) + 1
    delay = backoff(failures)
    tx.run(
        "UPDATE collections SET failures = ?, error_code = ?, error_message = ?,"
        f" retry_at = {tx.now} + ?, lease_owner = NULL, lease_expiry = 0"
        " WHERE task_id = ? AND job_id = ?",
        (failures, code, message, delay, task_id, job_id),
    )
    return delay


def defer_aggregation_job(
    tx: Tx, task_id: bytes, job_id: bytes, error: str, backoff: Backoff
) -> int:
    """Record a failed attempt at an open aggregation job: why, and no new
    lease for backoff(failures) seconds. Returns its failures so far (0 if
    the job is no longer open)."""
    row = tx.one(
        "SELECT failures FROM aggregation_jobs WHERE task_id = ? AND job_id = ?"
        " AND state = 'open'" + tx.for_update,
        (task_id, job_id),
    )
    if row is None:
        return 0
    failures = int(row[0]) + 1
    tx.run(
        f"UPDATE aggregation_jobs SET failures = ?, error = ?, retry_at = {tx.now} + ?,"
        " lease_owner = NULL, lease_expiry = 0 WHERE task_id = ? AND job_id = ?",
        (failures, error, backoff(failures), task_id, job_id),
    )
    return failures


def abandon_aggregation_job(tx: Tx, task_id: bytes, job_id: bytes, reason: str, error: str) -> int:
    """Give up an open aggregation job: its reports are rejected with
    `reason` (counted), the job is marked failed with `error`. Returns how
    many reports were rejected (0 if the job is no longer open)."""
    row = tx.one(
        "SELECT state FROM aggregation_jobs WHERE task_id = ? AND job_id = ?" + tx.for_update,
        (task_id, job_id),
    )
    if row is None or row[0] != "open":
        return 0
    n = tx.run(
        "UPDATE reports SET state = ?, reason = ? WHERE task_id = ? AND job_id = ? AND state = ?",
        (REJECTED, reason, task_id, job_id, IN_JOB),
    )
    count_rejections(tx, task_id, [reason] * n)
    tx.run(
        "UPDATE aggregation_jobs SET state = 'failed', error = ?, lease_owner = NULL,"
        " lease_expiry = 0 WHERE task_id = ? AND job_id = ?",
        (error, task_id, job_id),
    )
    return n


def put_reports(tx: Tx, task_id: bytes, reports: Sequence[tuple[int, Report]]) -> tuple[int, int]:
    """Store (bucket, report) pairs; all or nothing. Returns (stored, duplicates).

    BucketCollected if a bucket was already collected, ReportIdTaken if a
    report id is taken by a report with other content."""
    buckets = sorted({b for b, _ in reports})
    rows = {
        r.report_id: (r.time, r.public_share, r.leader_ct.to_bytes(), r.helper_ct.to_bytes())
        for _, r in reports
    }
    # Hold the buckets' lock rows (made if missing) against a concurrent close_batch.
    make_aggregate_rows(tx, task_id, [(b, 0) for b in buckets])
    for where, args in tx.id_lists("bucket", buckets):
        for bucket, collected_by in tx.rows(
            "SELECT bucket, collected_by FROM batch_aggregates WHERE task_id = ?"
            f" AND {where} AND shard = 0 ORDER BY bucket" + tx.for_share,
            (task_id, *args),
        ):
            if collected_by is not None:
                raise BucketCollected(int(bucket))
    seen: set[bytes] = set()
    for where, args in tx.id_lists("report_id", list(rows)):
        for report_id, *content in tx.rows(
            "SELECT report_id, time, public_share, leader_ct, helper_ct FROM reports"
            f" WHERE task_id = ? AND {where}",
            (task_id, *args),
        ):
            if tuple(content) != rows[bytes(report_id)]:
                raise ReportIdTaken(bytes(report_id))
            seen.add(bytes(report_id))
    # ON CONFLICT: on PostgreSQL the same report stored meanwhile through
    # another front end makes this fail to serialise and run again (then
    # finding it above), rather than fail on a duplicate key.
    tx.insert_new(
        "reports",
        (
            ("task_id", "bytea"),
            ("report_id", "bytea"),
            ("time", "bigint"),
            ("public_share", "bytea"),
            ("leader_ct", "bytea"),
            ("helper_ct", "bytea"),
        ),
        [(task_id, i, *row) for i, row in rows.items() if i not in seen],
    )
    return len(rows) - len(seen), len(seen)


# --- Poplar1 queries (both roles) -------------------------------------------

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


def finish_prefix_collection(
    tx: Tx, record: CollectionRecord, level: int, agg_share: bytes | None
) -> None:
    """The leader's finished Poplar1 collection: its sum in the query's row and
    the job's record (update_collection's checks), in one transaction."""
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
    tx.run(
        "INSERT INTO helper_jobs (task_id, job_id, request_hash, response, created)"
        " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        (task_id, job_id, job.request_hash, job.response, _time.time()),
    )
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


def batch_reports(tx: Tx, task_id: bytes, start: int, end: int) -> list[Report]:
    """The leader's stored reports with a time in [start, end), by report id."""
    rows = tx.rows(
        "SELECT report_id, time, public_share, leader_ct, helper_ct FROM reports"
        " WHERE task_id = ? AND time >= ? AND time < ? ORDER BY report_id",
        (task_id, start, end),
    )
    return [
        Report(
            bytes(i),
            int(t),
            bytes(p),
            Ciphertext.from_bytes(bytes(lc)),
            Ciphertext.from_bytes(bytes(hc)),
        )
        for i, t, p, lc, hc in rows
    ]
