"""Collections (draft-ietf-ppm-dap section 4.6, leader side): the
collector's requests, and the driver that completes each pending collection
job with the helper's aggregate share and the leader's own.

A collection waits until its batch holds no unaggregated report, so it never
races an aggregation job over the same reports.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from veil.aggregator.context import TaskTable
from veil.aggregator.core import (
    authorize,
    batch_summary,
    check_batch_size,
    check_id,
    check_interval,
    check_window_closed,
)
from veil.aggregator.errors import (
    STATUS_CODES,
    AggregatorError,
    BatchCollected,
    BatchTooLarge,
    BatchTooSmall,
    Internal,
    InvalidAggParam,
    JobConflict,
    NoiseUnavailable,
    NotFound,
    Unavailable,
    WindowMismatch,
    WindowOpen,
)
from veil.aggregator.keys import KeyRing
from veil.aggregator.leader.control import Backoff, DriverControl
from veil.aggregator.leader.meter import LeaderMeter
from veil.aggregator.leader.peer import HelperPeer, helper_of
from veil.aggregator.leader.prefixes import JOB_SIZE, LeaderPrefixes
from veil.aggregator.leader.release import HelperRefused, release
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.records import (
    CollectionGone,
    CollectionRecord,
    StorageConflict,
    is_transient_storage_error,
)
from veil.hpke import HpkeConfig
from veil.task import LeaderTask, b64e

log = logging.getLogger(__name__)

# Why a batch refused by its floor or ceiling under add_remove stays closed.
_ONCE = (
    " (add_remove: whether a batch reaches min_batch_size is told only once, so the batch"
    " stays closed)"
)


_DELETED = (
    "collection job {} was deleted by its collector after it closed its batch: a batch is"
    " collected at most once"
)


def released(record: CollectionRecord) -> bool:
    """Whether a collection job released its batch: finished, or deleted by
    its collector after the leader drew its share."""
    return record.state == "finished" or (
        record.state == "deleted" and record.leader_ct is not None
    )


def batch_ready(store: Datastore, task: LeaderTask, batch_id: bytes, bucket: int) -> bool:
    """Whether a leader-selected batch can be closed: none of its jobs
    unfinished, and min_batch_size of its reports aggregated (else it is
    open, and the job driver fills it again)."""
    if store.batch_unfinished(task.task_id, batch_id):
        return False
    aggs = store.batch_aggregates(task.task_id, bucket, bucket + 1)
    return sum(a.report_count for a in aggs) >= task.min_batch_size


@dataclass(frozen=True)
class TaskInfo:
    collector_hpke_config: HpkeConfig
    reports: int
    rejected: int
    collections_finished: int
    # Under add_remove the count is protected: reports and rejected are 0.
    counts_withheld: bool = False


def note_helper_away(store: Datastore, tasks: Iterable[LeaderTask], control: DriverControl) -> None:
    """A driver's pass ended before the collections, at a helper that could
    not be reached (`control.away_helper`, `control.away_because`: the failed
    call's error): each pending collection job of `tasks` served by that
    helper says so while it waits, in the words it would use had it asked
    the helper itself (CollectionDriver._retry), so that the two never
    overwrite each other. Without this, a job whose reports were not yet
    aggregated when the helper went away said nothing for as long as it was
    away. The jobs of tasks with another helper are left as they are: this
    helper is not theirs, and its call's text is not their collectors' to
    read. Nothing else of a job changes: it is tried at its time once the
    helper is back (and then says nothing while its reports are aggregated)."""
    away = control.away_helper
    task_ids = [t.task_id for t in tasks if away is not None and helper_of(t) == away]
    if not task_ids:
        return
    why = Unavailable(control.away_because or "the helper did not answer")
    store.note_collections(task_ids, STATUS_CODES[why.status], f"retrying: {why}")


class CollectionDriver:
    """Answers the collector's requests for the tasks in `tasks`, and
    completes their pending collection jobs."""

    def __init__(
        self,
        tasks: TaskTable[LeaderTask],
        keys: KeyRing,
        store: Datastore,
        clock: Callable[[], float],
        peer: HelperPeer,
        privacy: PrivacyEngine,
        meter: LeaderMeter,
        control: DriverControl,
        backoff: Backoff,
        job_size: Callable[[bytes], int] | None = None,
    ) -> None:
        self.tasks = tasks
        self.clock = clock
        # Reports per aggregation job of a task (the job driver's): a query's
        # jobs take at most this many, and at most JOB_SIZE.
        self.job_size = job_size or (lambda _: JOB_SIZE)
        self.store = store
        self.peer = peer
        self.privacy = privacy
        self.meter = meter
        self.control = control
        self.backoff = backoff
        # Poplar1 tasks' collections (one level each, with its parameter).
        self.prefixes = LeaderPrefixes(tasks, keys, store, clock, privacy, meter)

    # --- the collector's requests -------------------------------------------

    def create_collection(
        self,
        task_id: bytes,
        token: str | None,
        collection_id: bytes,
        start: int,
        duration: int,
        agg_param: bytes = b"",
    ) -> CollectionRecord:
        ctx = self.tasks.context(task_id)
        task = ctx.task
        authorize(task, token, task.collector_token_hash, "collector")
        check_id(collection_id, "collection_job_id")
        if ctx.by_query:
            return self.prefixes.create_collection(task, collection_id, start, duration, agg_param)
        if agg_param:
            raise InvalidAggParam(
                f"task {task.id_text} is a {task.vdaf.type} task: it takes no aggregation parameter"
            )
        check_interval(task, start, duration)
        check_window_closed(task, start, self.clock())
        existing = self.store.get_collection(task_id, collection_id)
        if existing is not None:
            if (existing.start, existing.duration) != (start, duration):
                raise JobConflict(f"collection job {collection_id.hex()} is for another batch")
            if existing.state == "deleted":
                raise BatchCollected(_DELETED.format(collection_id.hex()))
            return existing
        end = start + duration
        aggs = self.store.batch_aggregates(task_id, start, end)
        for a in aggs:
            if a.collected_by is not None:
                raise BatchCollected(
                    f"the batch [{start}, +{duration}) overlaps time bucket {a.bucket}, which"
                    " was already collected; a batch is collected at most once"
                )
        # Under add_remove whether the batch reaches min_batch_size is told
        # once, when the job finishes or fails (run_collection), and the
        # batch stays closed either way: a refusal here, with the batch
        # open, would let the collector poll until the floor is reached and
        # so learn when the reports arrive.
        if not task.dp.counts_protected:
            count = sum(a.report_count for a in aggs) + self.store.unaggregated_count(
                task_id, start, end
            )
            if count < task.min_batch_size:
                # Never the count itself: polling would tell the collector, for free,
                # when each report arrives (issue 13).
                raise BatchTooSmall(
                    f"the batch [{start}, +{duration}) holds fewer than min_batch_size"
                    f" ({task.min_batch_size}) reports: wait for more reports or collect a"
                    " longer interval"
                )
            check_batch_size(task, ctx.bounds, count)
        self.privacy.check(task, start, duration)
        try:
            return self.store.put_collection(
                CollectionRecord(task_id, collection_id, start, duration, "pending")
            )
        except StorageConflict as e:
            raise JobConflict(str(e)) from None

    def task_info(self, task_id: bytes, token: str | None) -> TaskInfo:
        """What the collector may know before collecting (the GetTaskInfo call)."""
        task = self.tasks.task(task_id)
        authorize(task, token, task.collector_token_hash, "collector")
        assert task.collector_hpke_config is not None
        finished = sum(1 for c in self.store.collections(task_id) if released(c))
        if task.dp.counts_protected:
            # Not even read: the answer, and the time taken to give it, do not
            # depend on how many reports there are.
            return TaskInfo(task.collector_hpke_config, 0, 0, finished, counts_withheld=True)
        reports = rejected = 0
        for states in self.store.report_counts(task_id, task.time_precision).values():
            for state, n in states.items():
                if state == "rejected":
                    rejected += n
                else:
                    reports += n
        return TaskInfo(task.collector_hpke_config, reports, rejected, finished)

    def get_collection(
        self, task_id: bytes, token: str | None, collection_id: bytes
    ) -> CollectionRecord:
        task = self.tasks.task(task_id)
        authorize(task, token, task.collector_token_hash, "collector")
        record = self.store.get_collection(task_id, collection_id)
        if record is None:
            raise NotFound(f"no collection job {collection_id.hex()} in this task")
        if record.state == "deleted":
            raise NotFound(f"collection job {collection_id.hex()} was deleted by its collector")
        # Under add_remove the count is protected: the collector never sees it.
        return replace(record, report_count=task.dp.released_count(record.report_count))

    def delete_collection(self, task_id: bytes, token: str | None, collection_id: bytes) -> None:
        """The collector deletes its collection job (DAP's DELETE, section
        4.6): never driven again, its poll NotFound; discarded whole if it
        holds nothing of its batch yet, else kept as deleted, its batch
        collected for good (see collection_jobs.delete_collection). NotFound
        for a job this task does not hold."""
        task = self.tasks.task(task_id)
        authorize(task, token, task.collector_token_hash, "collector")
        outcome = self.store.delete_collection(task_id, collection_id)
        if outcome is None:
            raise NotFound(f"no collection job {collection_id.hex()} in this task")
        log.info(
            "collection job %s deleted by its collector (%s)",
            collection_id.hex(),
            outcome,
            extra={"task_id": task.id_text, "job_id": collection_id.hex()},
        )

    # --- the driver ---------------------------------------------------------

    def run_pass(self, worker_id: str, lease_seconds: float) -> bool:
        """Advance the pending collection jobs this driver can lease; True if
        one made progress. Stops early when the helper cannot be reached."""
        progress = False
        for record in self.store.acquire_collections(worker_id, lease_seconds, 16):
            if self.control.stopping:
                return progress
            try:
                progress |= self.run_collection(record, worker_id, lease_seconds)
            except StorageConflict:
                # Another driver took this job over and got further; it finishes it.
                log.info("collection job %s advanced by another worker", record.job_id.hex())
            except Exception as e:
                if is_transient_storage_error(e):
                    raise  # our own database: the pass ends, the job stays leased
                # A fault of ours (not a refusal, which run_collection
                # settles): logged with its traceback and retried after the
                # job's backoff, which grows with its failures, never at
                # once on the next pass. The collector's status says no more
                # than that (an exception's text can quote anything).
                log.exception(
                    "collection job %s hit an unexpected error",
                    record.job_id.hex(),
                    extra={"task_id": b64e(record.task_id), "job_id": record.job_id.hex()},
                )
                self._retry(record, Internal("an unexpected error in the leader (see its log)"))
            if self.control.helper_unreachable:
                return progress
        return progress

    def _fail(self, record: CollectionRecord, error: AggregatorError, reopen: bool) -> bool:
        """Mark the job failed. With `reopen` (no share has left the batch:
        the helper released none and the leader drew none) its buckets are
        reopened, so the batch can be collected again."""
        log.warning(
            "collection job %s failed%s: %s",
            record.job_id.hex(),
            "; its batch is collectable again" if reopen else "",
            error,
            extra={"task_id": b64e(record.task_id), "job_id": record.job_id.hex()},
        )
        self.meter.collection(record.task_id, "failed")
        message = str(error)
        if reopen:
            message += " (nothing was released: the batch can be collected again)"
        code = STATUS_CODES.get(error.status, 13)
        failed = replace(
            record, state="failed", helper_ct=None, error_code=code, error_message=message
        )
        self.store.fail_collection(failed, reopen=reopen)
        return True

    def _retry(self, record: CollectionRecord, error: AggregatorError) -> bool:
        """Leave the job pending, to be tried again after a backoff; it says
        why while it waits (`veil status`)."""
        delay = self.store.defer_collection(
            record.task_id,
            record.job_id,
            STATUS_CODES.get(error.status, 13),
            f"retrying: {error}",
            self.backoff,
        )
        log.warning(
            "collection job %s retried in %.1f s: %s",
            record.job_id.hex(),
            delay,
            error,
            extra={"task_id": b64e(record.task_id), "job_id": record.job_id.hex()},
        )
        # Not for the leader's own noise not yet drawn, nor one task's window
        # refused by a helper that answered: the other collections go on.
        if isinstance(error, Unavailable) and not isinstance(
            error, (NoiseUnavailable, WindowMismatch)
        ):
            self.control.helper_away(str(error))
        return False

    def run_collection(
        self,
        record: CollectionRecord,
        worker_id: str | None = None,
        lease_seconds: float = 0.0,
    ) -> bool:
        """Advance one pending collection job; True if it made progress.

        The helper is asked first, with the leader's count and checksum; the
        leader spends its budget and draws its noise only once the helper's
        share exists. So a refusal by the helper leaves nothing charged or
        drawn at the leader and reopens the batch, and a retryable error
        (the helper or its database down) keeps the job pending, retried
        with backoff for as long as it takes. Every step is safe to repeat
        after a crash: the helper serves its stored share again, the spend
        is keyed by the collection job id, and a share drawn but not yet
        stored never left this process."""
        ctx = self.tasks.contexts.get(record.task_id)
        if ctx is None:
            return False
        task = ctx.task
        if ctx.by_query:
            return self._run_prefixes(task, record, worker_id, lease_seconds)
        start, end = record.start, record.start + record.duration
        engine = ctx.engine
        share: list[int] = []
        batch_id: bytes | None = None
        if task.dap is not None and task.dap.leader_selected:
            batch_id = self.store.batch_of_bucket(task.task_id, start)
            if batch_id is None:
                return self._fail(record, Internal("the leader holds no batch of this job"), True)
            if record.leader_ct is None and not batch_ready(self.store, task, batch_id, start):
                return False  # its jobs finish, or more reports fill it, first
        if record.leader_ct is not None:
            # Stored by an earlier veil, which drew the leader's share first.
            count, checksum = record.report_count, record.checksum
        else:
            try:
                self.store.close_collection_batch(record, task.time_precision)
            except CollectionGone as e:  # deleted, or ended by another driver, since read
                log.info("%s: this step closes nothing and asks the helper nothing", e)
                return False
            except StorageConflict:
                return self._fail(
                    record,
                    BatchCollected("the batch was already collected by another job"),
                    reopen=False,
                )
            if self.store.unaggregated_count(task.task_id, start, end) or (
                batch_id is not None and self.store.batch_unfinished(task.task_id, batch_id)
            ):
                if record.error_message:  # this pass found no helper away: not why it waits
                    self.store.update_collection(replace(record, error_code=0, error_message=""))
                return False  # the next pass aggregates them first
            share, count, checksum = batch_summary(
                engine, self.store.batch_aggregates(task.task_id, start, end)
            )
            # Under add_remove the batch stays closed after this refusal: whether
            # it reached the floor (or passed the ceiling) is told once.
            reopen = not task.dp.counts_protected
            if count < task.min_batch_size:
                return self._fail(
                    record,
                    BatchTooSmall(
                        "fewer than min_batch_size"
                        f" ({task.min_batch_size}) valid reports in the batch after verification"
                        + ("" if reopen else _ONCE)
                    ),
                    reopen=reopen,
                )
            try:
                check_batch_size(task, ctx.bounds, count)
            except BatchTooLarge as e:
                if not reopen:
                    e = BatchTooLarge(str(e) + _ONCE)
                return self._fail(record, e, reopen=reopen)
        try:
            release(
                ctx,
                self.privacy,
                self.peer.api,
                record,
                None,
                count,
                checksum,
                share,
                self.store.update_collection,
                record.leader_ct,
                batch_id,
            )
        except HelperRefused as refused:
            by_helper = refused.error
            # WindowOpen: the window is closed by this leader's clock (it
            # checked) but not yet by the helper's, which is behind: the
            # helper's clock catches up, so the job waits for it.
            if by_helper.retryable or isinstance(by_helper, WindowOpen):
                return self._retry(record, by_helper)
            # Under add_remove a refusal by the helper's own floor or ceiling
            # leaves the batch closed too: the answer is told once.
            told_once = task.dp.counts_protected and isinstance(
                by_helper, (BatchTooSmall, BatchTooLarge)
            )
            reopen = record.leader_ct is None and not told_once
            return self._fail(record, by_helper, reopen=reopen)
        except AggregatorError as e:
            if e.retryable:
                # No noise vector ready yet (nothing spent): retried later.
                return self._retry(record, e)
            # The helper's share exists (sealed to the collector, never
            # sent): the batch stays closed.
            return self._fail(record, e, reopen=False)
        if record.leader_ct is None:
            self.meter.budget(self.privacy, task)
        self.meter.collection(task.task_id, "finished")
        log.info(
            "collection job %s finished: %d reports",
            record.job_id.hex(),
            count,
            extra={"task_id": task.id_text, "job_id": record.job_id.hex()},
        )
        return True

    def _run_prefixes(
        self,
        task: LeaderTask,
        record: CollectionRecord,
        worker_id: str | None,
        lease_seconds: float,
    ) -> bool:
        """A Poplar1 level's collection (veil.aggregator.leader.prefixes). A
        retryable error leaves it pending (every step repeats identically);
        a refusal fails it for good: the (batch, level) is spent either way.
        A level is many aggregation jobs: the lease (`worker_id`'s, of
        `lease_seconds`) is renewed after each, so that no other driver takes
        the collection while this one computes it."""
        job_size = min(JOB_SIZE, self.job_size(task.task_id))

        def renew() -> bool:
            assert worker_id is not None
            return self.store.renew_collection(
                task.task_id, record.job_id, worker_id, lease_seconds
            )

        queries = self.tasks.context(task.task_id).queries
        assert queries is not None
        agg_param = queries.parse(record.agg_param)

        def level(outcome: str) -> None:
            self.meter.prefix_level(
                task,
                agg_param.level,
                len(agg_param.prefixes),
                time.monotonic() - began,
                outcome,
            )

        began = time.monotonic()
        try:
            released = self.prefixes.run(
                task, record, self.peer.api, job_size, renew if worker_id is not None else None
            )
        except AggregatorError as e:
            if e.retryable or isinstance(e, WindowOpen):
                level("retrying")
                return self._retry(record, e)
            level("failed")
            return self._fail(record, e, reopen=False)
        level("finished")
        self.meter.budget(self.privacy, task)
        self.meter.collection(task.task_id, "finished")
        log.info(
            "collection job %s finished",
            record.job_id.hex(),
            extra={"task_id": task.id_text, "job_id": record.job_id.hex()},
        )
        return released is not None
