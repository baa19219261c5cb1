"""Units of work on aggregation jobs, written once for both backends over
veil.aggregator.store.tx: the leader's (create, acquire, renew, finish,
defer, abandon) and the helper's (a job's result stored with its merge, and
served again on a retry). One transaction each, as in
veil.aggregator.store.reports.
"""

from __future__ import annotations

import time as _time
from collections.abc import Mapping, Sequence

from veil.aggregator.store.records import (
    AGGREGATED,
    IN_JOB,
    PENDING,
    REJECTED,
    Backoff,
    BatchAggregate,
    HelperJob,
    ReportsAggregated,
    ShareMerge,
    StorageConflict,
)
from veil.aggregator.store.reports import (
    TOO_EARLY,
    count_rejections,
    merge_aggregates,
)
from veil.aggregator.store.tx import Tx


def helper_job(tx: Tx, task_id: bytes, job_id: bytes) -> tuple[bytes, bytes] | None:
    row = tx.one(
        "SELECT request_hash, response FROM helper_jobs WHERE task_id = ? AND job_id = ?",
        (task_id, job_id),
    )
    return None if row is None else (bytes(row[0]), bytes(row[1]))


def helper_job_batch(tx: Tx, task_id: bytes, job_id: bytes) -> bytes | None:
    """The leader-selected batch a helper job's reports joined, if any."""
    row = tx.one(
        "SELECT batch_id FROM helper_jobs WHERE task_id = ? AND job_id = ?", (task_id, job_id)
    )
    return None if row is None or row[0] is None else bytes(row[0])


