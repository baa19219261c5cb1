"""Units of work on reports and their aggregates (both roles), written once
for both backends over veil.aggregator.store.tx: storing uploaded reports,
the replay check, reading a job's reports, the counts that status and the
leader's scheduler read, the sharded batch aggregates every job merges into,
rejection counts, and the peer clock readings.

A leader's report is two rows: its shares in `report_shares`, written once
on upload, and its state (state, job, reason, retry time, with its time for
the indexes) in `reports`, which every later step rewrites; a statement
that needs both joins them on (task_id, report_id) (migration 8 of
veil.aggregator.store.migrations).

Each function runs inside one transaction the backend opened (and, on
PostgreSQL, runs again from the start after a serialization failure), so a
unit either commits whole or not at all. The contract each one keeps is the
`Datastore` class's (veil.aggregator.store.base).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from operator import itemgetter
from typing import Any

from veil.aggregator.store.records import (
    IN_JOB,
    PENDING,
    REPORT_STATE_NAMES,
    BatchAggregate,
    BucketCollected,
    JobReport,
    ReportIdTaken,
    ShareMerge,
    aggregate_from_row,
    aggregate_shard,
    merge_aggregate,
)
from veil.aggregator.store.tx import Tx
from veil.messages import Ciphertext, Report, ReportBatch

# The reason a pending report carries while it waits for the helper's clock.
TOO_EARLY = "report_too_early"


_AGGREGATE_COLS = "bucket, agg_share, report_count, checksum, collected_by"

# A stored report whole: its state row joined to its shares. Statements
# that only read or change the state stay on `reports`.
_REPORT_COLS = "report_id, time, public_share, leader_ct, helper_ct, token"
_REPORTS_WITH_SHARES = "reports JOIN report_shares USING (task_id, report_id)"


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


def job_reports(tx: Tx, task_id: bytes, job_id: bytes) -> list[JobReport]:
    # Sorted here, not by ORDER BY: without table statistics SQLite would
    # walk the primary key (every report of the task) to avoid a sort
    # instead of looking the job up in reports_job. In binary form: a
    # Histogram(100,10) report's leader ciphertext is 2.5 KB, and its hex
    # text cost the PostgreSQL worker about 11 us a report to receive and
    # decode (docs/reports/SCALING.md, issue 28).
    rows = tx.rows(
        f"SELECT {_REPORT_COLS} FROM {_REPORTS_WITH_SHARES} WHERE task_id = ? AND job_id = ?",
        (task_id, job_id),
        binary=True,
    )
    # Both backends hand BLOB/bytea as bytes and integers as int, so the
    # rows' values are taken as they come, the ciphertexts as stored.
    rows.sort(key=itemgetter(0))
    # A report stored before tokens were (migration 10) reads an empty one.
    return [JobReport(i, t, p, lc, hc, tok or b"") for i, t, p, lc, hc, tok in rows]


def report_from_row(row: Sequence[Any]) -> Report:
    i, t, p, lc, hc, tok = row
    return Report(
        bytes(i),
        int(t),
        bytes(p),
        Ciphertext.from_bytes(bytes(lc)),
        Ciphertext.from_bytes(bytes(hc)),
        bytes(tok or b""),
    )


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


def put_reports(
    tx: Tx, task_id: bytes, buckets: Collection[int], batch: ReportBatch
) -> tuple[int, int]:
    """Store a batch of reports with distinct ids, whose times fall in
    `buckets`; all or nothing. Returns (stored, duplicates).

    BucketCollected if a bucket was already collected, ReportIdTaken if a
    report id is taken by a report with other content."""
    ordered = sorted(buckets)
    ids = batch.report_ids
    leader_cts = batch.leader_cts()
    helper_cts = batch.helper_cts()
    # Hold the buckets' lock rows (made if missing) against a concurrent close_batch.
    make_aggregate_rows(tx, task_id, [(b, 0) for b in ordered])
    for where, args in tx.id_lists("bucket", ordered):
        for bucket, collected_by in tx.rows(
            "SELECT bucket, collected_by FROM batch_aggregates WHERE task_id = ?"
            f" AND {where} AND shard = 0 ORDER BY bucket" + tx.for_share,
            (task_id, *args),
        ):
            if collected_by is not None:
                raise BucketCollected(int(bucket))
    at = {report_id: i for i, report_id in enumerate(ids)}
    seen: set[bytes] = set()
    for where, args in tx.id_lists("report_id", ids):
        for report_id, *content in tx.rows(
            f"SELECT {_REPORT_COLS} FROM {_REPORTS_WITH_SHARES} WHERE task_id = ? AND {where}",
            (task_id, *args),
        ):
            i = at[bytes(report_id)]
            # The same content is the same report, whatever its token (which
            # the stored one's challenge already bound to this content).
            if tuple(content[:4]) != (
                batch.times[i],
                batch.public_shares[i],
                leader_cts[i],
                helper_cts[i],
            ):
                raise ReportIdTaken(bytes(report_id))
            seen.add(bytes(report_id))
    columns: Sequence[Sequence[Any]] = (
        ids,
        batch.public_shares,
        leader_cts,
        helper_cts,
        batch.tokens,
        batch.times,
    )
    if seen:
        keep = [i for i, report_id in enumerate(ids) if report_id not in seen]
        columns = [[column[i] for i in keep] for column in columns]
    new_ids, public_shares, stored_leader, stored_helper, tokens, times = columns
    tasks = [task_id] * len(new_ids)
    # ON CONFLICT: on PostgreSQL the same report stored meanwhile through
    # another front end makes this fail to serialise and run again (then
    # finding it above), rather than fail on a duplicate key. Both rows of a
    # report are written in this one transaction, so neither exists alone.
    # A task without invitations leaves the token column NULL, read back as
    # an empty token, as a report stored before the column.
    share_columns: list[tuple[str, str]] = [
        ("task_id", "bytea"),
        ("report_id", "bytea"),
        ("public_share", "bytea"),
        ("leader_ct", "bytea"),
        ("helper_ct", "bytea"),
    ]
    share_values = [tasks, new_ids, public_shares, stored_leader, stored_helper]
    if any(tokens):
        share_columns.append(("token", "bytea"))
        share_values.append(tokens)
    tx.insert_columns("report_shares", share_columns, share_values)
    tx.insert_columns(
        "reports",
        (("task_id", "bytea"), ("report_id", "bytea"), ("time", "bigint")),
        (tasks, new_ids, times),
    )
    return len(ids) - len(seen), len(seen)


def batch_reports(tx: Tx, task_id: bytes, start: int, end: int) -> list[Report]:
    """The leader's stored reports with a time in [start, end), by report id."""
    rows = tx.rows(
        f"SELECT {_REPORT_COLS} FROM {_REPORTS_WITH_SHARES}"
        " WHERE task_id = ? AND time >= ? AND time < ? ORDER BY report_id",
        (task_id, start, end),
    )
    return [report_from_row(r) for r in rows]
