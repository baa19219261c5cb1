"""The leader's logic (draft-ietf-ppm-dap sections 4.4 to 4.6, leader side).

Uploads are checked and stored; a driver (`run_once`, called in a loop by the
server's driver thread or by `veil worker` processes) groups stored reports
into aggregation jobs, completes each with one round trip to the helper, and
then serves pending collection jobs. Any number of drivers may share one
store: each job is leased to one driver at a time (a crashed driver's lease
expires and another takes the job over), the helper answers a repeated job id
with its stored answer, and batch aggregates are merged under the store's
lock. A collection waits until its batch holds no unaggregated report, so it
never races an aggregation job over the same reports.
"""

from __future__ import annotations

import logging
import math
import os
import re
import secrets
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Protocol

from veil.aggregator.admission import AdmissionLimits, Backlog
from veil.aggregator.core import (
    REPORT_DROPPED,
    REPORT_TOO_EARLY,
    AggregationAnswer,
    AggregatorBase,
    ReportSizes,
    VerifyInitItem,
    authorize,
    batch_summary,
    check_batch_size,
    check_interval,
    check_report_time,
    check_token,
    check_window_closed,
    job_deltas,
    rejection_reason,
    share_merge,
)
from veil.aggregator.errors import (
    STATUS_CODES,
    AggregatorError,
    BatchCollected,
    BatchTooLarge,
    BatchTooSmall,
    InvalidMessage,
    JobConflict,
    NotFound,
    ReportIdConflict,
    ReportRejection,
    ReportTimeRejected,
    TooLarge,
    Unauthenticated,
    Unavailable,
    UnknownTask,
    WindowOpen,
    WrongLength,
)
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.skew import ClockOffset, ClockWatch
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.records import (
    BatchAggregate,
    BucketCollected,
    CollectionRecord,
    ReportIdTaken,
    StorageConflict,
    is_transient_storage_error,
)
from veil.hpke import (
    ROLE_LEADER,
    Ciphertext,
    HpkeConfig,
    agg_share_info,
    input_share_info,
    seal,
)
from veil.messages import REPORT_ID_SIZE, Report, vdaf_ctx
from veil.metrics import Metrics
from veil.task import LeaderTask, b64e
from veil.vdaf import VerifyError
from veil.vdaf.batch.prio3 import VerifyInitBatch

log = logging.getLogger(__name__)

# What one upload request may hold: at most this many reports, each of the
# exact size its task fixes (ReportSizes), and at most the server's
# max_message_bytes in all (gRPC refuses a larger request before parsing it).
MAX_UPLOAD_REPORTS = 10_000
# The largest aggregation job request the leader builds, by default: well
# under the default max_message_bytes (16 MiB) of both servers, so a job is
# never refused for its size (issue 13: a job larger than the limit failed on
# every pass and blocked the jobs behind it).
MAX_JOB_BYTES = 4 << 20
# Failed attempts after which an aggregation job is given up (its reports
# rejected as job_failed); [driver] max_job_attempts.
DEFAULT_MAX_JOB_ATTEMPTS = 10
# Reports per aggregation job, and how long a worker holds a leased job before
# another may take it over ([driver] job_size and lease_seconds).
DEFAULT_JOB_SIZE = 500
DEFAULT_LEASE_SECONDS = 60.0
# Refusals of a job's content: the same job would be refused again.
_REFUSES_THE_JOB = (TooLarge, InvalidMessage, JobConflict)
# Refusals that say the deployment is misconfigured, not the job.
_MISCONFIGURED = (Unauthenticated, UnknownTask)
# Aggregation jobs a driver leases at once (see Leader._run_aggregation_jobs).
JOBS_PER_LEASE = 4
# How long after its time a report the helper finds too early (its clock
# behind the leader's) is still sent again, rather than rejected as
# report_too_early; [driver] max_helper_clock_lag. A collection waits for
# such reports, so at most this long past the end of its batch.
DEFAULT_MAX_HELPER_CLOCK_LAG = 3600.0
# How long a report the helper found too early waits when the helper's clock
# is not known (an older helper that does not send it), and at least.
_TOO_EARLY_WAIT = 30.0
_MIN_TOO_EARLY_WAIT = 1.0