def insert_helper_job(tx: Tx, job: HelperJob) -> None:
    """The helper's record of a job (its request's hash and its answer, kept
    to answer a retry identically), for Prio3's jobs and Poplar1's."""
    tx.run(
        "INSERT INTO helper_jobs (task_id, job_id, request_hash, response, created, batch_id)"
        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        (job.task_id, job.job_id, job.request_hash, job.response, _time.time(), job.batch_id),
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
    insert_helper_job(tx, job)
    # The replay records' primary key is the check: a record already there
    # is skipped, and then the job raises (its transaction rolls back). Only
    # a job that lost a race looks its ids up again; a look-up before every
    # insert cost about 1.2 µs a report for what the caller had just read.
    records = [(task_id, i, t, job_id) for i, t in job.reports]
    if tx.insert_new("helper_reports", _REPLAY_COLUMNS, records) < len(records):
        taken = _recorded_by_others(tx, task_id, job_id, [i for i, _ in job.reports])
        if taken:
            raise ReportsAggregated(sorted(taken))
    count_rejections(tx, task_id, job.rejected)
    merge_aggregates(tx, task_id, job_id, job.deltas, merge, refuse_collected=True)
    return None


_REPLAY_COLUMNS = (
    ("task_id", "bytea"),
    ("report_id", "bytea"),
    ("time", "bigint"),
    ("job_id", "bytea"),
)


def _recorded_by_others(
    tx: Tx, task_id: bytes, job_id: bytes, report_ids: Sequence[bytes]
) -> set[bytes]:
    """Which of the ids have a replay record of another job (or of none: a
    record from before job ids were kept)."""
    taken: set[bytes] = set()
    for where, args in tx.id_lists("report_id", report_ids):
        rows = tx.rows(
            f"SELECT report_id, job_id FROM helper_reports WHERE task_id = ? AND {where}",
            (task_id, *args),
        )
        taken.update(bytes(i) for i, j in rows if j is None or bytes(j) != job_id)
    return taken


def open_aggregation_jobs(tx: Tx) -> list[tuple[bytes, bytes]]:
    rows = tx.rows(
        "SELECT task_id, job_id FROM aggregation_jobs WHERE state = 'open' ORDER BY created"
    )
    return [(bytes(t), bytes(j)) for t, j in rows]


def aggregation_job_errors(tx: Tx, task_id: bytes) -> dict[bytes, tuple[str, int, str]]:
    """Jobs of a task that failed at least once: job id -> (state, failures, error)."""
    rows = tx.rows(
        "SELECT job_id, state, failures, error FROM aggregation_jobs WHERE task_id = ?"
        " AND error IS NOT NULL",
        (task_id,),
    )
    return {bytes(j): (str(st), int(n), str(e)) for j, st, n, e in rows}


def create_aggregation_job(tx: Tx, task_id: bytes, job_id: bytes, limit: int) -> int:
    """Put up to `limit` pending reports, oldest first, in a new open job;
    returns how many (0: none pending, no job made)."""
    # One statement picks and updates the reports: the subquery reads them
    # from reports_state in time order and the update reaches each by its
    # place (no probe of the random report-id B-tree a report).
    # SKIP LOCKED: two workers making jobs at once take disjoint reports.
    # Reports sent back by the helper as too early wait until their retry_at.
    n = tx.run(
        "UPDATE reports SET state = ?, job_id = ? WHERE "
        + tx.rows_chosen(
            f"SELECT {tx.row_key} FROM reports WHERE task_id = ? AND state = ?"
            f" AND retry_at <= {tx.now} ORDER BY time LIMIT ?{tx.skip_locked}"
        ),
        (IN_JOB, job_id, task_id, PENDING, limit),
    )
    if n:
        tx.run(
            "INSERT INTO aggregation_jobs (task_id, job_id, state, created)"
            " VALUES (?, ?, 'open', ?)",
            (task_id, job_id, _time.time()),
        )
    return n


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
    """Record each report as aggregated (None) or rejected (reason); put
    each `deferred` report back to pending, not to be put in a job for the
    given seconds, with reason report_too_early; add the job's deltas to the
    batch aggregates; close the job. The outcomes and `deferred` account for
    each report of the job, once. StorageConflict if the job is not open
    (another worker finished it) or the reports left in the job are not as
    many as the outcomes say were aggregated."""
    row = tx.one(
        "SELECT state FROM aggregation_jobs WHERE task_id = ? AND job_id = ?" + tx.for_update,
        (task_id, job_id),
    )
    if row is None or row[0] != "open":
        raise StorageConflict(f"aggregation job {job_id.hex()} is not open")
    by_reason: dict[str, list[bytes]] = {}
    aggregated = 0
    for report_id, reason in outcomes.items():
        if reason is None:
            aggregated += 1
        else:
            by_reason.setdefault(reason, []).append(report_id)
    for reason, ids in sorted(by_reason.items()):
        for where, args in tx.id_lists("report_id", ids):
            tx.run(
                f"UPDATE reports SET state = ?, reason = ? WHERE task_id = ? AND {where}",
                (REJECTED, reason, task_id, *args),
            )
    tx.many(
        f"UPDATE reports SET state = ?, job_id = NULL, reason = ?, retry_at = {tx.now} + ?"
        " WHERE task_id = ? AND report_id = ?",
        [(PENDING, TOO_EARLY, wait, task_id, i) for i, wait in sorted(deferred.items())],
    )
    # The aggregated reports, most of a job, are the ones left in it: found
    # through reports_job rather than by id (a probe of the random report-id
    # B-tree each). The outcomes must account for every report of the job.
    if aggregated:
        left = tx.run(
            "UPDATE reports SET state = ?, reason = NULL WHERE task_id = ? AND job_id = ?"
            " AND state = ?",
            (AGGREGATED, task_id, job_id, IN_JOB),
        )
        if left != aggregated:
            raise StorageConflict(
                f"aggregation job {job_id.hex()}: {aggregated} reports aggregated,"
                f" {left} left in the job"
            )
    count_rejections(tx, task_id, [r for r in outcomes.values() if r is not None])
    merge_aggregates(tx, task_id, job_id, deltas, merge)
    tx.run(
        "UPDATE aggregation_jobs SET state = 'finished', lease_owner = NULL, lease_expiry = 0"
        " WHERE task_id = ? AND job_id = ?",
        (task_id, job_id),
    )


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
