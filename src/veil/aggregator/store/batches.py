"""Units of work on the leader's leader-selected batches (DAP's second batch
mode, draft-ietf-ppm-dap section 5.2), written once for both backends over
veil.aggregator.store.tx.

A batch is a row of `leader_batches` (its 32-byte id, chosen by the
leader, and its one bucket, veil.aggregator.core.leader_selected_bucket),
and its reports are those of the aggregation jobs that name it. A job's
batch is chosen in the transaction that makes the job, so a batch's
membership is decided once and stored before any job of it is sent; the
job's reports join it whatever the helper answers (a rejected report counts
for no batch, a report sent back as too early leaves its job and joins a
later one).

A batch is open while its reports, in jobs and not rejected, are fewer
than min_batch_size and it is not collected: each new job takes at most
what the oldest open batch lacks, so batches hold min_batch_size reports
where none is rejected (a batch a collection claimed, whose reports were
rejected below the floor, is filled again while the collection waits). A
batch is ready for a collection once it holds that many, nothing has
collected it and no collection but a failed one has claimed it.
"""

from __future__ import annotations

import time as _time

from veil.aggregator.store.jobs import create_aggregation_job
from veil.aggregator.store.records import IN_JOB, REJECTED, leader_selected_bucket
from veil.aggregator.store.tx import Tx

# The reports of batch `b` that count for it: in its jobs, not rejected.
_MEMBERS = (
    "(SELECT count(*) FROM reports r JOIN aggregation_jobs j"
    " ON r.task_id = j.task_id AND r.job_id = j.job_id"
    " WHERE j.task_id = b.task_id AND j.batch_id = b.batch_id AND r.state != ?)"
)
# Batch `b` is not collected.
_OPEN = (
    "NOT EXISTS (SELECT 1 FROM batch_aggregates a WHERE a.task_id = b.task_id"
    " AND a.bucket = b.bucket AND a.shard = 0 AND a.collected_by IS NOT NULL)"
)
# ... and not claimed by a collection that has not failed.
_UNCLAIMED = (
    _OPEN + " AND NOT EXISTS (SELECT 1 FROM collections c WHERE c.task_id = b.task_id"
    " AND c.start = b.bucket AND c.duration = 1 AND c.state != 'failed')"
)


def create_batch_job(
    tx: Tx, task_id: bytes, job_id: bytes, limit: int, min_batch_size: int, new_batch_id: bytes
) -> int:
    """Put up to `limit` pending reports in a new open job of the oldest
    open batch, at most what it lacks of `min_batch_size`, or of a new batch
    `new_batch_id` where none is open; returns how many (0: none pending,
    no job and no batch made)."""
    row = tx.one(
        f"SELECT b.batch_id, {_MEMBERS} FROM leader_batches b WHERE b.task_id = ?"
        f" AND {_OPEN} AND {_MEMBERS} < ? ORDER BY b.created, b.batch_id LIMIT 1",
        (REJECTED, task_id, REJECTED, min_batch_size),
    )
    if row is not None:
        batch_id, members = bytes(row[0]), int(row[1])
    else:
        batch_id, members = new_batch_id, 0
    n = create_aggregation_job(tx, task_id, job_id, min(limit, min_batch_size - members))
    if not n:
        return 0
    if row is None:
        tx.run(
            "INSERT INTO leader_batches (task_id, batch_id, bucket, created) VALUES (?, ?, ?, ?)",
            (task_id, batch_id, leader_selected_bucket(batch_id), _time.time()),
        )
    tx.run(
        "UPDATE aggregation_jobs SET batch_id = ? WHERE task_id = ? AND job_id = ?",
        (batch_id, task_id, job_id),
    )
    return n


def job_batch(tx: Tx, task_id: bytes, job_id: bytes) -> bytes | None:
    """The leader-selected batch of a job (None: a job of time buckets)."""
    row = tx.one(
        "SELECT batch_id FROM aggregation_jobs WHERE task_id = ? AND job_id = ?",
        (task_id, job_id),
    )
    return None if row is None or row[0] is None else bytes(row[0])


def ready_batch(tx: Tx, task_id: bytes, min_batch_size: int) -> tuple[bytes, int] | None:
    """The oldest batch that holds min_batch_size reports (in its jobs, not
    rejected) and that no collection has: (its id, its bucket)."""
    row = tx.one(
        f"SELECT b.batch_id, b.bucket FROM leader_batches b WHERE b.task_id = ?"
        f" AND {_UNCLAIMED} AND {_MEMBERS} >= ? ORDER BY b.created, b.batch_id LIMIT 1",
        (task_id, REJECTED, min_batch_size),
    )
    return None if row is None else (bytes(row[0]), int(row[1]))


def batch_of_bucket(tx: Tx, task_id: bytes, bucket: int) -> bytes | None:
    """The id of the batch whose bucket is `bucket`, if the leader made it."""
    row = tx.one(
        "SELECT batch_id FROM leader_batches WHERE task_id = ? AND bucket = ?"
        " ORDER BY created LIMIT 1",
        (task_id, bucket),
    )
    return None if row is None else bytes(row[0])


def batch_unfinished(tx: Tx, task_id: bytes, batch_id: bytes) -> bool:
    """Whether a report of the batch is still in an unfinished job."""
    row = tx.one(
        "SELECT 1 FROM reports r JOIN aggregation_jobs j"
        " ON r.task_id = j.task_id AND r.job_id = j.job_id"
        " WHERE j.task_id = ? AND j.batch_id = ? AND r.state = ? LIMIT 1",
        (task_id, batch_id, IN_JOB),
    )
    return row is not None
