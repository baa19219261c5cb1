"""Units of work on collection jobs, written once for both backends over
veil.aggregator.store.tx: storing, updating, failing, acquiring and
deferring them, and the helper's collection that closes its batch. One
transaction each, as in veil.aggregator.store.reports.
"""

from __future__ import annotations

import time as _time
from collections.abc import Sequence

from veil.aggregator.store.records import (
    COLLECTION_COLS,
    COLLECTION_PLACEHOLDERS,
    Backoff,
    CollectionGone,
    CollectionRecord,
    StorageConflict,
    check_batch_unchanged,
    collection_from_row,
    collection_values,
)
from veil.aggregator.store.reports import batch_aggregates, close_batch
from veil.aggregator.store.tx import Tx
from veil.messages import Ciphertext


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


def get_collection(tx: Tx, task_id: bytes, job_id: bytes) -> CollectionRecord | None:
    row = tx.one(
        f"SELECT {COLLECTION_COLS} FROM collections WHERE task_id = ? AND job_id = ?",
        (task_id, job_id),
    )
    return None if row is None else collection_from_row(row)


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


def collections(tx: Tx, task_id: bytes) -> list[CollectionRecord]:
    rows = tx.rows(
        f"SELECT {COLLECTION_COLS} FROM collections WHERE task_id = ? ORDER BY created, job_id",
        (task_id,),
    )
    return [collection_from_row(r) for r in rows]


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


def close_collection_batch(tx: Tx, record: CollectionRecord, step: int) -> None:
    """Close the batch of the pending collection job `record`
    (close_batch), in one transaction with a conditional update of the
    job's row: CollectionGone, nothing closed, if the job is no longer
    pending (deleted by its collector, or done). A deletion locks the same
    row (delete_collection), so the two are serialized: the job is either
    discarded before this, which then closes nothing, or kept as deleted
    after it, since it closed its batch. Never a batch closed by a
    discarded job, collected by nobody. (On PostgreSQL the update, a new
    version of the row even though it changes nothing, makes a deletion
    that waited for it start again from a fresh snapshot.)"""
    task_id, job_id = record.task_id, record.job_id
    claimed = tx.run(
        "UPDATE collections SET state = state WHERE task_id = ? AND job_id = ?"
        " AND state = 'pending'",
        (task_id, job_id),
    )
    if claimed == 0:
        raise CollectionGone(f"collection job {job_id.hex()} is no longer pending")
    close_batch(tx, task_id, record.start, record.start + record.duration, job_id, step)


def delete_collection(tx: Tx, task_id: bytes, job_id: bytes) -> str | None:
    """The collector's deletion of a collection job (draft-ietf-ppm-dap
    section 4.6, "Collection Job Deletion"): None if there is no such job;
    "discarded" if the job held nothing of a batch (no bucket closed by it,
    no leader share drawn) and is gone whole, so that the same request
    creates it again; else "deleted": the job is kept, never driven again,
    and its batch stays collected, since a share may have left it (the
    draft forbids deleting what double-collection checks need). The job's
    row is locked first: a driver closing its batch
    (close_collection_batch) runs wholly before or wholly after this."""
    row = tx.one(
        "SELECT state, leader_ct FROM collections WHERE task_id = ? AND job_id = ?" + tx.for_update,
        (task_id, job_id),
    )
    if row is None:
        return None
    if str(row[0]) == "deleted":
        return "deleted"
    holds = tx.one(
        "SELECT 1 FROM batch_aggregates WHERE task_id = ? AND collected_by = ?",
        (task_id, job_id),
    )
    if holds is None and row[1] is None:
        tx.run("DELETE FROM collections WHERE task_id = ? AND job_id = ?", (task_id, job_id))
        return "discarded"
    tx.run(
        "UPDATE collections SET state = 'deleted', lease_owner = NULL, lease_expiry = 0"
        " WHERE task_id = ? AND job_id = ?",
        (task_id, job_id),
    )
    return "deleted"


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


def renew_collection(
    tx: Tx, task_id: bytes, job_id: bytes, owner: str, lease_seconds: float
) -> bool:
    """Extend `owner`'s lease of a pending collection job (a Poplar1 level's
    takes many aggregation jobs); False if the job is no longer pending or is
    leased to another (as renew_aggregation_job)."""
    return (
        tx.run(
            f"UPDATE collections SET lease_expiry = {tx.now} + ? WHERE task_id = ?"
            " AND job_id = ? AND state = 'pending' AND lease_owner = ?",
            (lease_seconds, task_id, job_id, owner),
        )
        == 1
    )


def note_waiting(tx: Tx, task_ids: Sequence[bytes], code: int, message: str) -> int:
    """Say why the pending collection jobs of `task_ids` wait (`code`,
    `message`, shown while they are pending) without counting a failed
    attempt or putting off their next one; rows that already say so are
    not written. Returns how many were."""
    changed = 0
    for where, ids in tx.id_lists("task_id", task_ids):
        changed += tx.run(
            f"UPDATE collections SET error_code = ?, error_message = ? WHERE state = 'pending'"
            f" AND {where} AND (error_code <> ? OR error_message <> ?)",
            (code, message, *ids, code, message),
        )
    return changed


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
