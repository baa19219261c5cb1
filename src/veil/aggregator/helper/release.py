"""The helper's release of an aggregate share (draft-ietf-ppm-dap section
4.6, helper side), one step for every kind of task.

A release is asked with the leader's count and checksum of what it
aggregated. The helper checks them against its own, its floor
(min_batch_size) and the field's ceiling, charges its own ledger, adds its
noise in the field the engine says its shares live in, seals the share to
the collector and commits it with the closing of what it released, in one
transaction. A collection job asked again gets the stored ciphertext: noise
is never drawn again for a share that may have left. What is released is
the one difference between the kinds, a `ReleaseTarget`: a batch of a
task's time buckets (`Buckets`) or one level of a batch's queries
(`Level`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from veil.aggregator.context import TaskContext, TaskTable
from veil.aggregator.core import (
    authorize,
    batch_summary,
    check_batch_size,
    check_id,
    check_interval,
    check_window_agrees,
    check_window_closed,
    seal_share,
)
from veil.aggregator.errors import (
    AggParamRefused,
    BatchCollected,
    BatchMismatch,
    BatchTooSmall,
    JobConflict,
    LevelCollected,
)
from veil.aggregator.helper.queries import HelperQueries
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.records import (
    BatchChanged,
    BucketCollected,
    CollectionRecord,
    QueryCollected,
)
from veil.hpke import ROLE_HELPER, Ciphertext
from veil.metrics import Metrics
from veil.task import HelperTask

log = logging.getLogger(__name__)

# Seals an encoded aggregate share to the collector (veil's own seal_share
# unless given).
Seal = Callable[[bytes], Ciphertext]


class ReleaseTarget(Protocol):
    """What one release is of, and what differs with it."""

    agg_param: Any
    encoded: bytes

    def summary(self) -> tuple[list[int], int, bytes, int]:
        """(aggregate share, report count, checksum, the floor's count), after
        the target's own checks (not released to another collection)."""
        ...

    def mismatch(self) -> BatchMismatch: ...

    def too_small(self, floor: int) -> BatchTooSmall: ...

    def commit(self, record: CollectionRecord) -> CollectionRecord:
        """Store the release and close what it released, in one transaction;
        the record stored (another process's if it committed first)."""
        ...

    def released(self, stored: CollectionRecord, mine: Ciphertext) -> None:
        """Count and log a release this process committed."""
        ...


class HelperRelease:
    """The helper's releases for the tasks in `tasks`."""

    def __init__(
        self,
        tasks: TaskTable[HelperTask],
        store: Datastore,
        clock: Callable[[], float],
        privacy: PrivacyEngine,
        queries: HelperQueries,
        metrics: Metrics | None = None,
    ) -> None:
        self.tasks = tasks
        self.store = store
        self.clock = clock
        self.privacy = privacy
        self.queries = queries
        self.metrics = metrics

    def aggregate_share(
        self,
        task_id: bytes,
        token: str | None,
        collection_id: bytes,
        start: int,
        duration: int,
        report_count: int,
        checksum: bytes,
        agg_param: bytes = b"",
        window: tuple[int, int] | None = None,
        seal: Seal | None = None,
        batch_id: bytes | None = None,
    ) -> Ciphertext:
        """The helper's noised aggregate share of a batch (or of one level of
        a batch, named by `agg_param`), sealed to the collector; the same
        bytes on a retry. `window` is the task's in the leader's file
        (check_window_agrees). `seal` seals the encoded share where the
        protocol binds another context than veil's (DAP's). `batch_id`
        names a batch the leader chose (DAP's leader-selected mode), whose
        bucket is [start, +1): it has no interval to check, and its window
        need not have closed, since no later report joins a batch once
        formed."""
        ctx = self.tasks.context(task_id)
        task = ctx.task
        authorize(task, token, task.aggregator_token_hash, "aggregator")
        check_window_agrees(task, window)
        if ctx.queries is None and agg_param:
            HelperQueries.rules(ctx)  # InvalidMessage: no aggregation parameter
        check_id(collection_id, "collection_job_id")
        target: ReleaseTarget
        if ctx.queries is not None:
            target = Level(self, ctx, agg_param, start, duration, collection_id)
        else:
            target = Buckets(self, ctx, start, duration, collection_id, batch_id)
        if batch_id is None:
            check_interval(task, start, duration)
            check_window_closed(task, start, self.clock())
        stored = self.store.get_collection(task_id, collection_id)
        if stored is None:
            # Computed without a lock; the commit closes what it released
            # and checks, in one transaction, that it still holds what the
            # share was computed from, and returns what another process
            # stored first.
            stored = self.release(
                ctx, target, collection_id, start, duration, report_count, checksum, seal
            )
        if (stored.start, stored.duration, stored.agg_param) != (
            start,
            duration,
            agg_param,
        ) or stored.helper_ct is None:
            raise JobConflict(
                f"collection job {collection_id.hex()} was for another batch"
                + (" or parameter" if ctx.queries is not None else "")
            )
        return stored.helper_ct

    def release(
        self,
        ctx: TaskContext[HelperTask],
        target: ReleaseTarget,
        collection_id: bytes,
        start: int,
        duration: int,
        report_count: int,
        checksum: bytes,
        seal: Seal | None = None,
    ) -> CollectionRecord:
        """The one release step: the counts, the floor, the ceiling, the
        ledger, the noise, the seal and the commit."""
        task, engine = ctx.task, ctx.engine
        share, count, mine, floor_count = target.summary()
        if count != report_count or mine != checksum:
            raise target.mismatch()
        if floor_count < task.min_batch_size:
            raise target.too_small(task.min_batch_size)
        check_batch_size(task, ctx.bounds, count)
        self.privacy.check(task, start, duration, collection_id)
        agg_param = target.agg_param
        noised, _ = self.privacy.release_in(
            task, engine.noise_modulus(agg_param), collection_id, start, duration, share
        )
        encoded = engine.encode_agg_share(agg_param, noised)
        if seal is not None:
            ct = seal(encoded)
        else:
            ct = seal_share(task, ROLE_HELPER, start, duration, count, encoded, target.encoded)
        record = CollectionRecord(
            task.task_id,
            collection_id,
            start,
            duration,
            "finished",
            count,
            checksum,
            None,
            ct,
            agg_param=target.encoded,
        )
        stored = target.commit(record)
        target.released(stored, ct)
        return stored


class Buckets:
    """A batch of a task's time buckets (the aggregation parameter empty):
    released once, the floor on the reports it counts."""

    agg_param = None
    encoded = b""

    def __init__(
        self,
        release: HelperRelease,
        ctx: TaskContext[HelperTask],
        start: int,
        duration: int,
        collection_id: bytes,
        batch_id: bytes | None = None,
    ) -> None:
        self.release = release
        self.ctx = ctx
        self.start, self.duration = start, duration
        self.collection_id = collection_id
        self.batch_id = batch_id

    def _batch(self) -> str:
        if self.batch_id is not None:
            return f"batch {self.batch_id.hex()}"
        return f"the batch overlapping [{self.start}, +{self.duration})"

    def _where(self, bucket: int) -> str:
        return "" if self.batch_id is not None else f" (time bucket {bucket})"

    def summary(self) -> tuple[list[int], int, bytes, int]:
        task_id = self.ctx.task.task_id
        aggs = self.release.store.batch_aggregates(task_id, self.start, self.start + self.duration)
        for a in aggs:
            if a.collected_by is not None and a.collected_by != self.collection_id:
                raise BatchCollected(
                    f"{self._batch()} was already collected{self._where(a.bucket)}; a batch is"
                    " collected at most once"
                )
        share, count, checksum = batch_summary(self.ctx.engine, aggs)
        return share, count, checksum, count

    def mismatch(self) -> BatchMismatch:
        # No counts: this message reaches the collector, and the helper's
        # count may be below min_batch_size (issue 13).
        return BatchMismatch(
            "the helper's report count or checksum of this batch differs from the"
            " leader's: retry after pending aggregation jobs finish"
        )

    def too_small(self, floor: int) -> BatchTooSmall:
        return BatchTooSmall(f"the batch holds fewer than min_batch_size ({floor}) reports")

    def commit(self, record: CollectionRecord) -> CollectionRecord:
        try:
            return self.release.store.commit_helper_collection(record, self.ctx.task.time_precision)
        except BucketCollected as e:
            raise BatchCollected(
                f"{self._batch()} was already collected{self._where(e.bucket)}; a batch is"
                " collected at most once"
            ) from None
        except BatchChanged:
            # An aggregation job committed between the read and the close:
            # the leader retries, and this collection (already charged, if
            # at all) is computed again.
            raise BatchMismatch(
                "the batch changed while its share was computed: retry after pending"
                " aggregation jobs finish"
            ) from None

    def released(self, stored: CollectionRecord, mine: Ciphertext) -> None:
        if stored.helper_ct != mine:
            return  # another process released it first, and counted it
        task = self.ctx.task
        metrics = self.release.metrics
        if metrics is not None:
            metrics.collections.labels(task.id_text, "finished").inc()
            self.release.privacy.report_budget(task, metrics)
        log.info(
            "released helper share for %d reports",
            stored.report_count,
            extra={"task_id": task.id_text, "job_id": self.collection_id.hex()},
        )


class Level:
    """One level of a batch's queries: released once, the floor on the
    reports the level verified (accepted or not)."""

    def __init__(
        self,
        release: HelperRelease,
        ctx: TaskContext[HelperTask],
        encoded: bytes,
        start: int,
        duration: int,
        collection_id: bytes,
    ) -> None:
        self.release = release
        self.ctx = ctx
        self.encoded = encoded
        self.agg_param = HelperQueries.rules(ctx).parse(encoded)
        self.start, self.duration = start, duration
        self.collection_id = collection_id

    def summary(self) -> tuple[list[int], int, bytes, int]:
        task, level = self.ctx.task, self.agg_param.level
        store = self.release.store
        query = store.prefix_query(task.task_id, self.start, level)
        if query is None or query.duration != self.duration or query.agg_param != self.encoded:
            raise AggParamRefused(
                f"the helper aggregated no query of this batch with this parameter at level"
                f" {level}: run its aggregation jobs first"
            )
        if query.collected_by is not None and query.collected_by != self.collection_id:
            raise LevelCollected(
                f"level {level} of the batch was already collected: a batch is"
                " collected once per level"
            )
        engine = self.ctx.engine
        share = (
            engine.agg_init(self.agg_param)
            if query.agg_share is None
            else engine.decode_agg_share(self.agg_param, query.agg_share)
        )
        # The floor on the reports this level verified, accepted or rejected
        # (its replay records), not on the accepted: a client cannot choose
        # the level at which it is rejected, so that an honest leader's batch
        # reaches the floor at every level or at none (told once).
        floor_count = store.asked_prefix_reports(task.task_id, self.start, level)
        return share, query.report_count, query.checksum, floor_count

    def mismatch(self) -> BatchMismatch:
        # No counts: this message reaches the collector.
        return BatchMismatch(
            "the helper's report count or checksum of this query differs from the"
            " leader's: retry after pending aggregation jobs finish"
        )

    def too_small(self, floor: int) -> BatchTooSmall:
        return BatchTooSmall(
            f"the batch holds fewer than min_batch_size ({floor}) reports verified at this level"
        )

    def commit(self, record: CollectionRecord) -> CollectionRecord:
        level = self.agg_param.level
        task_id = self.ctx.task.task_id
        try:
            return self.release.store.collect_prefix_query(record, level)
        except QueryCollected:
            raise LevelCollected(f"level {level} of the batch was already collected") from None
        except BatchChanged:
            raise BatchMismatch(
                "the query changed while its share was computed: retry after pending"
                " aggregation jobs finish"
            ) from None
        finally:
            self.release.queries.forget(task_id, self.start, self.duration, self.encoded)

    def released(self, stored: CollectionRecord, mine: Ciphertext) -> None:
        task, level = self.ctx.task, self.agg_param.level
        metrics = self.release.metrics
        if metrics is not None:
            metrics.prefix_levels.labels(task.id_text, str(level), "finished").inc()
            metrics.prefix_candidates.labels(task.id_text, str(level)).set(
                len(self.agg_param.prefixes)
            )
            metrics.collections.labels(task.id_text, "finished").inc()
            self.release.privacy.report_budget(task, metrics)
        log.info(
            "released helper prefix counts of level %d",
            level,
            extra={"task_id": task.id_text, "job_id": self.collection_id.hex()},
        )
