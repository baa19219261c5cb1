"""Aggregation jobs (draft-ietf-ppm-dap section 4.5, leader side): stored
reports are grouped into jobs, and each leased job is completed with one
round trip to the helper.

Any number of drivers may share one store: each job is leased to one driver
at a time (a crashed driver's lease expires and another takes the job over),
the helper answers a repeated job id with its stored answer, and batch
aggregates are merged under the store's lock.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from veil.aggregator.context import TaskTable
from veil.aggregator.core import (
    REPORT_TOO_EARLY,
    AggregationAnswer,
    VerifyInitItem,
    VerifyResult,
    share_merge,
    task_vdaf_ctx,
)
from veil.aggregator.errors import (
    InvalidMessage,
    JobConflict,
    ReportRejection,
    TooLarge,
    Unauthenticated,
    Unavailable,
    UnknownTask,
    WindowMismatch,
)
from veil.aggregator.keys import KeyRing, tally_open
from veil.aggregator.leader.control import Backoff, DriverControl
from veil.aggregator.leader.dap import open_leader_shares
from veil.aggregator.leader.job import AnyReport, PreparedJob, finish_job, prepare_job
from veil.aggregator.leader.meter import LeaderMeter
from veil.aggregator.leader.peer import HelperPeer, helper_of
from veil.aggregator.leader.settings import LeaderSettings
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.batches import joinable_from
from veil.aggregator.store.records import (
    JobReport,
    StorageConflict,
    is_transient_storage_error,
    leader_selected_bucket,
)
from veil.hpke import ROLE_LEADER, input_share_info
from veil.messages import Report
from veil.task import LeaderTask, b64e
from veil.vdaf.engine import Round

log = logging.getLogger(__name__)

# Refusals of a job's content: the same job would be refused again.
_REFUSES_THE_JOB = (TooLarge, InvalidMessage, JobConflict)
# Refusals that say the deployment is misconfigured, not the job.
_MISCONFIGURED = (Unauthenticated, UnknownTask)
# How long a job waits after its helper refused the task's window for now:
# not the growing backoff, since the two organisations' files may agree at
# any moment, and about as often as the driver asks a helper that is away.
_WINDOW_BACKOFF = Backoff(2.0, 2.0)
# Aggregation jobs a driver leases at once (see JobDriver._run_jobs).
JOBS_PER_LEASE = 4
# A job's lease is renewed before the helper's round trip only once this
# share of the lease may have passed since it was taken (or renewed): a
# lease taken moments ago holds nearly all of it still, and the renewal
# costs a statement (0.5 ms a job on PostgreSQL).
RENEW_AFTER = 0.1


def leader_share_info(task: LeaderTask, r: Report | JobReport) -> bytes:
    """The context the leader's input share of a stored report opens with."""
    return input_share_info(ROLE_LEADER, task.task_id, r.report_id, r.time, r.public_share)


class UploadJobs:
    """A job over a task's stored uploads (`JobSource`): an answer for other
    reports than were sent is the helper's fault of the moment (retried),
    a report the helper finds too early goes back to pending until its clock
    has caught up, and each accepted report adds to its time bucket."""

    def __init__(self, peer: HelperPeer, now: float, batch_id: bytes | None = None) -> None:
        self.peer = peer
        self.now = now
        # A leader-selected job's batch: its reports add to the batch's one
        # bucket, not to their times'.
        self.batch = None if batch_id is None else leader_selected_bucket(batch_id)

    def check_answer(self, answer: AggregationAnswer, items: Sequence[VerifyInitItem]) -> None:
        if [x.report_id for x in answer.results] != [x.report_id for x in items]:
            raise Unavailable("the helper answered for other reports than it was sent")

    def deferral(self, task: LeaderTask, result: VerifyResult, report: AnyReport) -> float | None:
        if result.reject != REPORT_TOO_EARLY:
            return None
        return self.peer.too_early_wait(task, report.time, self.now)

    def bucket(self, task: LeaderTask, report: AnyReport) -> int:
        return task.bucket(report.time) if self.batch is None else self.batch


