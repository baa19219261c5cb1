"""The Datastore methods written once, over the units of work: a backend
subclasses UnitStore and says only how a unit runs (`_read`, `_write`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from veil.aggregator.store import units
from veil.aggregator.store.records import (
    Backoff,
    BatchAggregate,
    CollectionRecord,
    GcResult,
    HelperJob,
    HpkeKey,
    ShareMerge,
)
from veil.aggregator.store.tx import Tx
from veil.messages import Report

T = TypeVar("T")


class UnitStore:
    """Datastore methods shared by the backends (see veil.aggregator.storage)."""

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

    def batch_aggregates(self, task_id: bytes, start: int, end: int) -> list[BatchAggregate]:
        return self._read(lambda tx: units.batch_aggregates(tx, task_id, start, end))

    def rejections(self, task_id: bytes) -> dict[str, int]:
        return self._read(lambda tx: units.rejections(tx, task_id))

    # --- leader -----------------------------------------------------------

    def put_reports(self, task_id: bytes, reports: Sequence[tuple[int, Report]]) -> tuple[int, int]:
        return self._write(lambda tx: units.put_reports(tx, task_id, reports))

    def abandon_aggregation_job(
        self, task_id: bytes, job_id: bytes, reason: str, error: str
    ) -> int:
        return self._write(
            lambda tx: units.abandon_aggregation_job(tx, task_id, job_id, reason, error)
        )

    def create_aggregation_job(self, task_id: bytes, job_id: bytes, limit: int) -> int:
        return self._write(lambda tx: units.create_aggregation_job(tx, task_id, job_id, limit))

    def acquire_aggregation_jobs(
        self, owner: str, lease_seconds: float, limit: int
    ) -> list[tuple[bytes, bytes]]:
        return self._write(
            lambda tx: units.acquire_aggregation_jobs(tx, owner, lease_seconds, limit)
        )

    def renew_aggregation_job(
        self, task_id: bytes, job_id: bytes, owner: str, lease_seconds: float
    ) -> bool:
        return self._write(
            lambda tx: units.renew_aggregation_job(tx, task_id, job_id, owner, lease_seconds)
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
            lambda tx: units.finish_aggregation_job(
                tx, task_id, job_id, outcomes, deltas, merge, deferred or {}
            )
        )

    def defer_aggregation_job(
        self, task_id: bytes, job_id: bytes, error: str, backoff: Backoff
    ) -> int:
        return self._write(
            lambda tx: units.defer_aggregation_job(tx, task_id, job_id, error, backoff)
        )

    def acquire_collections(
        self, owner: str, lease_seconds: float, limit: int
    ) -> list[CollectionRecord]:
        return self._write(lambda tx: units.acquire_collections(tx, owner, lease_seconds, limit))

    def defer_collection(
        self, task_id: bytes, job_id: bytes, code: int, message: str, backoff: Backoff
    ) -> float:
        return self._write(
            lambda tx: units.defer_collection(tx, task_id, job_id, code, message, backoff)
        )

    def open_aggregation_jobs(self) -> list[tuple[bytes, bytes]]:
        return self._read(units.open_aggregation_jobs)

    def job_reports(self, task_id: bytes, job_id: bytes) -> list[Report]:
        return self._read(lambda tx: units.job_reports(tx, task_id, job_id))

    def unaggregated_count(self, task_id: bytes, start: int, end: int) -> int:
        return self._read(lambda tx: units.unaggregated_count(tx, task_id, start, end))

    def deferred_count(self, task_id: bytes) -> int:
        return self._read(lambda tx: units.deferred_count(tx, task_id))

    def record_peer_clock(
        self, peer: str, offset: float, uncertainty: float, measured: float
    ) -> None:
        self._write(lambda tx: units.record_peer_clock(tx, peer, offset, uncertainty, measured))

    def peer_clocks(self) -> list[tuple[str, float, float, float]]:
        return self._read(units.peer_clocks)

    def aggregation_job_errors(self, task_id: bytes) -> dict[bytes, tuple[str, int, str]]:
        return self._read(lambda tx: units.aggregation_job_errors(tx, task_id))

    def put_collection(self, record: CollectionRecord) -> CollectionRecord:
        return self._write(lambda tx: units.put_collection(tx, record))

    def get_collection(self, task_id: bytes, job_id: bytes) -> CollectionRecord | None:
        return self._read(lambda tx: units.get_collection(tx, task_id, job_id))

    def update_collection(self, record: CollectionRecord) -> None:
        self._write(lambda tx: units.update_collection(tx, record))

    def fail_collection(self, record: CollectionRecord, reopen: bool) -> None:
        self._write(lambda tx: units.fail_collection(tx, record, reopen))

    def close_batch(self, task_id: bytes, start: int, end: int, job_id: bytes, step: int) -> None:
        """Mark every bucket of [start, end) collected by `job_id` (idempotent for that job)."""
        self._write(lambda tx: units.close_batch(tx, task_id, start, end, job_id, step))

    # --- helper -----------------------------------------------------------

    def helper_job(self, task_id: bytes, job_id: bytes) -> tuple[bytes, bytes] | None:
        return self._read(lambda tx: units.helper_job(tx, task_id, job_id))

    def seen_reports(self, task_id: bytes, report_ids: Sequence[bytes]) -> set[bytes]:
        return self._read(lambda tx: units.seen_reports(tx, task_id, report_ids))

    def commit_helper_job(self, job: HelperJob, merge: ShareMerge) -> tuple[bytes, bytes] | None:
        return self._write(lambda tx: units.commit_helper_job(tx, job, merge))

    def commit_helper_collection(self, record: CollectionRecord, step: int) -> CollectionRecord:
        return self._write_fresh(lambda tx: units.commit_helper_collection(tx, record, step))

    # --- operations: keys, status -----------------------------------------

    def hpke_keys(self) -> list[HpkeKey]:
        return self._read(units.hpke_keys)

    def activate_hpke_key(self, config_id: int, now: float, grace: float) -> None:
        self._write(lambda tx: units.activate_hpke_key(tx, config_id, now, grace))

    def collect_garbage(
        self,
        task_id: bytes,
        time_precision: int,
        report_horizon: int | None,
        job_horizon: float | None,
    ) -> GcResult:
        return self._write(
            lambda tx: units.collect_garbage(
                tx, task_id, time_precision, report_horizon, job_horizon
            )
        )

    def delete_expired_hpke_keys(self, now: float) -> list[int]:
        return self._write(lambda tx: units.delete_expired_hpke_keys(tx, now))

    def report_counts(self, task_id: bytes, time_precision: int) -> dict[int, dict[str, int]]:
        return self._read(lambda tx: units.report_counts(tx, task_id, time_precision))

    def collections(self, task_id: bytes) -> list[CollectionRecord]:
        return self._read(lambda tx: units.collections(tx, task_id))