class HelperApi(Protocol):
    """The helper as the leader calls it (a gRPC client in production).

    Implementations raise Unavailable when the helper cannot be reached (the
    leader retries later) and other AggregatorError subclasses for refusals.
    """

    def aggregate(
        self, task: LeaderTask, job_id: bytes, items: Sequence[VerifyInitItem]
    ) -> AggregationAnswer: ...

    def aggregate_share(
        self,
        task: LeaderTask,
        collection_id: bytes,
        start: int,
        duration: int,
        report_count: int,
        checksum: bytes,
    ) -> Ciphertext: ...


@dataclass(frozen=True)
class _PreparedJob:
    """An aggregation job whose leader shares are opened and verified: what
    goes to the helper, and what finishing the job with its answer needs."""

    task: LeaderTask
    job_id: bytes
    began: float
    report_count: int
    opened: list[Report]
    init: VerifyInitBatch
    items: list[VerifyInitItem]
    row_of: dict[bytes, int]  # report id -> row of `opened` (and of `init`)
    outcomes: dict[bytes, ReportRejection | None]  # reports the leader already rejected


@dataclass(frozen=True)
class TaskInfo:
    collector_hpke_config: HpkeConfig
    reports: int
    rejected: int
    collections_finished: int
    # Under add_remove the count is protected: reports and rejected are 0.
    counts_withheld: bool = False