class JobDriver:
    """Creates, leases and completes the aggregation jobs of the tasks in
    `tasks` whose jobs come from stored uploads, as the driver `worker_id`."""

    def __init__(
        self,
        tasks: TaskTable[LeaderTask],
        keys: KeyRing,
        store: Datastore,
        clock: Callable[[], float],
        peer: HelperPeer,
        meter: LeaderMeter,
        control: DriverControl,
        settings: LeaderSettings,
        worker_id: str,
    ) -> None:
        self.tasks = tasks
        self.keys = keys
        self.store = store
        self.clock = clock
        self.peer = peer
        self.meter = meter
        self.control = control
        self.settings = settings
        self.worker_id = worker_id
        self.backoff = Backoff(settings.retry_seconds, settings.max_retry_seconds)
        # Reports per job, per task (see job_size), once asked.
        self.job_sizes: dict[bytes, int] = {}
        # The helper's round trip for one job runs here while the driver
        # prepares the next.
        self._helper_calls = ThreadPoolExecutor(1, thread_name_prefix="helper-call")

    def job_size(self, task_id: bytes) -> int:
        """Reports per job of the task: job_size, or fewer where that many
        reports would make a request larger than max_job_bytes."""
        size = self.job_sizes.get(task_id)
        if size is None:
            s = self.settings
            item = self.tasks.context(task_id).sizes.job_item_bytes()
            size = self.job_sizes[task_id] = max(1, min(s.job_size, s.max_job_bytes // item))
        return size

    def run_pass(self) -> bool:
        """Group pending reports into jobs, then complete the jobs this driver
        can lease; True if a job was created or finished. Stops early when
        the helper cannot be reached (`control.helper_unreachable`)."""
        progress = False
        tasks = self.tasks.tasks
        # Only our tasks, each asked directly: cheaper on a large shared table
        # than looking for the tasks that have pending reports.
        for ctx in self.tasks.contexts.values():
            if ctx.by_query:
                continue  # aggregated by its collections' queries (leader/prefixes.py)
            while not self.control.stopping and self._create_job(ctx.task):
                progress = True
        while not self.control.stopping:
            # Before the statement: the lease's expiry, which the database
            # sets from its own clock, is no earlier than this plus the lease.
            leased_at = time.monotonic()
            leased = self.store.acquire_aggregation_jobs(
                self.worker_id, self.settings.lease_seconds, JOBS_PER_LEASE
            )
            if not leased:
                break
            ours = [(t, j) for t, j in leased if t in tasks]
            for task_id, job_id in leased:
                if task_id not in tasks:
                    log.warning(
                        "aggregation job %s is for a task not configured here", job_id.hex()
                    )
            finished = self._run_jobs(ours, leased_at)
            progress |= finished
            if self.control.helper_unreachable:
                break
            if len(ours) < len(leased):
                break  # we would lease the foreign jobs again first
            if not finished:
                break  # every job failed and waits for its retry: collections go on
        return progress

    def _create_job(self, task: LeaderTask) -> int:
        """A new job of the task's pending reports; a leader-selected task's
        joins a batch in the same transaction (veil.aggregator.store.batches),
        a new one of 32 random bytes where none is open and young enough
        (batches.joinable_from)."""
        task_id, job_id, size = task.task_id, secrets.token_bytes(16), self.job_size(task.task_id)
        if task.dap is not None and task.dap.leader_selected:
            oldest = joinable_from(
                self.clock(), task.report_expiry_age, task.time_precision, task.max_clock_skew
            )
            return self.store.create_batch_job(
                task_id, job_id, size, task.min_batch_size, secrets.token_bytes(32), oldest
            )
        return self.store.create_aggregation_job(task_id, job_id, size)

    def _job_failed(self, task_id: bytes, job_id: bytes, error: Exception) -> bool:
        """Settle a job that failed for a reason other than the helper being
        unreachable, on its own: a refusal of this job's content ends it at
        once, anything else is retried with backoff and given up after
        max_job_attempts failures. A given-up job's reports are rejected as
        job_failed, and the job records why. True if the job was given up."""
        why = f"{type(error).__name__}: {error}"
        extra = {"task_id": b64e(task_id), "job_id": job_id.hex()}
        if isinstance(error, _REFUSES_THE_JOB):
            give_up = True
        else:
            failures = self.store.defer_aggregation_job(task_id, job_id, why, self.backoff)
            # A wrong token or an unknown task is the deployment's mistake, not
            # the job's: it waits for the operator and is never given up.
            attempts = self.settings.max_job_attempts
            give_up = not isinstance(error, _MISCONFIGURED) and failures >= attempts
            if not give_up:
                log.warning(
                    "aggregation job %s failed (attempt %d of %d), retried later: %s",
                    job_id.hex(),
                    failures,
                    attempts,
                    why,
                    extra=extra,
                )
                self.meter.job_retrying()
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
        self.meter.job_given_up(task_id, rejected)
        return True

    def _run_jobs(self, jobs: Sequence[tuple[bytes, bytes]], leased_at: float) -> bool:
        """Run leased jobs as a pipeline: the leader opens and verifies job
        i + 1 while the helper verifies job i (the two sides take about as
        long per job, and the driver would otherwise wait for the helper half
        of the time). True if a job was finished.

        At the first job the helper cannot take, says so to `control` and
        stops: the unfinished jobs stay leased to this driver, which takes
        them up again on its next pass (the helper answers a job it has
        already run with its stored answer). `leased_at` is when the jobs'
        leases were taken (time.monotonic(), before the statement)."""
        progress = False
        sent: tuple[PreparedJob, Future[AggregationAnswer]] | None = None
        try:
            for task_id, job_id in jobs:
                if self.control.stopping:
                    break
                try:
                    job = self.prepare_job(task_id, job_id, leased_at)
                except Exception as e:
                    if is_transient_storage_error(e):
                        raise  # our own database: the pass ends, the job stays
                    progress |= self._job_failed(task_id, job_id, e)
                    continue
                if sent is not None:
                    progress |= self._settle(*sent)
                    sent = None
                    if self.control.helper_unreachable:
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

    def _settle(self, job: PreparedJob, answer: Future[AggregationAnswer]) -> bool:
        """Finish a job with the helper's answer; True if it is finished."""
        try:
            self.finish_job(job, answer.result())
            return True
        except Unavailable as e:
            log.warning(
                "aggregation job %s waits for the helper: %s",
                job.job_id.hex(),
                e,
                extra={"task_id": job.task.id_text, "job_id": job.job_id.hex()},
            )
            if isinstance(e, WindowMismatch):
                # A helper that answered, refusing this task's window for
                # now: this task's alone, so its job waits and the pass goes
                # on (ending it held up every task of the leader until the
                # two organisations' files agreed).
                why = f"{type(e).__name__}: {e}"
                self.store.defer_aggregation_job(job.task.task_id, job.job_id, why, _WINDOW_BACKOFF)
                return False
            # Said on the pending collections of this helper's tasks
            # (collection.note_helper_away).
            self.control.helper_away(str(e), helper_of(job.task))
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

    def open_leader_share(
        self, task: LeaderTask, r: Report
    ) -> tuple[ReportRejection | None, bytes]:
        """HPKE-open the leader's input share: (rejection reason, plaintext)."""
        keys = self.keys
        keypair = keys.keypair(r.leader_ct.config_id)
        plaintext = keys.open_share(keypair, r.leader_ct, leader_share_info(task, r))
        if isinstance(plaintext, ReportRejection):
            return plaintext, b""
        return None, plaintext

    def prepare_job(
        self, task_id: bytes, job_id: bytes, leased_at: float | None = None
    ) -> PreparedJob:
        """The leader's first step of a job: open and verify its shares
        (veil.aggregator.leader.job.prepare_job).

        Before the helper's round trip the job's lease is renewed, unless it
        was taken at `leased_at` (time.monotonic()) less than RENEW_AFTER of
        the lease ago: then at least nine tenths of it are left (None:
        renewed)."""
        ctx = self.tasks.context(task_id)
        task = ctx.task
        began = time.monotonic()
        reports = self.store.job_reports(task_id, job_id)
        keys = self.keys
        keys.know_keys({r.leader_ct_bytes[0] for r in reports if r.leader_ct_bytes})
        # The job's shares opened at once, over the opener's threads (a DAP
        # task's with DAP's info and associated data).
        if task.dap is not None:
            shares = open_leader_shares(keys, task, reports)
        else:
            shares = keys.open_stored_shares(
                [(r.leader_ct_bytes, leader_share_info(task, r)) for r in reports]
            )
        tally: dict[str, int] = {}  # HPKE outcomes, counted once for the job
        for share in shares:
            tally_open(share, tally)
        keys.count_opens(tally)

        def init(ids: list[bytes], public: list[bytes], plaintexts: list[bytes]) -> Round:
            return ctx.engine.verify_init(
                task.verify_key, task_vdaf_ctx(task), 0, None, ids, public, plaintexts
            )

        job = prepare_job(ctx, job_id, None, reports, shares, init, began)
        if task.dap is not None and task.dap.leader_selected:
            job = dataclasses.replace(job, batch_id=self.store.job_batch(task_id, job_id))
        lease = self.settings.lease_seconds
        if job.items and (leased_at is None or time.monotonic() - leased_at >= RENEW_AFTER * lease):
            # Verification, or the jobs before it in the lease, took a while:
            # hold on to the job for the helper's round trip.
            self.store.renew_aggregation_job(task_id, job_id, self.worker_id, lease)
        return job

    def _ask_helper(self, job: PreparedJob) -> AggregationAnswer:
        """The helper's step of a job (nothing to ask if the leader rejected
        every report)."""
        if not job.items:
            return AggregationAnswer([])
        try:
            return self.peer.aggregate(job.task, job.job_id, job.items, job.batch_id)
        except Unavailable:
            self.meter.helper_unavailable()
            raise

    def finish_job(self, job: PreparedJob, answer: AggregationAnswer) -> None:
        """The leader's last step of a job: check the helper's verifier messages,
        then store the outcomes and add the accepted output shares. Reports
        the helper found too early go back to pending, to be sent again once
        its clock has caught up (HelperPeer.too_early_wait)."""
        task = job.task
        ctx = self.tasks.context(task.task_id)
        done = finish_job(ctx, UploadJobs(self.peer, self.clock(), job.batch_id), job, answer)
        outcomes, deferred = done.outcomes, done.deferred
        self.store.finish_aggregation_job(
            task.task_id,
            job.job_id,
            outcomes,
            done.deltas,
            share_merge(ctx.engine),
            deferred,
        )
        rejected = sum(1 for v in outcomes.values() if v is not None)
        self.meter.job_finished(
            task,
            time.monotonic() - job.began,
            job.report_count,
            done.accepted,
            len(deferred),
            outcomes,
        )
        log.info(
            "aggregation job %s: %d aggregated, %d rejected",
            job.job_id.hex(),
            done.accepted,
            rejected,
            extra={"task_id": task.id_text, "job_id": job.job_id.hex()},
        )
        if deferred:
            log.info(
                "aggregation job %s: %d reports the helper found too early are sent again in"
                " %.0f s or more (the helper's clock is %s)",
                job.job_id.hex(),
                len(deferred),
                min(deferred.values()),
                self.peer.describe_clock(task),
                extra={"task_id": task.id_text, "job_id": job.job_id.hex()},
            )
