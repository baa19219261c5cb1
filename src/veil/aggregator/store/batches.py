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

A task whose reports expire also retires its batches: a batch takes no job
once its oldest report is within a margin of expiry (`joinable_from`), so
that a batch garbage collection may take, at either aggregator, takes no
more reports (the argument, and what it leaves out, at `joinable_from`).
A batch retired short holds reports that expire uncollected, as any
report does that is not collected within report_expiry_age.
"""

from __future__ import annotations

import time as _time

from veil.aggregator.store.jobs import create_aggregation_job
from veil.aggregator.store.records import AGGREGATED, IN_JOB, REJECTED, leader_selected_bucket
from veil.aggregator.store.tx import Tx
from veil.task import retirement_margin

# The reports of batch `b` that count for it: in its jobs, not rejected.
_MEMBERS = (
    "(SELECT count(*) FROM reports r JOIN aggregation_jobs j"
    " ON r.task_id = j.task_id AND r.job_id = j.job_id"
    " WHERE j.task_id = b.task_id AND j.batch_id = b.batch_id AND r.state != ?)"
)
# The time of batch `b`'s oldest report (NULL: none left).
_OLDEST = (
    "(SELECT min(r.time) FROM reports r JOIN aggregation_jobs j"
    " ON r.task_id = j.task_id AND r.job_id = j.job_id"
    " WHERE j.task_id = b.task_id AND j.batch_id = b.batch_id)"
)
# Batch `b`'s aggregate counts no report its jobs no longer hold: none has
# gone by age (its other reports would not show how old it is).
_WHOLE = (
    "(SELECT coalesce(sum(a.report_count), 0) FROM batch_aggregates a"
    " WHERE a.task_id = b.task_id AND a.bucket = b.bucket)"
    " = (SELECT count(*) FROM reports r JOIN aggregation_jobs j"
    " ON r.task_id = j.task_id AND r.job_id = j.job_id"
    " WHERE j.task_id = b.task_id AND j.batch_id = b.batch_id AND r.state = ?)"
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


def joinable_from(
    now: float, report_expiry_age: int | None, time_precision: int, max_clock_skew: int
) -> int | None:
    """The oldest report time a batch may hold and still take a job at the
    leader's time `now` (None: the task's reports never expire, nor do its
    batches retire): report_expiry_age before `now`, plus a margin of the
    larger of the task's time precision and its max_clock_skew.

    Why this is enough. Garbage collection at either aggregator, at its
    time t, takes a batch only once every report of the batch it knows is
    older than t - report_expiry_age - max_clock_skew (store.upkeep's
    _spent_batches; maintenance.gc_task pushes the horizon back by the
    skew). A job joins a batch at the leader's time c only if every report
    of it the leader holds is at least c - report_expiry_age + margin.
    Both look at the same report times (a report's time is one value at
    both), so for one report both to hold, c + margin + max_clock_skew < t:
    with the job no earlier than the GC, the GC's clock must be ahead of
    the leader's by more than margin + max_clock_skew (at least twice the
    skew every report is allowed, and at least the time precision). Hence
    a batch the helper has taken, holding reports the leader still has, is
    never joined afterwards (the helper's GC first, then a fresh report);
    and at the leader, GC and a new job that read the same reports in
    concurrent transactions never both decide, so GC never deletes the
    record of a batch a job is joining (PostgreSQL also serialises the two
    on that row: create_batch_job). The leader deletes a report by age
    only once it is past that horizon too, so a batch that lost one is
    retired already; it stays retired, as a batch with no report left does,
    once its aggregate counts a report its jobs no longer hold (without
    that, a young report the helper never saw, rejected by the leader
    before sending, would make it look young again).

    What the rule does not cover: a job made while its batch was joinable
    that reaches the helper only after the helper's GC took the batch (the
    helper unreachable for longer than the margin as the batch's reports
    expire), which the helper then counts alone for the batch."""
    if report_expiry_age is None:
        return None
    return int(now) - report_expiry_age + retirement_margin(time_precision, max_clock_skew)


def create_batch_job(
    tx: Tx,
    task_id: bytes,
    job_id: bytes,
    limit: int,
    min_batch_size: int,
    new_batch_id: bytes,
    oldest: int | None,
) -> int:
    """Put up to `limit` pending reports in a new open job of the oldest
    open batch, at most what it lacks of `min_batch_size`, or of a new batch
    `new_batch_id` where none is open; returns how many (0: none pending,
    no job and no batch made). With `oldest` (joinable_from), a batch
    whose oldest report is older than that is retired: it takes no job."""
    retired = "" if oldest is None else f" AND {_OLDEST} >= ? AND {_WHOLE}"
    row = tx.one(
        f"SELECT b.batch_id, {_MEMBERS} FROM leader_batches b WHERE b.task_id = ?"
        f" AND {_OPEN} AND {_MEMBERS} < ?{retired} ORDER BY b.created, b.batch_id LIMIT 1",
        (REJECTED, task_id, REJECTED, min_batch_size)
        + (() if oldest is None else (oldest, AGGREGATED)),
    )
    if row is not None:
        batch_id, members = bytes(row[0]), int(row[1])
        # A write of the batch's row: on PostgreSQL a concurrent GC that
        # deletes it, before or after, makes one of the two transactions
        # fail to serialise and run again from a fresh snapshot (Datastore
        # retries), where it sees what the other did (this job's reports,
        # or the batch gone). SQLite runs one writer at a time already.
        tx.run(
            "UPDATE leader_batches SET created = created WHERE task_id = ? AND batch_id = ?",
            (task_id, batch_id),
        )
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