class Leader(AggregatorBase[LeaderTask]):
    role_name = "leader"
    task_type = LeaderTask

    def __init__(
        self,
        tasks: Mapping[bytes, LeaderTask],
        store: Datastore,
        helper: HelperApi,
        privacy: PrivacyEngine,
        clock: Callable[[], float] | None = None,
        job_size: int = DEFAULT_JOB_SIZE,
        metrics: Metrics | None = None,
        worker_id: str | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        max_job_bytes: int = MAX_JOB_BYTES,
        max_job_attempts: int = DEFAULT_MAX_JOB_ATTEMPTS,
        retry_seconds: float = 1.0,
        max_retry_seconds: float = 300.0,
        max_helper_clock_lag: float = DEFAULT_MAX_HELPER_CLOCK_LAG,
        admission: AdmissionLimits | None = None,
    ) -> None:
        self.job_size = job_size
        self.max_job_bytes = max_job_bytes
        # Reports per job, per task (filled by add_tasks): job_size, or fewer
        # where that many reports would make a request larger than max_job_bytes.
        self.job_sizes: dict[bytes, int] = {}
        super().__init__(tasks, store, clock or time.time, metrics)
        self.helper = helper
        self.privacy = privacy
        # Who holds a leased job: unique per driver, so two processes never
        # mistake each other's leases for their own.
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.lease_seconds = lease_seconds
        # A failing aggregation job is given up after this many failed
        # attempts (Janus: maximum_attempts_before_failure); failed jobs and
        # collections wait retry_seconds, doubling up to max_retry_seconds,
        # before they are leased again, so they never hold up the others.
        self.max_job_attempts = max_job_attempts
        self.retry_seconds = retry_seconds
        self.max_retry_seconds = max_retry_seconds
        self.max_helper_clock_lag = max_helper_clock_lag
        # Each helper's clock against ours, read from every job's answer.
        self.clocks = ClockWatch(store, metrics)
        # Set by run_once when the helper could not be reached (the driver backs off).
        self.helper_unreachable = False
        # The server sets this on shutdown: run_once stops between two steps.
        self.should_stop: Callable[[], bool] = lambda: False
        # The helper's round trip for one job runs here while the driver
        # prepares the next.
        self._helper_calls = ThreadPoolExecutor(1, thread_name_prefix="helper-call")
        # Uploads are admitted while the reports waiting for aggregation are
        # within these limits (veil.aggregator.admission).
        self.backlog = Backlog(admission or AdmissionLimits(), self._count_backlog)

    # --- upload -----------------------------------------------------------

    def add_tasks(self, tasks: Mapping[bytes, LeaderTask]) -> list[LeaderTask]:
        """AggregatorBase.add_tasks, and each new task's job size."""
        # Sized before the tasks become visible to the driver.
        for tid, t in tasks.items():
            if tid not in self.job_sizes:
                sizes = ReportSizes.of(t.vdaf.instantiate(), t.token_size)
                self.job_sizes[tid] = max(
                    1, min(self.job_size, self.max_job_bytes // sizes.job_item_bytes())
                )
        return super().add_tasks(tasks)

    def upload(self, task_id: bytes, reports: Sequence[Report]) -> tuple[int, int]:
        """Validate and store reports, all or nothing, if the backlog admits
        them (else Overloaded). Returns (stored, duplicates)."""
        task = self.task(task_id)
        stored = 0
        try:
            self.backlog.reserve(task_id, len(reports))
            try:
                stored, duplicates = self._upload(task, reports)
            finally:
                self.backlog.settle(task_id, len(reports), stored)
        except AggregatorError as e:
            if self.metrics is not None:
                self.metrics.uploads_refused.labels(task.id_text, _reason(e)).inc()
            raise
        if self.metrics is not None:
            self.metrics.reports_received.labels(task.id_text).inc(stored)
            self.metrics.reports_duplicate.labels(task.id_text).inc(duplicates)
        return stored, duplicates

    def _upload(self, task: LeaderTask, reports: Sequence[Report]) -> tuple[int, int]:
        task_id = task.task_id
        if not reports:
            raise InvalidMessage("the upload holds no report")
        if len(reports) > MAX_UPLOAD_REPORTS:
            raise TooLarge(
                f"{len(reports)} reports in one upload; send at most {MAX_UPLOAD_REPORTS}"
            )
        now = self.clock()
        sizes = self.sizes[task_id]
        seen: set[bytes] = set()
        helper_horizon = self._helper_horizon(task, now)
        for i, r in enumerate(reports):
            where = f"report {i} ({r.report_id.hex()})"
            if len(r.report_id) != REPORT_ID_SIZE:
                raise InvalidMessage(f"report {i}: report_id must be {REPORT_ID_SIZE} bytes")
            if r.report_id in seen:
                raise InvalidMessage(f"{where} appears twice in one upload")
            seen.add(r.report_id)
            if task.issuer_public_key is not None:
                check_token(task, r.token, r.report_id, where)
            elif r.token:
                raise InvalidMessage(f"{where}: this task takes no token (no invitations)")
            try:
                sizes.check(r.public_share, r.leader_ct, r.helper_ct)
            except WrongLength as e:
                raise WrongLength(f"{where}: {e}") from None
            if r.time % task.time_precision:
                raise InvalidMessage(
                    f"{where}: time {r.time} is not rounded down to the task's time_precision"
                    f" ({task.time_precision} s)"
                )
            try:
                check_report_time(task, r.time, now)
            except AggregatorError as e:
                raise type(e)(f"{where}: {e}") from None
            if helper_horizon is not None and r.time < helper_horizon:
                raise ReportTimeRejected(
                    f"{where}: report time {r.time} is older than the task's report_expiry_age"
                    f" of {task.report_expiry_age} s by the helper's clock, which is ahead of"
                    " the leader's: the report has expired"
                )
            if self.keypair(r.leader_ct.config_id) is None:
                raise InvalidMessage(
                    f"{where}: unknown leader HPKE config id {r.leader_ct.config_id}; fetch the"
                    " leader's HPKE config again"
                )
        try:
            return self.store.put_reports(task_id, [(task.bucket(r.time), r) for r in reports])
        except BucketCollected as e:
            raise BatchCollected(
                f"the batch holding time bucket {e.bucket} was already collected; reports for it"
                " are no longer accepted"
            ) from None
        except ReportIdTaken as e:
            raise ReportIdConflict(
                f"report id {e.report_id.hex()} was already uploaded with other content; use a"
                " fresh report id"
            ) from None

    def _count_backlog(self) -> dict[bytes, int]:
        """Each served task's reports waiting for aggregation, as stored now."""
        counts = {tid: self.store.unaggregated_count(tid, 0, 2**63 - 1) for tid in self.tasks}
        if self.metrics is not None:
            for tid, n in counts.items():
                self.metrics.reports_unaggregated.labels(_task_label(tid)).set(n)
        return counts

    def _helper_horizon(self, task: LeaderTask, now: float) -> int | None:
        """The report horizon by the helper's clock, where it is ahead of ours
        (latest reading, at its largest): a report older than that would be
        acknowledged here and then dropped by the helper as expired, so it
        is refused at upload instead. None if nothing more is refused."""
        horizon = task.report_horizon(now)
        if horizon is None:
            return None
        reading = self.clocks.latest(task.helper_address)
        if reading is None or reading.offset + reading.uncertainty <= 0:
            return None
        return horizon + math.ceil(reading.offset + reading.uncertainty)

    # --- collection requests ------------------------------------------------

    def create_collection(
        self, task_id: bytes, token: str | None, collection_id: bytes, start: int, duration: int
    ) -> CollectionRecord:
        task = self.task(task_id)
        authorize(task, token, task.collector_token_hash, "collector")
        if len(collection_id) != 16:
            raise InvalidMessage("collection_job_id must be 16 bytes")
        check_interval(task, start, duration)
        check_window_closed(task, start, self.clock())
        existing = self.store.get_collection(task_id, collection_id)
        if existing is not None:
            if (existing.start, existing.duration) != (start, duration):
                raise JobConflict(f"collection job {collection_id.hex()} is for another batch")
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
            check_batch_size(task, self.bounds[task_id], count)
        self.privacy.check(task, start, duration)
        try:
            return self.store.put_collection(
                CollectionRecord(task_id, collection_id, start, duration, "pending")
            )
        except StorageConflict as e:
            raise JobConflict(str(e)) from None

    def task_info(self, task_id: bytes, token: str | None) -> TaskInfo:
        """What the collector may know before collecting (the GetTaskInfo call)."""
        task = self.task(task_id)
        authorize(task, token, task.collector_token_hash, "collector")
        assert task.collector_hpke_config is not None
        finished = sum(1 for c in self.store.collections(task_id) if c.state == "finished")
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
        task = self.task(task_id)
        authorize(task, token, task.collector_token_hash, "collector")
        record = self.store.get_collection(task_id, collection_id)
        if record is None:
            raise NotFound(f"no collection job {collection_id.hex()} in this task")
        # Under add_remove the count is protected: the collector never sees it.
        return replace(record, report_count=task.dp.released_count(record.report_count))

    # --- driver -----------------------------------------------------------

    def run_once(self) -> bool:
        """One pass of the driver; True if it made progress."""
        progress = False
        self.helper_unreachable = False
        # Only our tasks, each asked directly: cheaper on a large shared table
        # than looking for the tasks that have pending reports.
        for task_id in self.tasks:
            while not self.should_stop() and self.store.create_aggregation_job(
                task_id, secrets.token_bytes(16), self.job_sizes[task_id]
            ):
                progress = True
        while not self.should_stop():
            leased = self.store.acquire_aggregation_jobs(
                self.worker_id, self.lease_seconds, JOBS_PER_LEASE
            )
            if not leased:
                break
            ours = [(t, j) for t, j in leased if t in self.tasks]
            for task_id, job_id in leased:
                if task_id not in self.tasks:
                    log.warning(
                        "aggregation job %s is for a task not configured here", job_id.hex()
                    )
            finished = self._run_aggregation_jobs(ours)
            progress |= finished
            if self.helper_unreachable:
                return progress
            if len(ours) < len(leased):
                break  # we would lease the foreign jobs again first
            if not finished:
                break  # every job failed and waits for its retry: collections go on
        for record in self.store.acquire_collections(self.worker_id, self.lease_seconds, 16):
            if self.should_stop():
                return progress
            try:
                progress |= self.run_collection(record)
            except StorageConflict:
                # Another driver took this job over and got further; it finishes it.
                log.info("collection job %s advanced by another worker", record.job_id.hex())
            if self.helper_unreachable:
                return progress
        return progress

    def backoff(self, failures: int) -> float:
        """Seconds before the next attempt after `failures` failed ones
        (exponential, capped, jittered so that retries do not come in step)."""
        delay = min(self.max_retry_seconds, self.retry_seconds * 2.0 ** min(failures - 1, 30))
        return delay * (0.5 + secrets.randbelow(1000) / 1000)

    def _job_failed(self, task_id: bytes, job_id: bytes, error: Exception) -> bool:
        """Settle a job that failed for a reason other than the helper being
        unreachable, on its own: a refusal of this job's content ends it at
        once, anything else is retried with backoff and given up after
        max_job_attempts failures. A given-up job's reports are rejected as
        job_failed, and the job records why. True if the job was given up."""
        why = f"{type(error).__name__}: {error}"
        extra = {"task_id": _task_label(task_id), "job_id": job_id.hex()}
        if isinstance(error, _REFUSES_THE_JOB):
            give_up = True
        else:
            failures = self.store.defer_aggregation_job(task_id, job_id, why, self.backoff)
            # A wrong token or an unknown task is the deployment's mistake, not
            # the job's: it waits for the operator and is never given up.
            give_up = not isinstance(error, _MISCONFIGURED) and failures >= self.max_job_attempts
            if not give_up:
                log.warning(
                    "aggregation job %s failed (attempt %d of %d), retried later: %s",
                    job_id.hex(),
                    failures,
                    self.max_job_attempts,
                    why,
                    extra=extra,
                )
                if self.metrics is not None:
                    self.metrics.aggregation_jobs.labels("retrying").inc()
                return False
        rejected = self.store.abandon_aggregation_job(
            task_id, job_id, ReportRejection.JOB_FAILED, why
        )
        log.error(
            "aggregation job %s given up, %d reports rejected as job_failed: %s",
            job_id.hex(),
            rejected,
            why,
            extra=extra,
        )
        if self.metrics is not None:
            self.metrics.aggregation_jobs.labels("failed").inc()
            self.metrics.reports_rejected.labels(
                _task_label(task_id), ReportRejection.JOB_FAILED.value
            ).inc(rejected)
        return True

    def _run_aggregation_jobs(self, jobs: Sequence[tuple[bytes, bytes]]) -> bool:
        """Run leased jobs as a pipeline: the leader opens and verifies job
        i + 1 while the helper verifies job i (the two sides take about as
        long per job, and the driver would otherwise wait for the helper half
        of the time). True if a job was finished.

        At the first job the helper cannot take, sets `helper_unreachable`
        and stops: the unfinished jobs stay leased to this driver, which takes
        them up again on its next pass (the helper answers a job it has
        already run with its stored answer)."""
        progress = False
        sent: tuple[_PreparedJob, Future[AggregationAnswer]] | None = None
        try:
            for task_id, job_id in jobs:
                if self.should_stop():
                    break
                try:
                    job = self._prepare_job(task_id, job_id)
                except Exception as e:
                    if is_transient_storage_error(e):
                        raise  # our own database: the pass ends, the job stays
                    progress |= self._job_failed(task_id, job_id, e)
                    continue
                if sent is not None:
                    progress |= self._settle(*sent)
                    sent = None
                    if self.helper_unreachable:
                        return progress
                sent = (job, self._helper_calls.submit(self._ask_helper, job))
            if sent is not None:
                progress |= self._settle(*sent)
                sent = None
        finally:
            if sent is not None:
                # An error ends the pass: the job at the helper stays open, and
                # no call of this driver outlives it.
                wait([sent[1]])
        return progress

    def _settle(self, job: _PreparedJob, answer: Future[AggregationAnswer]) -> bool:
        """Finish a job with the helper's answer; True if it is finished."""
        try:
            self._finish_job(job, answer.result())
            return True
        except Unavailable as e:
            log.warning(
                "aggregation job %s waits for the helper: %s",
                job.job_id.hex(),
                e,
                extra={"task_id": job.task.id_text, "job_id": job.job_id.hex()},
            )
            self.helper_unreachable = True
            return False
        except StorageConflict:
            # Our lease had expired and another driver finished the job first.
            log.info("aggregation job %s was finished by another worker", job.job_id.hex())
            return True
        except Exception as e:
            # A refusal of this job by the helper, a local gRPC failure, a
            # fault in this job alone: settled on its own, the pass goes on.
            if is_transient_storage_error(e):
                raise
            return self._job_failed(job.task.task_id, job.job_id, e)

    def _open_leader_share(
        self, task: LeaderTask, r: Report
    ) -> tuple[ReportRejection | None, bytes]:
        """HPKE-open the leader's input share: (rejection reason, plaintext)."""
        info = input_share_info(ROLE_LEADER, task.task_id, r.report_id, r.time, r.public_share)
        plaintext = self.open_share(self.keypair(r.leader_ct.config_id), r.leader_ct, info)
        if isinstance(plaintext, ReportRejection):
            return plaintext, b""
        return None, plaintext

    def run_aggregation_job(self, task_id: bytes, job_id: bytes) -> None:
        """Complete one aggregation job; idempotent, safe to repeat after a crash.

        The job's reports are verified together on the batched path: one
        bad report is rejected alone and never spoils the others."""
        job = self._prepare_job(task_id, job_id)
        self._finish_job(job, self._ask_helper(job))

    def _prepare_job(self, task_id: bytes, job_id: bytes) -> _PreparedJob:
        """The leader's first step of a job: open and verify its shares."""
        task = self.tasks[task_id]
        batch = self.batch_vdafs[task_id]
        began = time.monotonic()
        reports = self.store.job_reports(task_id, job_id)
        self.know_keys({r.leader_ct.config_id for r in reports})
        outcomes: dict[bytes, ReportRejection | None] = {}
        opened: list[Report] = []
        plaintexts: list[bytes] = []
        for r in reports:
            reason, plaintext = self._open_leader_share(task, r)
            if reason is not None:
                outcomes[r.report_id] = reason
            else:
                opened.append(r)
                plaintexts.append(plaintext)
        init = batch.verify_init_batch(
            task.verify_key,
            vdaf_ctx(task_id),
            0,
            [r.report_id for r in opened],
            [r.public_share for r in opened],
            plaintexts,
        )
        items: list[VerifyInitItem] = []
        row_of: dict[bytes, int] = {}
        for i, (r, error, verifier_share) in enumerate(
            zip(opened, init.errors, init.verifier_shares, strict=True)
        ):
            if error is not None or verifier_share is None:
                outcomes[r.report_id] = rejection_reason(error or VerifyError("rejected"))
                continue
            row_of[r.report_id] = i
            items.append(
                VerifyInitItem(r.report_id, r.time, r.public_share, r.helper_ct, verifier_share)
            )
        if items:
            # Verification took a while: hold on to the job for the helper's round trip.
            self.store.renew_aggregation_job(task_id, job_id, self.worker_id, self.lease_seconds)
        return _PreparedJob(
            task, job_id, began, len(reports), opened, init, items, row_of, outcomes
        )

    def _ask_helper(self, job: _PreparedJob) -> AggregationAnswer:
        """The helper's step of a job (nothing to ask if the leader rejected
        every report); reads the helper's clock from its answer."""
        if not job.items:
            return AggregationAnswer([])
        sent = self.clock()
        try:
            answer = self.helper.aggregate(job.task, job.job_id, job.items)
        except Unavailable:
            if self.metrics is not None:
                self.metrics.aggregation_jobs.labels("helper_unavailable").inc()
            raise
        if answer.helper_time is not None:
            reading = ClockOffset.measure(
                job.task.helper_address, sent, answer.helper_time, self.clock()
            )
            self.clocks.record(reading, job.task.max_clock_skew / 2)
        return answer

    def _too_early_wait(self, task: LeaderTask, report_time: int, now: float) -> float | None:
        """Seconds until a report the helper found too early goes to the helper
        again: until the helper's clock, by the latest reading, reaches
        report_time - max_clock_skew (when the helper takes it). None once
        max_helper_clock_lag has passed since report_time: then it is rejected.

        The helper checks the report against its own clock every time: a
        wrong reading only makes the report wait longer or go again sooner."""
        last_chance = report_time + self.max_helper_clock_lag
        if now >= last_chance:
            return None
        reading = self.clocks.latest(task.helper_address)
        if reading is None:
            wait = _TOO_EARLY_WAIT
        else:
            # In the helper's time: report_time - max_clock_skew; in ours,
            # less its offset; a second more against rounding.
            ready = report_time - task.max_clock_skew - reading.offset + reading.uncertainty
            wait = ready + 1.0 - now
        return min(max(wait, _MIN_TOO_EARLY_WAIT), last_chance - now)

    def _finish_job(self, job: _PreparedJob, answer: AggregationAnswer) -> None:
        """The leader's last step of a job: check the helper's verifier messages,
        then store the outcomes and add the accepted output shares. Reports
        the helper found too early go back to pending, to be sent again once
        its clock has caught up (_too_early_wait)."""
        task = job.task
        results = answer.results
        vdaf = self.vdafs[task.task_id]
        outcomes = dict(job.outcomes)
        deferred: dict[bytes, float] = {}
        now = self.clock()
        accepted: list[tuple[int, bytes, int]] = []  # bucket, report id, row in `out`
        deltas: list[BatchAggregate] = []
        if job.items:
            if [x.report_id for x in results] != [x.report_id for x in job.items]:
                raise Unavailable("the helper answered for other reports than it was sent")
            messages: list[bytes | None] = [None] * len(job.opened)
            for res in results:
                if res.verifier_message is None:
                    if res.reject == REPORT_TOO_EARLY:
                        report = job.opened[job.row_of[res.report_id]]
                        wait = self._too_early_wait(task, report.time, now)
                        if wait is not None:
                            deferred[res.report_id] = wait
                            continue
                    outcomes[res.report_id] = res.reject or REPORT_DROPPED
                else:
                    messages[job.row_of[res.report_id]] = res.verifier_message
            out = self.batch_vdafs[task.task_id].verify_next_batch(
                vdaf_ctx(task.task_id), job.init.state, messages
            )
            for res in results:
                if res.verifier_message is None:
                    continue
                i = job.row_of[res.report_id]
                error = out.errors[i]
                if error is not None:
                    outcomes[res.report_id] = rejection_reason(error)
                    continue
                outcomes[res.report_id] = None
                accepted.append((task.bucket(job.opened[i].time), res.report_id, i))
            # What this job adds; the store adds it to the buckets under its lock,
            # since other workers may be finishing jobs over the same buckets.
            deltas = job_deltas(self.batch_vdafs[task.task_id], out, accepted)
        self.store.finish_aggregation_job(
            task.task_id, job.job_id, outcomes, deltas, share_merge(vdaf), deferred
        )
        rejected = sum(1 for v in outcomes.values() if v is not None)
        if self.metrics is not None:
            m = self.metrics
            m.aggregation_jobs.labels("finished").inc()
            elapsed = time.monotonic() - job.began
            m.aggregation_job_seconds.observe(elapsed)
            if job.report_count:
                m.verify_seconds_per_report.observe(elapsed / job.report_count)
            m.reports_accepted.labels(task.id_text).inc(len(accepted))
            m.reports_deferred.labels(task.id_text).inc(len(deferred))
            for reason in outcomes.values():
                if reason is not None:
                    m.reports_rejected.labels(task.id_text, reason).inc()
        log.info(
            "aggregation job %s: %d aggregated, %d rejected",
            job.job_id.hex(),
            len(accepted),
            rejected,
            extra={"task_id": task.id_text, "job_id": job.job_id.hex()},
        )
        if deferred:
            reading = self.clocks.latest(task.helper_address)
            log.info(
                "aggregation job %s: %d reports the helper found too early are sent again in"
                " %.0f s or more (the helper's clock is %s)",
                job.job_id.hex(),
                len(deferred),
                min(deferred.values()),
                "not known" if reading is None else reading.describe(),
                extra={"task_id": task.id_text, "job_id": job.job_id.hex()},
            )

    def _fail(self, record: CollectionRecord, error: AggregatorError, reopen: bool) -> bool:
        """Mark the job failed. With `reopen` (no share has left the batch:
        the helper released none and the leader drew none) its buckets are
        reopened, so the batch can be collected again."""
        log.warning(
            "collection job %s failed%s: %s",
            record.job_id.hex(),
            "; its batch is collectable again" if reopen else "",
            error,
            extra={"task_id": _task_label(record.task_id), "job_id": record.job_id.hex()},
        )
        if self.metrics is not None:
            self.metrics.collections.labels(_task_label(record.task_id), "failed").inc()
        message = str(error)
        if reopen:
            message += " (nothing was released: the batch can be collected again)"
        self.store.fail_collection(
            CollectionRecord(
                record.task_id,
                record.job_id,
                record.start,
                record.duration,
                "failed",
                record.report_count,
                record.checksum,
                record.leader_ct,
                None,
                STATUS_CODES.get(error.status, 13),
                message,
            ),
            reopen=reopen,
        )
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
            extra={"task_id": _task_label(record.task_id), "job_id": record.job_id.hex()},
        )
        if isinstance(error, Unavailable):
            self.helper_unreachable = True
        return False

    def run_collection(self, record: CollectionRecord) -> bool:
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
        task = self.tasks.get(record.task_id)
        if task is None:
            return False
        start, end = record.start, record.start + record.duration
        vdaf = self.vdafs[task.task_id]
        share: list[int] = []
        if record.leader_ct is not None:
            # Stored by an earlier veil, which drew the leader's share first.
            count, checksum = record.report_count, record.checksum
        else:
            try:
                self.store.close_batch(task.task_id, start, end, record.job_id, task.time_precision)
            except StorageConflict:
                return self._fail(
                    record,
                    BatchCollected("the batch was already collected by another job"),
                    reopen=False,
                )
            if self.store.unaggregated_count(task.task_id, start, end):
                return False  # the next pass aggregates them first
            share, count, checksum = batch_summary(
                vdaf, self.store.batch_aggregates(task.task_id, start, end)
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
                check_batch_size(task, self.bounds[task.task_id], count)
            except BatchTooLarge as e:
                if not reopen:
                    e = BatchTooLarge(str(e) + _ONCE)
                return self._fail(record, e, reopen=reopen)
        try:
            helper_ct = self.helper.aggregate_share(
                task, record.job_id, start, record.duration, count, checksum
            )
        except AggregatorError as e:
            # WindowOpen: the window is closed by this leader's clock (it
            # checked) but not yet by the helper's, which is behind: the
            # helper's clock catches up, so the job waits for it.
            if e.retryable or isinstance(e, WindowOpen):
                return self._retry(record, e)
            # Under add_remove a refusal by the helper's own floor or ceiling
            # leaves the batch closed too: the answer is told once.
            told_once = task.dp.counts_protected and isinstance(e, (BatchTooSmall, BatchTooLarge))
            return self._fail(record, e, reopen=record.leader_ct is None and not told_once)
        leader_ct = record.leader_ct
        if leader_ct is None:
            try:
                noised, _eps = self.privacy.release(
                    task, vdaf, record.job_id, start, record.duration, share
                )
            except AggregatorError as e:
                if e.retryable:
                    # No noise vector ready yet (nothing spent): retried later.
                    return self._retry(record, e)
                # The helper's share exists (sealed to the collector, never
                # sent): the batch stays closed.
                return self._fail(record, e, reopen=False)
            if self.metrics is not None:
                self.privacy.report_budget(task, self.metrics)
            assert task.collector_hpke_config is not None
            leader_ct = seal(
                task.collector_hpke_config,
                agg_share_info(
                    ROLE_LEADER,
                    task.task_id,
                    start,
                    record.duration,
                    task.dp.released_count(count),
                    dp_params=task.dp.binding(task.vdaf),
                ),
                vdaf.encode_agg_share(noised),
            )
        self.store.update_collection(
            CollectionRecord(
                record.task_id,
                record.job_id,
                start,
                record.duration,
                "finished",
                count,
                checksum,
                leader_ct,
                helper_ct,
            )
        )
        if self.metrics is not None:
            self.metrics.collections.labels(task.id_text, "finished").inc()
        log.info(
            "collection job %s finished: %d reports",
            record.job_id.hex(),
            count,
            extra={"task_id": task.id_text, "job_id": record.job_id.hex()},
        )
        return True


# Why a batch refused by its floor or ceiling under add_remove stays closed.
_ONCE = (
    " (add_remove: whether a batch reaches min_batch_size is told only once, so the batch"
    " stays closed)"
)


def _task_label(task_id: bytes) -> str:
    return b64e(task_id)


def _reason(error: AggregatorError) -> str:
    """A metric label for a refusal: the error class in snake case."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(error).__name__).lower()
