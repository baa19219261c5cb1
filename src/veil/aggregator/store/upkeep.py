"""Units of upkeep, written once for both backends: the HPKE keys (their
rotation, and the first key of processes starting together) and garbage
collection (what no rule needs any more). The contract is the `Datastore`
class's (veil.aggregator.store.base); the policy that calls them is
veil.aggregator.maintenance."""

from __future__ import annotations

from typing import Any

from veil.aggregator.store.records import (
    AGGREGATED,
    HPKE_KEY_INSERT,
    KEY_ACTIVE,
    KEY_EXPIRED,
    KEY_STATES,
    LEADER_SELECTED_BUCKETS,
    REJECTED,
    GcResult,
    HpkeKey,
    StorageConflict,
    hpke_key_values,
    leader_selected_bucket,
)
from veil.aggregator.store.tx import Tx
from veil.hpke import HpkeConfig, HpkeKeypair


def hpke_keys(tx: Tx) -> list[HpkeKey]:
    rows = tx.rows(
        "SELECT config_id, public_key, private_key, state, created, expires_at"
        " FROM hpke_keys ORDER BY created, config_id"
    )
    return [
        HpkeKey(HpkeKeypair(HpkeConfig(c, bytes(pk)), bytes(sk)), st, cr, ex)
        for c, pk, sk, st, cr, ex in rows
    ]


def delete_expired_hpke_keys(tx: Tx, now: float) -> list[int]:
    ids = sorted(
        int(r[0])
        for r in tx.rows(
            "SELECT config_id FROM hpke_keys WHERE state = ? AND expires_at <= ?" + tx.for_update,
            (KEY_EXPIRED, now),
        )
    )
    tx.many("DELETE FROM hpke_keys WHERE config_id = ?", [(i,) for i in ids])
    return ids


def activate_hpke_key(tx: Tx, config_id: int, now: float, grace: float) -> None:
    """Make `config_id` (pending or active) the active key and every other
    active key expired at now + grace; StorageConflict if it is unknown or
    expired."""
    # Every key row locked, in one order: two activations cannot both leave
    # their key active.
    states = {
        int(c): str(st)
        for c, st in tx.rows(
            "SELECT config_id, state FROM hpke_keys ORDER BY config_id" + tx.for_update
        )
    }
    if states.get(config_id) in (None, KEY_EXPIRED):
        raise StorageConflict(f"HPKE config id {config_id} is not a pending or active key")
    tx.run(
        "UPDATE hpke_keys SET state = ?, expires_at = ? WHERE state = ? AND config_id != ?",
        (KEY_EXPIRED, now + grace, KEY_ACTIVE, config_id),
    )
    tx.run(
        "UPDATE hpke_keys SET state = ?, expires_at = NULL WHERE config_id = ?",
        (KEY_ACTIVE, config_id),
    )


# A bucket counts as collected for GC only once the collection that closed
# it has finished: a failed collection may reopen its buckets (see
# fail_collection), after which the report ids are needed again.
_FINISHED_BUCKET = (
    "EXISTS (SELECT 1 FROM batch_aggregates b JOIN collections c"
    " ON c.task_id = b.task_id AND c.job_id = b.collected_by AND c.state = 'finished'"
    " WHERE b.task_id = {t}.task_id AND b.bucket = {t}.time - {t}.time % ? AND b.shard = 0)"
)


# A Poplar1 batch (veil.aggregator.store.prefix_queries) is done once its
# last level's collection finished or any level's collection failed: no
# later level can be queried (the draft's rule across queries, and the
# leader's refusal after a level that did not finish), and no level twice.
_DONE_BATCH = (
    "EXISTS (SELECT 1 FROM prefix_queries q JOIN collections c"
    " ON c.task_id = q.task_id AND c.job_id = q.collected_by"
    " WHERE q.task_id = reports.task_id AND reports.time >= q.start"
    " AND reports.time < q.start + q.duration"
    " AND (c.state = 'failed' OR (c.state = 'finished' AND q.level = ?)))"
)


def _report_deletes(
    task_id: bytes, where: str, args: tuple[Any, ...]
) -> list[tuple[str | None, str, tuple[Any, ...]]]:
    """Delete the leader's reports of the task that `where` picks (a
    condition on `reports`): their shares first, found through their state
    rows, then the state rows, counted as the reports deleted."""
    return [
        (
            None,
            "DELETE FROM report_shares WHERE task_id = ? AND report_id IN"
            f" (SELECT report_id FROM reports WHERE task_id = ? AND {where})",
            (task_id, task_id, *args),
        ),
        ("reports", f"DELETE FROM reports WHERE task_id = ? AND {where}", (task_id, *args)),
    ]


