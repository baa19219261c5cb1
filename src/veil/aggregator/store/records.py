"""The rows storage deals in, and the conflicts it reports: shared by both
backends and by the units of work (veil.aggregator.store.reports, jobs,
collection_jobs, prefix_queries)."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass, replace
from typing import Any, NamedTuple

from veil.hpke import HpkeKeypair
from veil.messages import ENC_SIZE, Ciphertext

# Report states on the leader.
PENDING, IN_JOB, AGGREGATED, REJECTED = 0, 1, 2, 3

# A leader-selected batch (DAP's second batch mode) is one bucket of its own,
# numbered LEADER_SELECTED_BUCKETS plus the first 7 bytes of its 32-byte id:
# beyond every time a report may carry (an upload past now is refused), so
# that no time bucket, no expiry by report time and no time-interval ledger
# entry ever meets it, and within the ledger's bounds (±2**62).
LEADER_SELECTED_BUCKETS = 2**61


def leader_selected_bucket(batch_id: bytes) -> int:
    """The bucket of the leader-selected batch `batch_id`: its aggregate's
    rows, its collection's start (duration 1) and its ledger entry. Two ids
    alike in their first 7 bytes share it, and are then one batch, released
    once and charged once: never a report counted twice."""
    return LEADER_SELECTED_BUCKETS + int.from_bytes(batch_id[:7])


REPORT_STATE_NAMES = {
    PENDING: "pending",
    IN_JOB: "in_job",
    AGGREGATED: "aggregated",
    REJECTED: "rejected",
}

# HPKE key states. A pending key opens ciphertexts but is not advertised yet
# (so every replica knows it before any client uses it); the active key is
# advertised; an expired key is no longer advertised but still opens
# ciphertexts until `expires_at`, when garbage collection deletes it.
KEY_PENDING, KEY_ACTIVE, KEY_EXPIRED = "pending", "active", "expired"
KEY_STATES = (KEY_PENDING, KEY_ACTIVE, KEY_EXPIRED)


# How long to wait before the n-th retry (n = 1, 2, ...) of a failed job.
Backoff = Callable[[int], float]

# Adds two encoded VDAF aggregate shares (field addition, done by the caller's
# VDAF); the store calls it with the bucket's row locked.
ShareMerge = Callable[[bytes, bytes], bytes]


class StorageConflict(Exception):
    """The write contradicts stored state (reused id with other content, collected batch)."""


class BucketCollected(StorageConflict):
    """A write touches a time bucket that a collection has closed."""

    def __init__(self, bucket: int) -> None:
        super().__init__(f"time bucket {bucket} was already collected")
        self.bucket = bucket


class CollectionGone(StorageConflict):
    """A collection job is no longer pending (its collector deleted it, or
    it is done): it closes no batch."""


class ReportsAggregated(StorageConflict):
    """The helper's replay records already hold some of a job's reports: another
    job (on any process) aggregated them after this one read the records."""

    def __init__(self, report_ids: Sequence[bytes]) -> None:
        super().__init__(f"{len(report_ids)} reports were aggregated meanwhile by another job")
        self.report_ids = list(report_ids)


class BatchChanged(StorageConflict):
    """The batch's aggregates changed between the read a collection was
    computed from and the transaction that closes the batch."""


class ReportIdTaken(StorageConflict):
    """A report id is already stored with other content."""

    def __init__(self, report_id: bytes) -> None:
        super().__init__(f"report id {report_id.hex()} is taken by another report")
        self.report_id = report_id


class StoreInUse(Exception):
    """Another process serves from this SQLite database already."""


def is_transient_storage_error(error: BaseException) -> bool:
    """Whether `error` is the database failing for now (locked, restarting,
    unreachable) rather than a fault in the request or in veil: the same
    request may succeed later."""
    if isinstance(error, sqlite3.OperationalError):
        return True  # locked or busy past the timeout, disk I/O, full disk
    import psycopg  # only on this error path
    import psycopg_pool

    return isinstance(
        error, (psycopg.OperationalError, psycopg.InterfaceError, psycopg_pool.PoolTimeout)
    )


class JobReport(NamedTuple):
    """A stored report as the leader's aggregation job reads it: a plain
    tuple of what the row holds, with a `Report`'s fields and its two
    ciphertexts left in their stored form (`Ciphertext.to_bytes`: config
    id, encapsulated key, payload). A job reads thousands: `Report`s and their checks cost about
    twice as much, and a `Ciphertext` of each share with its payload copied
    out about 2 µs a report more (SCALING.md, issue 28's "The leader's job
    driver on Histogram(100,10)"); the driver opens the leader's share in
    place and cuts the helper's only for a report it sends."""

    report_id: bytes
    time: int
    public_share: bytes
    leader_ct_bytes: bytes
    helper_ct_bytes: bytes
    # A task with invitations: the token the report was uploaded with.
    token: bytes = b""

    @property
    def leader_share_digest(self) -> bytes:
        """SHA-256 of the leader's sealed share as stored, which a token's
        challenge commits to (veil.invite.token.sealed_share_digest)."""
        return hashlib.sha256(self.leader_ct_bytes).digest()

    @property
    def helper_ct(self) -> Ciphertext:
        """The helper's ciphertext, cut where `Ciphertext.to_bytes` joined it
        (upload stores none too short to hold a config id and a key)."""
        b, e = self.helper_ct_bytes, 1 + ENC_SIZE
        return Ciphertext(b[0], b[1:e], b[e:])


@dataclass(frozen=True)
class BatchAggregate:
    """The running aggregate of one time bucket (DAP "batch bucket")."""

    bucket: int
    agg_share: bytes | None  # encoded VDAF aggregate share; None while empty
    report_count: int
    checksum: bytes  # XOR of SHA-256(report_id)
    collected_by: bytes | None = None


def merge_aggregate(
    old: BatchAggregate | None, delta: BatchAggregate, merge: ShareMerge
) -> BatchAggregate:
    """`old` plus what one job adds to its bucket (a backend calls this under its lock).

    A closed bucket (collected_by set) still takes the jobs that held its
    reports when it was closed: the collection waits for them before it reads
    the aggregate. Reports that arrive later are refused before they get here.
    """
    if old is None:
        return BatchAggregate(delta.bucket, delta.agg_share, delta.report_count, delta.checksum)
    if old.agg_share is None:
        share = delta.agg_share
    elif delta.agg_share is None:
        share = old.agg_share
    else:
        share = merge(old.agg_share, delta.agg_share)
    return BatchAggregate(
        old.bucket,
        share,
        old.report_count + delta.report_count,
        bytes(x ^ y for x, y in zip(old.checksum, delta.checksum, strict=True)),
        old.collected_by,
    )


# A bucket's aggregate is kept in shard rows, so that jobs over one bucket at
# once (several workers, several helper processes) each lock their own row
# instead of all waiting on one. Shard 0 is the bucket's lock row: it says
# whether the bucket is collected, and holds what was aggregated before shards
# existed. A job adds to one of the shards 1..AGGREGATE_SHARDS; readers see a
# bucket's shard rows and add them up (fold_shards, batch_summary).
AGGREGATE_SHARDS = 32


def aggregate_shard(job_id: bytes) -> int:
    """The shard row a job adds to, fixed by its id (ids are random)."""
    return 1 + int.from_bytes(job_id[:4], "big") % AGGREGATE_SHARDS


def fold_shards(rows: Sequence[BatchAggregate], merge: ShareMerge) -> list[BatchAggregate]:
    """One row per bucket, its shard rows added up (`rows` in bucket order, as
    Datastore.batch_aggregates returns them); collected if any row says so."""
    folded: list[BatchAggregate] = []
    for row in rows:
        if folded and folded[-1].bucket == row.bucket:
            total = merge_aggregate(folded[-1], row, merge)
            folded[-1] = replace(total, collected_by=total.collected_by or row.collected_by)
        else:
            folded.append(row)
    return folded


@dataclass(frozen=True)
class HelperJob:
    """What the helper stores of one aggregation job, in one transaction: the
    job record (request hash and the answer it gave), a replay record per
    report it aggregated or refused after opening (report id, time), the
    rejection reasons and the job's deltas to the batch aggregates."""

    task_id: bytes
    job_id: bytes
    request_hash: bytes
    response: bytes
    reports: Sequence[tuple[bytes, int]]
    rejected: Sequence[str]
    deltas: Sequence[BatchAggregate]
    # The leader-selected batch the job's reports joined (DAP's
    # leader_selected_batch_id); None for a job of time buckets.
    batch_id: bytes | None = None


@dataclass(frozen=True)
class CollectionRecord:
    task_id: bytes
    job_id: bytes
    start: int
    duration: int
    state: str  # pending | finished | failed | deleted (by its collector, over DAP)
    report_count: int = 0
    checksum: bytes = b""
    leader_ct: Ciphertext | None = None
    helper_ct: Ciphertext | None = None
    error_code: int = 0
    error_message: str = ""
    # Poplar1: the aggregation parameter (draft encoding) of this level's
    # collection; empty for Prio3.
    agg_param: bytes = b""


@dataclass(frozen=True)
class PrefixQuery:
    """One aggregation parameter a Poplar1 batch was queried with, on one
    aggregator: the batch, the level and the encoded parameter, and what this
    aggregator summed for it so far (shares of the accepted reports' prefix
    counts, how many reports, the XOR of their SHA-256(report_id)). A batch
    is queried at most once per level; `collected_by` is the collection job
    that released the level's counts."""

    task_id: bytes
    start: int
    duration: int
    level: int
    agg_param: bytes
    agg_share: bytes | None = None
    report_count: int = 0
    checksum: bytes = bytes(32)
    collected_by: bytes | None = None

    @property
    def end(self) -> int:
        return self.start + self.duration


class QueryConflict(StorageConflict):
    """A Poplar1 query contradicts the stored ones: its (batch, level) was
    queried with another parameter, or its batch overlaps another batch."""


class QueryCollected(StorageConflict):
    """A write adds to a (batch, level) whose counts were already released."""


@dataclass(frozen=True)
class HpkeKey:
    """An aggregator's HPKE keypair with its rotation state (see KEY_STATES)."""

    keypair: HpkeKeypair
    state: str
    created: float
    expires_at: float | None = None  # expired keys: deleted by GC after this time

    @property
    def config_id(self) -> int:
        return self.keypair.config.config_id


@dataclass(frozen=True)
class GcResult:
    """How many rows one garbage-collection pass deleted, by kind."""

    reports: int = 0
    aggregation_jobs: int = 0
    batch_aggregates: int = 0
    replay_records: int = 0
    helper_jobs: int = 0
    collections: int = 0
    prefix_reports: int = 0
    prefix_queries: int = 0
    leader_batches: int = 0

    def total(self) -> int:
        return sum(astuple(self))


# The collections table's columns, in CollectionRecord's field order, as
# both backends read and write them.
COLLECTION_COLS = (
    "task_id, job_id, start, duration, state, report_count, checksum, leader_ct,"
    " helper_ct, error_code, error_message, agg_param"
)
# One placeholder per column of COLLECTION_COLS, and the created time.
COLLECTION_PLACEHOLDERS = ", ".join(["?"] * 13)


def collection_from_row(row: Sequence[Any]) -> CollectionRecord:
    t, j, s, d, st, n, c, lc, hc, ec, em, ap = row
    return CollectionRecord(
        bytes(t),
        bytes(j),
        int(s),
        int(d),
        str(st),
        int(n),
        bytes(c),
        None if lc is None else Ciphertext.from_bytes(bytes(lc)),
        None if hc is None else Ciphertext.from_bytes(bytes(hc)),
        int(ec),
        str(em),
        b"" if ap is None else bytes(ap),
    )


def check_batch_unchanged(aggs: Sequence[BatchAggregate], record: CollectionRecord) -> None:
    """Raise BatchChanged unless the batch's rows still add up to the record's
    count and checksum (what its share was computed from)."""
    count, checksum = 0, bytes(32)
    for a in aggs:
        count += a.report_count
        checksum = bytes(x ^ y for x, y in zip(checksum, a.checksum, strict=True))
    if (count, checksum) != (record.report_count, record.checksum):
        raise BatchChanged(
            f"the batch now holds {count} reports, not the {record.report_count} its share"
            " was computed from"
        )


# A stored HPKE key, as both backends write it (``?`` placeholders).
HPKE_KEY_INSERT = (
    "INSERT INTO hpke_keys (config_id, public_key, private_key, created, state, expires_at)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)


def hpke_key_values(key: HpkeKey) -> tuple[object, ...]:
    return (
        key.config_id,
        key.keypair.config.public_key,
        key.keypair.private_key,
        key.created,
        key.state,
        key.expires_at,
    )


def collection_values(r: CollectionRecord) -> tuple[object, ...]:
    return (
        r.task_id,
        r.job_id,
        r.start,
        r.duration,
        r.state,
        r.report_count,
        r.checksum,
        None if r.leader_ct is None else r.leader_ct.to_bytes(),
        None if r.helper_ct is None else r.helper_ct.to_bytes(),
        r.error_code,
        r.error_message,
        r.agg_param or None,
    )


def aggregate_from_row(row: Sequence[Any]) -> BatchAggregate:
    """A batch_aggregates row (bucket, agg_share, report_count, checksum, collected_by)."""
    b, s, n, c, w = row
    return BatchAggregate(
        int(b), None if s is None else bytes(s), int(n), bytes(c), None if w is None else bytes(w)
    )


PREFIX_QUERY_COLS = (
    "task_id, start, duration, level, agg_param, agg_share, report_count, checksum, collected_by"
)


def prefix_query_from_row(row: Sequence[Any]) -> PrefixQuery:
    t, s, d, lv, ap, sh, n, c, w = row
    return PrefixQuery(
        bytes(t),
        int(s),
        int(d),
        int(lv),
        bytes(ap),
        None if sh is None else bytes(sh),
        int(n),
        bytes(c),
        None if w is None else bytes(w),
    )
