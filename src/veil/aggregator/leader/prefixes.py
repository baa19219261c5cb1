"""The leader's side of a Poplar1 task (issue 27; see veil.aggregator.prefixes).

The collector's CreateCollection names the aggregation parameter of one
level. The leader checks it against its own record of the batch's queries
and records it with the collection job, in one transaction. Driving the job
then aggregates every stored report of the batch with that parameter, in
aggregation jobs of `JOB_SIZE` reports, each in two rounds with the helper
(veil.aggregator.helper.queries), `PIPELINE` jobs at a time so that the two
aggregators work at once rather than in turns, and releases the level: the
helper's noised share first (with the leader's count and checksum, which it
checks against its own), then the leader's.

Nothing of a job is stored at the leader: job ids are derived from the
collection job id and the job's index over the batch's reports in id order,
and verification is deterministic, so a collection resumed after a crash
or a retry sends the same requests again, and the helper answers the jobs it
finished from its records. The level's sum is stored (in its query's row)
before the helper is asked to release the level: a collection resumed after
that point goes on from the stored sum to the release, whose every step the
helper and the ledgers answer again as before, and never runs the jobs of a
level the helper may have released (which it refuses).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from veil.aggregator.context import TaskTable
from veil.aggregator.core import (
    AggregationAnswer,
    VerifyInitItem,
    VerifyResult,
    check_batch_size,
    check_interval,
    check_window_closed,
    share_merge,
)
from veil.aggregator.errors import (
    AggParamRefused,
    BatchCollected,
    BatchTooSmall,
    InvalidMessage,
    JobConflict,
    LevelCollected,
    ReportRejection,
)
from veil.aggregator.keys import KeyRing
from veil.aggregator.leader.job import AnyReport, finish_job, prepare_job
from veil.aggregator.leader.meter import LeaderMeter
from veil.aggregator.leader.peer import HelperApi
from veil.aggregator.leader.release import HelperRefused, release
from veil.aggregator.prefixes import (
    LevelCaches,
    PrefixVdaf,
    ShareCache,
    prefix_job_id,
)
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.records import (
    BatchAggregate,
    BucketCollected,
    CollectionRecord,
    PrefixQuery,
    QueryCollected,
    QueryConflict,
    StorageConflict,
    merge_aggregate,
)
from veil.hpke import ROLE_LEADER, Ciphertext, input_share_info
from veil.messages import Report
from veil.task import MAX_QUERY_PREFIXES, LeaderTask
from veil.vdaf.engine import Round
from veil.vdaf.spec.poplar1 import Poplar1AggParam

log = logging.getLogger(__name__)

# Reports per aggregation job: each report's output share is one value per
# prefix, so a job holds JOB_SIZE x prefixes values in memory.
JOB_SIZE = 1000
JOB_VALUES = 1 << 24
# Aggregation jobs of one level in flight at once (two: one at each aggregator).
PIPELINE = 2


class LeaseLost(StorageConflict):
    """Another driver took over the collection job (this one's lease had
    expired): this one stops, the other finishes it."""


@dataclass(frozen=True)
class Released:
    """A finished level: what the leader stores and the collector gets."""

    report_count: int
    checksum: bytes
    leader_ct: Ciphertext
    helper_ct: Ciphertext


class LeaderPrefixes:
    """Poplar1 collections on the leader."""

    def __init__(
        self,
        tasks: TaskTable[LeaderTask],
        keys: KeyRing,
        store: Datastore,
        clock: Callable[[], float],
        privacy: PrivacyEngine,
        meter: LeaderMeter | None = None,
    ) -> None:
        self.tasks = tasks
        self.keys = keys
        self.store = store
        self.clock = clock
        self.privacy = privacy
        self.meter = meter if meter is not None else LeaderMeter()
        # The IDPF nodes of each job's reports, and their opened shares, from
        # one level to the next.
        self.caches = LevelCaches()
        self.shares = ShareCache()

    def _queries(self, task: LeaderTask) -> PrefixVdaf:
        """The rules on the task's queries (a task queried with a parameter)."""
        queries = self.tasks.context(task.task_id).queries
        assert queries is not None
        return queries

    # --- the collector's request --------------------------------------------

    def create_collection(
        self,
        task: LeaderTask,
        collection_id: bytes,
        start: int,
        duration: int,
        agg_param: bytes,
    ) -> CollectionRecord:
        """Record a level's collection job (the collector's token is checked
        by the caller)."""
        prefix = self._queries(task)
        parsed = prefix.parse(agg_param)
        check_interval(task, start, duration)
        check_window_closed(task, start, self.clock())
        store = self.store
        existing = store.get_collection(task.task_id, collection_id)
        if existing is not None:
            if (existing.start, existing.duration, existing.agg_param) != (
                start,
                duration,
                agg_param,
            ):
                raise JobConflict(
                    f"collection job {collection_id.hex()} is for another batch or parameter"
                )
            return existing
        # Refused before anything is recorded: a level the ledger cannot pay
        # for stays collectable once the budget allows (it never will, but
        # the refusal is the budget's, not a spent level's).
        self.privacy.check(task, start, duration)
        sequence = prefix.sequence_check(parsed)

        def check(previous: Sequence[PrefixQuery]) -> None:
            # A level whose collection did not finish leaves the batch
            # closed: its prefixes were never learned, and under add_remove
            # whether the batch reached its floor is told once.
            for q in previous:
                job = store.get_collection(task.task_id, q.collected_by or b"")
                if job is None or job.state != "finished":
                    raise AggParamRefused(
                        f"level {q.level} of this batch did not finish: no later level of the"
                        " batch can be collected"
                    )
            sequence(previous)

        record = CollectionRecord(
            task.task_id, collection_id, start, duration, "pending", agg_param=agg_param
        )
        query = PrefixQuery(
            task.task_id, start, duration, parsed.level, agg_param, collected_by=collection_id
        )
        try:
            return store.create_prefix_collection(record, query, check, task.time_precision)
        except QueryCollected as e:
            raise LevelCollected(str(e)) from None
        except QueryConflict as e:
            raise AggParamRefused(str(e)) from None
        except BucketCollected as e:
            raise BatchCollected(
                f"the batch overlaps time bucket {e.bucket}, collected by another collection"
            ) from None
        except StorageConflict as e:
            raise JobConflict(str(e)) from None

    # --- the driver ---------------------------------------------------------

    def run(
        self,
        task: LeaderTask,
        record: CollectionRecord,
        api: HelperApi,
        job_size: int = JOB_SIZE,
        renew: Callable[[], bool] | None = None,
    ) -> Released:
        """Aggregate the batch with the record's parameter and release the
        level. Raises AggregatorError (retryable ones leave nothing behind
        that a retry would not redo identically). `renew` extends this
        driver's lease of the collection job after each aggregation job (a
        level may take longer than one lease); LeaseLost if it says another
        driver holds it."""
        prefix = self._queries(task)
        agg_param = prefix.parse(record.agg_param)
        start = record.start
        stored = self.store.prefix_query(task.task_id, start, agg_param.level)
        if (
            stored is not None
            and stored.collected_by == record.job_id
            and stored.agg_share is not None
        ):
            # Totalled before the helper was asked (which may have released
            # the level): the release goes on from the stored sum, never from
            # jobs run again, which the helper refuses once it has released.
            total = BatchAggregate(0, stored.agg_share, stored.report_count, stored.checksum)
        else:
            total = self._total(task, prefix, agg_param, record, api, job_size, renew)
        count, checksum = total.report_count, total.checksum
        ctx = self.tasks.context(task.task_id)
        share = (
            ctx.engine.agg_init(agg_param)
            if total.agg_share is None
            else ctx.engine.decode_agg_share(agg_param, total.agg_share)
        )

        def commit(finished: CollectionRecord) -> None:
            # The level's sum stays in its query's row, with the finished job.
            self.store.finish_prefix_collection(finished, agg_param.level, total.agg_share)

        try:
            finished = release(
                ctx, self.privacy, api, record, agg_param, count, checksum, share, commit
            )
        except HelperRefused as refused:
            raise refused.error from None
        log.info(
            "poplar1 collection %s finished: level %d, %d prefixes",
            record.job_id.hex(),
            agg_param.level,
            len(agg_param.prefixes),
            extra={"task_id": task.id_text, "job_id": record.job_id.hex()},
        )
        assert finished.leader_ct is not None and finished.helper_ct is not None
        return Released(count, checksum, finished.leader_ct, finished.helper_ct)

    def _total(
        self,
        task: LeaderTask,
        prefix: PrefixVdaf,
        agg_param: Poplar1AggParam,
        record: CollectionRecord,
        api: HelperApi,
        job_size: int,
        renew: Callable[[], bool] | None,
    ) -> BatchAggregate:
        """The level's sum over the batch's aggregation jobs, checked against
        the floor and the ceiling and stored in the query's row before any
        share is released."""
        start, duration = record.start, record.duration
        reports = self.store.batch_reports(task.task_id, start, start + duration)
        total = BatchAggregate(0, None, 0, bytes(32))
        engine = self.tasks.context(task.task_id).engine
        merge = share_merge(engine, agg_param)
        # A job's output shares are reports x prefixes values, in memory on
        # both aggregators: at most JOB_VALUES of them for the largest query.
        # The same for every level, so that a job's reports are the same from
        # one level to the next (the IDPF nodes cached for them serve again).
        job_size = max(1, min(job_size, JOB_VALUES // MAX_QUERY_PREFIXES))
        # PIPELINE jobs at once, so that the leader works on one while the
        # helper works on another (each job alone has them take turns). The
        # requests are the same whatever the order they are sent in.
        running: deque[Future[tuple[BatchAggregate, int]]] = deque()

        # Reports verified at this level, accepted or rejected: the floor's count.
        verified = 0

        def metered(job_id: bytes, part: Sequence[Report]) -> tuple[BatchAggregate, int]:
            began = time.monotonic()
            try:
                delta, outcomes, sent = self._job(
                    task, prefix, agg_param, record, job_id, part, api
                )
            except Exception:
                self.meter.prefix_job_failed()
                raise
            self.meter.prefix_job(task, agg_param.level, time.monotonic() - began, outcomes)
            return delta, sent

        def done(total: BatchAggregate) -> BatchAggregate:
            """The oldest job's sum added, the lease renewed after it."""
            nonlocal verified
            delta, sent = running.popleft().result()
            verified += sent
            if delta.report_count:
                total = merge_aggregate(total, delta, merge)
            if renew is not None and not renew():
                raise LeaseLost(
                    f"collection job {record.job_id.hex()} was leased to another driver"
                    " while this one computed its level"
                )
            return total

        with ThreadPoolExecutor(PIPELINE, thread_name_prefix="poplar1-job") as pool:
            try:
                for index in range(0, len(reports), job_size):
                    if len(running) >= PIPELINE:
                        total = done(total)
                    job_id = prefix_job_id(record.job_id, index // job_size)
                    part = reports[index : index + job_size]
                    running.append(pool.submit(metered, job_id, part))
                while running:
                    total = done(total)
            finally:
                # A job that failed stops the level; the others finish (or
                # fail) before it is retried, which sends them all again.
                for job in running:
                    job.cancel()
                wait(running)
        # The floor on the reports verified at this level, not on those that
        # passed: a client may build its report to fail at a level of its
        # choosing, and a floor on the accepted count would then end the
        # batch at the level where the honest count falls below it, telling
        # that count. The reports verified are the same at every level (the
        # batch is closed), so the batch reaches the floor at all or none.
        if verified < task.min_batch_size:
            raise BatchTooSmall(
                f"fewer than min_batch_size ({task.min_batch_size}) reports of the batch were"
                " verified at this level"
            )
        check_batch_size(task, self.tasks.context(task.task_id).bounds, total.report_count)
        if total.agg_share is None:
            # No report accepted: the sum is zero, stored as such (a NULL
            # share is a level not totalled yet).
            total = BatchAggregate(
                0, engine.encode_agg_share(agg_param, engine.agg_init(agg_param)), 0, total.checksum
            )
        self.store.total_prefix_query(
            CollectionRecord(
                task.task_id,
                record.job_id,
                start,
                duration,
                "pending",
                total.report_count,
                total.checksum,
                agg_param=record.agg_param,
            ),
            agg_param.level,
            total.agg_share,
        )
        return total

    def _job(
        self,
        task: LeaderTask,
        prefix: PrefixVdaf,
        agg_param: Poplar1AggParam,
        record: CollectionRecord,
        job_id: bytes,
        reports: Sequence[Report],
        api: HelperApi,
    ) -> tuple[BatchAggregate, dict[bytes, ReportRejection | None], int]:
        """One aggregation job in two rounds: what it adds to the level, each
        report's outcome (None: accepted by both aggregators), and how many
        reports reached the second round (verified, accepted or rejected: what
        the helper records, and the floor's count)."""
        keys = self.keys
        keys.know_keys({r.leader_ct.config_id for r in reports})
        shares: list[ReportRejection | bytes] = []
        for r in reports:
            # The leader's own stored reports: a share is opened once per batch.
            share_key = task.task_id + r.report_id
            plaintext: bytes | ReportRejection | None = self.shares.get(share_key)
            if plaintext is None:
                info = input_share_info(
                    ROLE_LEADER, task.task_id, r.report_id, r.time, r.public_share
                )
                plaintext = keys.open_share(keys.keypair(r.leader_ct.config_id), r.leader_ct, info)
                if not isinstance(plaintext, ReportRejection):
                    self.shares.put(share_key, plaintext)
            shares.append(plaintext)
        ctx = self.tasks.context(task.task_id)

        def init(ids: list[bytes], public: list[bytes], plaintexts: list[bytes]) -> Round:
            return self.caches.verify_init(
                ctx.engine, task, 0, record.start, agg_param, ids, public, plaintexts
            )

        job = prepare_job(ctx, job_id, agg_param, reports, shares, init)
        empty = BatchAggregate(0, None, 0, bytes(32))
        if not job.items:
            return empty, job.outcomes, 0
        batch_round = (record.agg_param, record.start, record.duration)
        first = api.aggregate(task, job_id, job.items, (*batch_round, 1))
        done = finish_job(
            ctx,
            QUERY_JOBS,
            job,
            first,
            lambda items: api.aggregate(task, job_id, items, (*batch_round, 2)),
        )
        return (done.deltas[0] if done.deltas else empty), done.outcomes, done.verified


class QueryJobs:
    """A job over the reports of a queried batch (`JobSource`): an answer
    for other reports than were sent is refused, a report the helper
    refuses has that refusal as its outcome (a level's batch is closed: no
    later job takes it), and every accepted report adds to the level's sum."""

    def check_answer(self, answer: AggregationAnswer, items: Sequence[VerifyInitItem]) -> None:
        got = [r.report_id for r in answer.results]
        if got != [it.report_id for it in items]:
            raise InvalidMessage("the helper's answer does not list the job's reports in order")

    def deferral(self, task: LeaderTask, result: VerifyResult, report: AnyReport) -> float | None:
        return None

    def bucket(self, task: LeaderTask, report: AnyReport) -> int:
        return 0


QUERY_JOBS = QueryJobs()