def gc_statements(
    task_id: bytes,
    time_precision: int,
    report_horizon: int | None,
    job_horizon: float | None,
    last_level: int | None = None,
) -> list[tuple[str | None, str, tuple[Any, ...]]]:
    """One garbage-collection pass as (GcResult field, SQL with ``?``
    placeholders, arguments), in order (field None: rows not counted, the
    shares of the reports that the next statement deletes); every backend
    runs these in one transaction (see ``collect_garbage`` for the rules).
    `last_level` is a Poplar1 task's last level (bits - 1), None for a Prio3
    task."""
    tp = time_precision
    horizon = report_horizon
    age = "time < ?" if horizon is not None else "FALSE"
    age_args: tuple[int, ...] = (horizon,) if horizon is not None else ()
    ended = "q.start + q.duration <= ?" if horizon is not None else "FALSE"
    statements = _report_deletes(
        task_id,
        f"state IN (?, ?) AND ({age} OR {_FINISHED_BUCKET.format(t='reports')})",
        (AGGREGATED, REJECTED, *age_args, tp),
    )
    if last_level is not None:
        # A Poplar1 task's reports stay pending: its collections aggregate
        # them level by level, and its query records outlive them.
        statements += _report_deletes(task_id, f"({age} OR {_DONE_BATCH})", (*age_args, last_level))
        statements += [
            (
                "prefix_reports",
                "DELETE FROM prefix_reports WHERE task_id = ? AND EXISTS (SELECT 1 FROM"
                " prefix_queries q WHERE q.task_id = prefix_reports.task_id"
                " AND q.start = prefix_reports.start AND q.level = prefix_reports.level"
                f" AND (q.collected_by IS NOT NULL OR {ended}))",
                (task_id, *age_args),
            ),
        ]
    statements += [
        (
            "aggregation_jobs",
            "DELETE FROM aggregation_jobs WHERE task_id = ? AND state IN ('finished', 'failed')"
            " AND NOT"
            " EXISTS (SELECT 1 FROM reports r WHERE r.task_id = aggregation_jobs.task_id"
            " AND r.job_id = aggregation_jobs.job_id)",
            (task_id,),
        ),
        (
            "replay_records",
            "DELETE FROM helper_reports WHERE task_id = ? AND time IS NOT NULL AND"
            f" ({age} OR {_FINISHED_BUCKET.format(t='helper_reports')})",
            (task_id, *age_args, tp),
        ),
    ]
    if horizon is not None:
        statements += [
            (
                "batch_aggregates",
                "DELETE FROM batch_aggregates WHERE task_id = ? AND bucket + ? <= ?",
                (task_id, tp, horizon),
            ),
            # A Poplar1 batch's query records go with its collections, in
            # this transaction, and with its reports (above): a level
            # released once is never released again from a record that
            # survived its collection, nor queried again from reports that
            # survived its record (the helper drops a report older than the
            # horizon on its own).
            (
                "prefix_queries",
                "DELETE FROM prefix_queries WHERE task_id = ? AND start + duration <= ?",
                (task_id, horizon),
            ),
            (
                "collections",
                "DELETE FROM collections WHERE task_id = ? AND state != 'pending'"
                " AND start + duration <= ?",
                (task_id, horizon),
            ),
        ]
    # Records written before job ids were kept with the replay records
    # (created IS NULL) are left to the horizon. A Poplar1 job has no replay
    # record of that table (its are per level, in prefix_reports): its record
    # is kept while a query of its task is not yet released, so that a retry
    # of the job gets its answer again.
    statements.append(
        (
            "helper_jobs",
            "DELETE FROM helper_jobs WHERE task_id = ? AND (created < ? OR"
            " (created IS NOT NULL AND NOT EXISTS (SELECT 1 FROM helper_reports h"
            " WHERE h.task_id = helper_jobs.task_id AND h.job_id = helper_jobs.job_id)"
            " AND NOT EXISTS (SELECT 1 FROM prefix_queries q"
            " WHERE q.task_id = helper_jobs.task_id AND q.collected_by IS NULL)))",
            (task_id, job_horizon if job_horizon is not None else float("-inf")),
        )
    )
    return statements


