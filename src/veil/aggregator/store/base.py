"""`Datastore`: what the leader and helper logic need from storage, its
methods written once over the units of work (veil.aggregator.store.reports,
jobs, collection_jobs, prefix_queries).

A backend (SqliteDatastore in veil.aggregator.store.sqlite, PostgresDatastore in
veil.aggregator.store.postgres) subclasses it and says how a unit runs (`_read`,
`_write`), plus the few operations that are its database's own (first key,
space reclaim, size, close). Every method is one unit of work in one
transaction, so a crash leaves either all of it or none of it."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TypeVar

from veil.aggregator.store import batches, collection_jobs, jobs, prefix_queries, upkeep
from veil.aggregator.store import reports as report_units
from veil.aggregator.store.records import (
    Backoff,
    BatchAggregate,
    CollectionRecord,
    GcResult,
    HelperJob,
    HpkeKey,
    JobReport,
    PrefixQuery,
    ShareMerge,
)
from veil.aggregator.store.tx import Tx
from veil.messages import Report, ReportBatch

T = TypeVar("T")


class Datastore:
    """What the leader and helper logic need from storage (one class for both
    backends; the comments at each group of methods are the contract)."""

    def _read(self, work: Callable[[Tx], T]) -> T:
        """Run a unit that only reads."""
        raise NotImplementedError

    def _write(self, work: Callable[[Tx], T]) -> T:
        """Run a unit in one write transaction (retried where the database asks)."""
        raise NotImplementedError

    def _write_fresh(self, work: Callable[[Tx], T]) -> T:
        """Run a write unit whose reads after a lock wait must see what
        committed during the wait (on PostgreSQL: READ COMMITTED instead of
        one snapshot for the whole unit). SQLite's write lock is taken before
        the first read, so there a unit is always fresh."""
        return self._write(work)

    # --- both roles -------------------------------------------------------
    #
    # batch_aggregates: the shard rows of the buckets in [start, end), in
    #   bucket order with the lock row (shard 0) first; a bucket's rows add
    #   up to its aggregate (fold_shards, core.batch_summary), and only the
    #   lock row says who collected it. Rows that hold nothing are left out.

    def batch_aggregates(self, task_id: bytes, start: int, end: int) -> list[BatchAggregate]:
        return self._read(lambda tx: report_units.batch_aggregates(tx, task_id, start, end))

    def rejections(self, task_id: bytes) -> dict[str, int]:
        return self._read(lambda tx: report_units.rejections(tx, task_id))

    # --- leader -----------------------------------------------------------
    #
    # finish_aggregation_job: `deferred` maps the reports the helper found
    #   too early to the seconds they wait, as pending, before a new job
    #   takes them (create_aggregation_job leaves them out until then).
    #   The outcomes and `deferred` together name each report of the job
    #   once: the aggregated ones are set by the job id, as the reports
    #   left in the job (StorageConflict if they are not as many).
    # deferred_count: pending reports waiting because the helper found them
    #   too early. record_peer_clock / peer_clocks: the latest measured
    #   offset of a helper's clock from the leader's (veil.aggregator.leader.skew),
    #   as (peer, offset, uncertainty, measured), one row per helper address.

    def put_reports(self, task_id: bytes, reports: Sequence[tuple[int, Report]]) -> tuple[int, int]:
        """Store (bucket, report) pairs (of a report id given twice, the last)."""
        last = {r.report_id: r for _, r in reports}
        batch = ReportBatch.of(list(last.values()))
        return self.put_report_batch(task_id, {b for b, _ in reports}, batch)

    def put_report_batch(
        self, task_id: bytes, buckets: Collection[int], batch: ReportBatch
    ) -> tuple[int, int]:
        """Store a batch of reports with distinct ids, each in one of `buckets`."""
        return self._write(lambda tx: report_units.put_reports(tx, task_id, buckets, batch))

    def abandon_aggregation_job(
        self, task_id: bytes, job_id: bytes, reason: str, error: str
    ) -> int:
        return self._write(
            lambda tx: jobs.abandon_aggregation_job(tx, task_id, job_id, reason, error)
        )

    def create_aggregation_job(self, task_id: bytes, job_id: bytes, limit: int) -> int:
        return self._write(lambda tx: jobs.create_aggregation_job(tx, task_id, job_id, limit))

    # --- leader-selected batches (veil.aggregator.store.batches) ------------

    def create_batch_job(
        self, task_id: bytes, job_id: bytes, limit: int, floor: int, new: bytes, oldest: int | None
    ) -> int:
        return self._write(
            lambda tx: batches.create_batch_job(tx, task_id, job_id, limit, floor, new, oldest)
        )

    def job_batch(self, task_id: bytes, job_id: bytes) -> bytes | None:
        return self._read(lambda tx: batches.job_batch(tx, task_id, job_id))

    def ready_batch(self, task_id: bytes, min_batch_size: int) -> tuple[bytes, int] | None:
        return self._read(lambda tx: batches.ready_batch(tx, task_id, min_batch_size))

    def batch_of_bucket(self, task_id: bytes, bucket: int) -> bytes | None:
        return self._read(lambda tx: batches.batch_of_bucket(tx, task_id, bucket))

    def batch_unfinished(self, task_id: bytes, batch_id: bytes) -> bool:
        return self._read(lambda tx: batches.batch_unfinished(tx, task_id, batch_id))

    def acquire_aggregation_jobs(
        self, owner: str, lease_seconds: float, limit: int
    ) -> list[tuple[bytes, bytes]]:
        return self._write(
            lambda tx: jobs.acquire_aggregation_jobs(tx, owner, lease_seconds, limit)
        )

    def renew_aggregation_job(
        self, task_id: bytes, job_id: bytes, owner: str, lease_seconds: float
    ) -> bool:
        return self._write(
            lambda tx: jobs.renew_aggregation_job(tx, task_id, job_id, owner, lease_seconds)
        )

    def finish_aggregation_job(
        self,
        task_id: bytes,
        job_id: bytes,
        outcomes: Mapping[bytes, str | None],
        deltas: Sequence[BatchAggregate],
        merge: ShareMerge,
        deferred: Mapping[bytes, float] | None = None,
    ) -> None:
        self._write(
            lambda tx: jobs.finish_aggregation_job(
                tx, task_id, job_id, outcomes, deltas, merge, deferred or {}
            )
        )

    def defer_aggregation_job(
        self, task_id: bytes, job_id: bytes, error: str, backoff: Backoff
    ) -> int:
        return self._write(
            lambda tx: jobs.defer_aggregation_job(tx, task_id, job_id, error, backoff)
        )

    def acquire_collections(
        self, owner: str, lease_seconds: float, limit: int
    ) -> list[CollectionRecord]:
        return self._write(
            lambda tx: collection_jobs.acquire_collections(tx, owner, lease_seconds, limit)
        )

    def renew_collection(
        self, task_id: bytes, job_id: bytes, owner: str, lease_seconds: float
    ) -> bool:
        return self._write(
            lambda tx: collection_jobs.renew_collection(tx, task_id, job_id, owner, lease_seconds)
        )

    def defer_collection(
        self, task_id: bytes, job_id: bytes, code: int, message: str, backoff: Backoff
    ) -> float:
        return self._write(
            lambda tx: collection_jobs.defer_collection(tx, task_id, job_id, code, message, backoff)
        )

    def note_collections(self, task_ids: Sequence[bytes], code: int, message: str) -> int:
        return self._write(lambda tx: collection_jobs.note_waiting(tx, task_ids, code, message))

    def open_aggregation_jobs(self) -> list[tuple[bytes, bytes]]:
        return self._read(jobs.open_aggregation_jobs)

    def job_reports(self, task_id: bytes, job_id: bytes) -> list[JobReport]:
        return self._read(lambda tx: report_units.job_reports(tx, task_id, job_id))

    def unaggregated_count(self, task_id: bytes, start: int, end: int) -> int:
        return self._read(lambda tx: report_units.unaggregated_count(tx, task_id, start, end))

    def has_unaggregated(self, task_id: bytes, start: int, end: int) -> bool:
        """Whether unaggregated_count would be above 0, without counting (a
        poll waiting for aggregation to finish)."""
        return self._read(lambda tx: report_units.has_unaggregated(tx, task_id, start, end))

    def deferred_count(self, task_id: bytes) -> int:
        return self._read(lambda tx: report_units.deferred_count(tx, task_id))

    def record_peer_clock(
        self, peer: str, offset: float, uncertainty: float, measured: float
    ) -> None:
        self._write(
            lambda tx: report_units.record_peer_clock(tx, peer, offset, uncertainty, measured)
        )

    def peer_clocks(self) -> list[tuple[str, float, float, float]]:
        return self._read(report_units.peer_clocks)

    def aggregation_job_errors(self, task_id: bytes) -> dict[bytes, tuple[str, int, str]]:
        return self._read(lambda tx: jobs.aggregation_job_errors(tx, task_id))

    def put_collection(self, record: CollectionRecord) -> CollectionRecord:
        return self._write(lambda tx: collection_jobs.put_collection(tx, record))

    def get_collection(self, task_id: bytes, job_id: bytes) -> CollectionRecord | None:
        return self._read(lambda tx: collection_jobs.get_collection(tx, task_id, job_id))

    def update_collection(self, record: CollectionRecord) -> None:
        self._write(lambda tx: collection_jobs.update_collection(tx, record))

    def fail_collection(self, record: CollectionRecord, reopen: bool) -> None:
        self._write(lambda tx: collection_jobs.fail_collection(tx, record, reopen))

    def delete_collection(self, task_id: bytes, job_id: bytes) -> str | None:
        """Delete a collection job for its collector (see
        collection_jobs.delete_collection): "discarded", "deleted" or None."""
        return self._write(lambda tx: collection_jobs.delete_collection(tx, task_id, job_id))

    def close_batch(self, task_id: bytes, start: int, end: int, job_id: bytes, step: int) -> None:
        """Mark every bucket of [start, end) collected by `job_id` (idempotent for that job)."""
        self._write(lambda tx: report_units.close_batch(tx, task_id, start, end, job_id, step))

    def close_collection_batch(self, record: CollectionRecord, step: int) -> None:
        """close_batch for a pending collection job, serialized with its deletion
        (collection_jobs.close_collection_batch); CollectionGone if not pending."""
        self._write(lambda tx: collection_jobs.close_collection_batch(tx, record, step))

    # --- helper -----------------------------------------------------------
    #
    # Any number of helper processes may share one PostgreSQL store: what
    # keeps them correct is in these transactions, not in a process's lock.
    # seen_reports: which of the ids have a replay record (one query).
    # commit_helper_job: in one transaction, the job record, a replay record
    #   (report id, time, job id) for each of `reports`, the rejection counts
    #   and the deltas merged into the batch aggregates. If the job id is
    #   already stored (another process finished it first) nothing is written
    #   and the stored (request_hash, response) is returned. ReportsAggregated
    #   if a replay record exists for one of `reports` (the primary key is the
    #   replay protection: a report id is aggregated at most once);
    #   BucketCollected if a delta's bucket has been collected. Either way
    #   nothing is written and the caller checks the job again.
    # commit_helper_collection: in one transaction, close the batch for the
    #   record's job id and store the record; returns the stored record, which
    #   is another process's if it stored one for that job id first.
    #   BucketCollected if another job collected a bucket of it; BatchChanged
    #   if the batch's count or checksum is no longer the record's.

    def helper_job(self, task_id: bytes, job_id: bytes) -> tuple[bytes, bytes] | None:
        return self._read(lambda tx: jobs.helper_job(tx, task_id, job_id))

    def helper_job_batch(self, task_id: bytes, job_id: bytes) -> bytes | None:
        return self._read(lambda tx: jobs.helper_job_batch(tx, task_id, job_id))

    def seen_reports(self, task_id: bytes, report_ids: Sequence[bytes]) -> set[bytes]:
        return self._read(lambda tx: report_units.seen_reports(tx, task_id, report_ids))

    def commit_helper_job(self, job: HelperJob, merge: ShareMerge) -> tuple[bytes, bytes] | None:
        return self._write(lambda tx: jobs.commit_helper_job(tx, job, merge))

    def commit_helper_collection(self, record: CollectionRecord, step: int) -> CollectionRecord:
        return self._write_fresh(
            lambda tx: collection_jobs.commit_helper_collection(tx, record, step)
        )

    # --- Poplar1 queries (both roles) --------------------------------------
    #
    # A Poplar1 batch is queried once per level (prefix_queries rows).
    # prefix_queries: every query of the batches overlapping [start, end).
    # record_prefix_query: in one transaction, close the batch's buckets
    #   (prefix_queries.PREFIX_BATCH_MARK) and record the query unless its (batch,
    #   level) is stored; returns the stored query. `check` gets the batch's
    #   earlier queries and raises on a parameter they do not allow;
    #   QueryConflict if the batch overlaps another queried batch.
    # create_prefix_collection (leader): the collection job and its query,
    #   recorded as collected by the job, in one transaction; the stored job
    #   for a known id; QueryCollected if the level has another collection.
    # total_prefix_query (leader): the level's sum in its query's row, stored
    #   before the helper is asked to release it (a restarted driver resumes
    #   from it: the helper's release is never asked of jobs run again).
    # finish_prefix_collection (leader): the query's sum and the finished job.
    # seen_prefix_reports / commit_prefix_job (helper): replay records per
    #   (batch, level), and the second round's job record, replay records,
    #   rejection counts and sum, as commit_helper_job for Prio3.
    # asked_prefix_reports (helper): how many replay records a (batch, level)
    #   holds: the reports it verified, accepted or rejected (the floor's count).
    # collect_prefix_query (helper): mark the level released and store the
    #   collection record; BatchChanged if its sum changed, QueryCollected if
    #   another collection released it.
    # batch_reports (leader): the stored reports of [start, end), by id.

    def prefix_queries(self, task_id: bytes, start: int, end: int) -> list[PrefixQuery]:
        return self._read(lambda tx: prefix_queries.prefix_queries(tx, task_id, start, end))

    def prefix_query(self, task_id: bytes, start: int, level: int) -> PrefixQuery | None:
        return self._read(lambda tx: prefix_queries.prefix_query(tx, task_id, start, level))

    def record_prefix_query(
        self, query: PrefixQuery, check: Callable[[list[PrefixQuery]], None], step: int
    ) -> PrefixQuery:
        return self._write_fresh(
            lambda tx: prefix_queries.record_prefix_query(tx, query, check, step)
        )

    def create_prefix_collection(
        self,
        record: CollectionRecord,
        query: PrefixQuery,
        check: Callable[[list[PrefixQuery]], None],
        step: int,
    ) -> CollectionRecord:
        return self._write_fresh(
            lambda tx: prefix_queries.create_prefix_collection(tx, record, query, check, step)
        )

    def total_prefix_query(
        self, record: CollectionRecord, level: int, agg_share: bytes | None
    ) -> None:
        self._write(lambda tx: prefix_queries.total_prefix_query(tx, record, level, agg_share))

    def finish_prefix_collection(
        self, record: CollectionRecord, level: int, agg_share: bytes | None
    ) -> None:
        self._write(
            lambda tx: prefix_queries.finish_prefix_collection(tx, record, level, agg_share)
        )

    def seen_prefix_reports(
        self, task_id: bytes, start: int, level: int, report_ids: Sequence[bytes]
    ) -> set[bytes]:
        return self._read(
            lambda tx: prefix_queries.seen_prefix_reports(tx, task_id, start, level, report_ids)
        )

    def asked_prefix_reports(self, task_id: bytes, start: int, level: int) -> int:
        return self._read(lambda tx: prefix_queries.asked_prefix_reports(tx, task_id, start, level))

    def commit_prefix_job(
        self, job: HelperJob, start: int, level: int, merge: ShareMerge
    ) -> tuple[bytes, bytes] | None:
        return self._write(
            lambda tx: prefix_queries.commit_prefix_job(tx, job, start, level, merge)
        )

    def collect_prefix_query(self, record: CollectionRecord, level: int) -> CollectionRecord:
        return self._write_fresh(lambda tx: prefix_queries.collect_prefix_query(tx, record, level))

    def batch_reports(self, task_id: bytes, start: int, end: int) -> list[Report]:
        return self._read(lambda tx: report_units.batch_reports(tx, task_id, start, end))

    # --- operations: keys, garbage collection, status (both roles) -------
    #
    # commit_helper_job (above) also records what GC reads: the job id and
    # report time of each replay record, the job record's time (see
    # upkeep.collect_garbage).
    # hpke_keys: every key with its state, oldest first.
    # activate_hpke_key: in one transaction, make `config_id` (pending or
    #   active) the active key and every other active key expired with
    #   expires_at = now + grace; StorageConflict if the key is unknown or
    #   expired.
    # delete_expired_hpke_keys: delete expired keys with expires_at <= now;
    #   returns their config ids.
    # collect_garbage: one transaction deleting, for one task, what no rule
    #   needs any more (see upkeep.collect_garbage for the rules; they are
    #   the contract).
    # report_counts: leader reports per time bucket and state name
    #   (REPORT_STATE_NAMES), for status.
    # collections: every collection job of the task, oldest first.

    def hpke_keys(self) -> list[HpkeKey]:
        return self._read(upkeep.hpke_keys)

    def add_hpke_key(self, key: HpkeKey) -> None:
        """Insert a key; StorageConflict if its config id is taken."""
        self._write(lambda tx: upkeep.add_hpke_key(tx, key))

    def add_first_hpke_key(self, key: HpkeKey) -> bool:
        """Store `key` if no key is stored yet, in one step: of processes
        starting together on a new database one adds its key (True), the
        others add none (False) and read the winner's."""
        return self._write(lambda tx: upkeep.add_first_hpke_key(tx, key))

    def activate_hpke_key(self, config_id: int, now: float, grace: float) -> None:
        self._write(lambda tx: upkeep.activate_hpke_key(tx, config_id, now, grace))

    def collect_garbage(
        self,
        task_id: bytes,
        time_precision: int,
        report_horizon: int | None,
        job_horizon: float | None,
        last_level: int | None = None,
    ) -> GcResult:
        return self._write(
            lambda tx: upkeep.collect_garbage(
                tx, task_id, time_precision, report_horizon, job_horizon, last_level
            )
        )

    def delete_expired_hpke_keys(self, now: float) -> list[int]:
        return self._write(lambda tx: upkeep.delete_expired_hpke_keys(tx, now))

    def report_counts(self, task_id: bytes, time_precision: int) -> dict[int, dict[str, int]]:
        return self._read(lambda tx: report_units.report_counts(tx, task_id, time_precision))

    def collections(self, task_id: bytes) -> list[CollectionRecord]:
        return self._read(lambda tx: collection_jobs.collections(tx, task_id))

    # --- what each backend writes for its own database ---------------------

    def reclaim_space(self, full: bool = False) -> None:
        """Return freed space to the file system where the backend does not do
        so itself (`full`: a complete rewrite, e.g. VACUUM FULL)."""
        raise NotImplementedError

    def size_bytes(self) -> int:
        """Bytes the database occupies on disk."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the connections."""
        raise NotImplementedError