def collect_garbage(
    tx: Tx,
    task_id: bytes,
    time_precision: int,
    report_horizon: int | None,
    job_horizon: float | None,
    last_level: int | None = None,
) -> GcResult:
    """Delete what no rule needs any more, for one task, in one transaction.

    - Leader reports that are aggregated or rejected and either older than
      `report_horizon` (uploads that old are refused) or in a bucket whose
      collection finished (uploads into it are refused). Pending reports
      and reports in a job are kept: they have yet to be counted.
    - Finished aggregation jobs with no report left.
    - Batch aggregates of buckets that end at or before `report_horizon`.
    - Helper replay records with a time, on the same two conditions as
      leader reports.
    - Helper job records (kept to answer a retried job identically)
      created before `job_horizon` (the caller picks it so that every
      report of such a job is older than the report horizon), or whose
      reports have no replay record left (their batch was collected, so
      the leader finished the job before; or they were all refused
      before: a retry gets the same answer) and no Poplar1 query of the
      task waits for its release. Either way a retry is refused report by
      report and counts nothing twice.
    - Finished or failed collections whose interval ends at or before
      `report_horizon`.
    - A leader-selected batch (DAP's; its bucket lies beyond every time,
      so the rules above never reach it) once none of its reports is left:
      the leader's reports and the helper's replay records of such a task
      go by age alone (no time bucket of it is ever collected), so once
      every report of the batch is past `report_horizon`, as a time bucket
      goes once its end is. Its aggregate rows, its collections but a
      pending one, and the leader's record of it (leader_batches, so that
      no later job joins it) go together (`_spent_batches`).

    A Poplar1 task (`last_level` is its last level) also:

    - Leader reports older than `report_horizon` (the helper drops them),
      or in a batch that is done: its last level's collection finished or
      a level's collection failed, so no level of it can be queried again.
    - The helper's per-level replay records (prefix_reports) of a level it
      released (no job is taken at that level any more), or of a batch that
      ends at or before `report_horizon`.
    - The batch's query records (prefix_queries), which refuse every level
      queried before and every level out of order, only at
      `report_horizon`, with the batch's collections, after its reports:
      while a report of the batch can be aggregated, the record that its
      level was released stays.

    `report_horizon` None (the task has no report expiry) keeps everything
    that only age would release.
    """
    statements = gc_statements(task_id, time_precision, report_horizon, job_horizon, last_level)
    if report_horizon is not None:
        statements += _spent_batches(tx, task_id, report_horizon)
    counts: dict[str, int] = {}
    for kind, q, args in statements:
        n = tx.run(q, args)
        if kind is not None:
            counts[kind] = counts.get(kind, 0) + n
    return GcResult(**counts)


def _spent_batches(
    tx: Tx, task_id: bytes, horizon: int
) -> list[tuple[str | None, str, tuple[Any, ...]]]:
    """The statements deleting the task's leader-selected batches of which
    no report is left once gc_statements' have run: at the leader, none in
    a job of the batch that is not aggregated or rejected before `horizon`;
    at the helper, no replay record of a job of the batch from `horizon`
    on. A batch a pending collection claims is kept. Read before anything
    is deleted, in the same transaction; a batch's bucket is computed from
    its id (leader_selected_bucket), which SQL cannot do alike in both
    dialects."""
    live = {
        leader_selected_bucket(bytes(r[0]))
        for r in tx.rows(
            "SELECT DISTINCT j.batch_id FROM aggregation_jobs j WHERE j.task_id = ?"
            " AND j.batch_id IS NOT NULL AND EXISTS (SELECT 1 FROM reports r"
            " WHERE r.task_id = j.task_id AND r.job_id = j.job_id"
            " AND (r.state NOT IN (?, ?) OR r.time >= ?))"
            " UNION SELECT DISTINCT j.batch_id FROM helper_jobs j WHERE j.task_id = ?"
            " AND j.batch_id IS NOT NULL AND EXISTS (SELECT 1 FROM helper_reports h"
            " WHERE h.task_id = j.task_id AND h.job_id = j.job_id"
            " AND (h.time IS NULL OR h.time >= ?))",
            (task_id, AGGREGATED, REJECTED, horizon, task_id, horizon),
        )
    }
    claimed = "SELECT start FROM collections WHERE task_id = ? AND state = 'pending'"
    live |= {int(r[0]) for r in tx.rows(claimed, (task_id,))}
    first = LEADER_SELECTED_BUCKETS
    known = {
        int(r[0])
        for r in tx.rows(
            "SELECT bucket FROM leader_batches WHERE task_id = ?"
            " UNION SELECT bucket FROM batch_aggregates WHERE task_id = ? AND bucket >= ?"
            " UNION SELECT start FROM collections WHERE task_id = ? AND start >= ?",
            (task_id, task_id, first, task_id, first),
        )
    }
    statements: list[tuple[str | None, str, tuple[Any, ...]]] = []
    for bucket in sorted(known - live):
        statements += [
            (
                "batch_aggregates",
                "DELETE FROM batch_aggregates WHERE task_id = ? AND bucket = ?",
                (task_id, bucket),
            ),
            (
                "collections",
                "DELETE FROM collections WHERE task_id = ? AND start = ? AND state != 'pending'",
                (task_id, bucket),
            ),
            (
                "leader_batches",
                "DELETE FROM leader_batches WHERE task_id = ? AND bucket = ?",
                (task_id, bucket),
            ),
        ]
    return statements


def add_hpke_key(tx: Tx, key: HpkeKey) -> None:
    if key.state not in KEY_STATES:
        raise ValueError(f"unknown HPKE key state {key.state!r}")
    # ON CONFLICT: a taken id is an answer (StorageConflict), not an aborted
    # transaction.
    if tx.run(HPKE_KEY_INSERT + " ON CONFLICT DO NOTHING", hpke_key_values(key)) != 1:
        raise StorageConflict(f"HPKE config id {key.config_id} is taken")


def add_first_hpke_key(tx: Tx, key: HpkeKey) -> bool:
    # The table lock comes first, before PostgreSQL's snapshot (taken at the
    # first query): the read below then sees a key that a process which held
    # the lock added.
    tx.lock_table("hpke_keys")
    if tx.one("SELECT 1 FROM hpke_keys LIMIT 1") is not None:
        return False
    tx.run(HPKE_KEY_INSERT, hpke_key_values(key))
    return True
