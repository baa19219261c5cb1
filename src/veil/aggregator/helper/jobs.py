"""The helper's aggregation jobs (draft-ietf-ppm-dap section 4.5, helper
side), for every kind of task through one verification path.

A job is checked (authentication, its id, its size), then each report on
its own (well formed, not replayed, not too early by this clock, in the
task's window and batch, not expired), the shares that pass are opened at
once, and the VDAF's rounds run for the whole job through the task's engine
(veil.vdaf.engine.helper_steps): the leader's verifier shares of each round
so far against the helper's own. The answer, the replay records and what
the job adds to its sums are committed in one transaction; a job id asked
again gets the stored answer.

Where a job's reports come from is the one difference between the kinds,
and it is a `JobScope`: a task's stored uploads (`UploadScope`: replay
records per task, sums per time bucket, one round) or one query of a batch
at a level (`QueryScope` in veil.aggregator.helper.queries: replay records
and a sum per (batch, level), the rounds of a job answered one request at a
time).
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from veil.aggregator.context import TaskContext, TaskTable
from veil.aggregator.core import (
    BATCH_COLLECTED,
    INVALID_MESSAGE,
    INVALID_TOKEN,
    REPORT_DROPPED,
    REPORT_REPLAYED,
    REPORT_TOO_EARLY,
    VDAF_VERIFY_ERROR,
    VerifyInitItem,
    VerifyResult,
    check_id,
    job_deltas,
    rejection_reason,
    share_merge,
)
from veil.aggregator.errors import (
    ReportRejection,
    TooLarge,
)
from veil.aggregator.helper.checks import check_report, stored_answer
from veil.aggregator.keys import KeyRing, tally_open
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.records import (
    BatchAggregate,
    BucketCollected,
    HelperJob,
    ReportsAggregated,
)
from veil.hpke import ROLE_HELPER, Ciphertext, input_share_info
from veil.messages import REPORT_ID_SIZE, vdaf_ctx
from veil.metrics import Metrics
from veil.task import HelperTask
from veil.vdaf.engine import OutShares, Round, helper_steps

log = logging.getLogger(__name__)

MAX_JOB_SIZE = 10_000
# Refusals after which the report's id is not recorded as seen (see verify).
# An invalid token is not recorded either: nothing of the report was counted.
NOT_RECORDED = (INVALID_MESSAGE, REPORT_TOO_EARLY, INVALID_TOKEN)
# How often a job is checked again when its commit finds that another job
# aggregated some of its reports, or a collection closed one of its buckets
# or levels, after it read the store; each time, the reports it lost are
# refused.
COMMIT_ATTEMPTS = 5


class JobScope(Protocol):
    """Where one job's reports are recorded, and what differs with it."""

    agg_param: Any
    # The VDAF rounds this request runs (the helper's answer is the last's).
    rounds: int
    # The VDAF's application context (veil's, or DAP's "dap-19" || task_id).
    context: bytes

    def digest(self, job_id: bytes, items: Sequence[VerifyInitItem]) -> bytes:
        """What identifies the request: a job asked again must send the same."""
        ...

    def stored(self, job_id: bytes, digest: bytes) -> list[VerifyResult] | None:
        """The job's stored answer, if it is answered from its record
        (`digest`: the request's, in the VDAF's last round; empty before)."""
        ...

    def encode(self, results: Sequence[VerifyResult]) -> bytes:
        """The answer as the job's record stores it."""
        ...

    def seen(self, ids: Sequence[bytes]) -> set[bytes]:
        """Which of the (well-formed) ids this scope has recorded already."""
        ...

    def check(
        self, ctx: TaskContext[HelperTask], horizon: int | None, it: VerifyInitItem
    ) -> ReportRejection | None:
        """The scope's own checks of a report that passed the common ones
        (`horizon`: the task's report horizon now)."""
        ...

    def open(
        self, ctx: TaskContext[HelperTask], keys: KeyRing, items: Sequence[VerifyInitItem]
    ) -> list[Opened]:
        """The reports' input shares (the token split off), each with the
        outcome of its HPKE open to count (None: not opened by this call)."""
        ...

    def init(
        self,
        ctx: TaskContext[HelperTask],
        job_id: bytes,
        items: Sequence[VerifyInitItem],
        plaintexts: Sequence[bytes],
    ) -> Round:
        """The helper's first verification step of the opened reports."""
        ...

    def commit(
        self,
        ctx: TaskContext[HelperTask],
        job: HelperJob,
        results: Sequence[VerifyResult],
    ) -> list[VerifyResult] | None:
        """Store the job; the answer another process stored first, if any
        (ReportsAggregated, BucketCollected: check the job again)."""
        ...

    def deltas(
        self,
        ctx: TaskContext[HelperTask],
        out: OutShares,
        accepted: Sequence[tuple[int, bytes, int]],
    ) -> list[BatchAggregate]:
        """What the accepted reports (time bucket, report id, row of `out`)
        add to the sums the scope keeps."""
        ...

    def finished(
        self,
        ctx: TaskContext[HelperTask],
        job_id: bytes,
        seconds: float,
        items: Sequence[VerifyInitItem],
        results: Sequence[VerifyResult],
        deltas: Sequence[BatchAggregate],
    ) -> None:
        """Count and log a job this process committed."""
        ...


# A report's input share or why it has none, and its HPKE outcome to count
# (None where the share was not opened by this request: held from before).
Opened = tuple[ReportRejection | bytes, ReportRejection | bytes | None]


class Verified:
    """One request's outcome: each report's answer, and what a job that
    commits stores (replay records, rejection reasons, what it adds)."""

    def __init__(
        self,
        results: list[VerifyResult],
        recorded: list[tuple[bytes, int]],
        deltas: list[BatchAggregate],
    ) -> None:
        self.results = results
        self.recorded = recorded
        self.deltas = deltas

    def job(self, task_id: bytes, job_id: bytes, digest: bytes, response: bytes) -> HelperJob:
        rejected = [r.reject for r in self.results if r.reject not in (None, REPORT_TOO_EARLY)]
        return HelperJob(task_id, job_id, digest, response, self.recorded, rejected, self.deltas)


class HelperJobs:
    """The helper's aggregation jobs for the tasks in `tasks`."""

    def __init__(
        self,
        tasks: TaskTable[HelperTask],
        keys: KeyRing,
        store: Datastore,
        clock: Callable[[], float],
        metrics: Metrics | None = None,
    ) -> None:
        self.tasks = tasks
        self.keys = keys
        self.store = store
        self.clock = clock
        self.metrics = metrics

    def run(
        self,
        ctx: TaskContext[HelperTask],
        scope: JobScope,
        job_id: bytes,
        items: Sequence[VerifyInitItem],
        began: float,
    ) -> list[VerifyResult]:
        """Answer one request of a job in `scope` (its checks of the job as a
        whole already made): the stored answer, or the reports verified and,
        after the VDAF's last round, committed.

        No lock: any number of helper processes share the store, and its
        commit is what decides. A job id another process stored first gets
        that process's answer; reports another job aggregated meanwhile, or a
        batch or level collected meanwhile, make the job be checked again,
        and those reports are then refused as replayed or collected."""
        task = ctx.task
        # What identifies the request is needed only where a job is stored:
        # its last round (a first round of two is answered afresh).
        last = scope.rounds == ctx.engine.ROUNDS
        digest = scope.digest(job_id, items) if last else b""
        answer = scope.stored(job_id, digest)
        if answer is not None:
            return answer
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            verified = self.verify(ctx, scope, job_id, items)
            if not last:
                return verified.results  # a round before the last stores nothing
            job = verified.job(task.task_id, job_id, digest, scope.encode(verified.results))
            try:
                stored = scope.commit(ctx, job, verified.results)
            except (ReportsAggregated, BucketCollected) as e:
                if attempt >= COMMIT_ATTEMPTS:
                    raise
                log.info("aggregation job %s checked again: %s", job_id.hex(), e)
                continue
            if stored is not None:
                return stored
            scope.finished(
                ctx,
                job_id,
                time.monotonic() - began,
                items,
                verified.results,
                verified.deltas,
            )
            return verified.results
        raise AssertionError("unreachable")

    def verify(
        self,
        ctx: TaskContext[HelperTask],
        scope: JobScope,
        job_id: bytes,
        items: Sequence[VerifyInitItem],
    ) -> Verified:
        """Each report's answer to this request, with the replay records and
        what the accepted reports add (after the VDAF's last round)."""
        task = ctx.task
        now = self.clock()
        horizon = task.report_horizon(now)
        self.keys.know_keys({it.encrypted_input_share.config_id for it in items})
        seen = scope.seen([it.report_id for it in items if len(it.report_id) == REPORT_ID_SIZE])
        # The checks that do not depend on the job's other reports first,
        # then every share that passed them opened at once (over the opener's
        # threads), then each report's outcome in order, as if one at a time:
        # only a report id seen earlier in this job can change a check's
        # answer, and then to replayed, whatever the share (its open unused).
        checked = [_check(ctx, scope, now, horizon, it, seen) for it in items]
        to_open = [i for i, reason in enumerate(checked) if reason is None]
        shares = dict(
            zip(to_open, scope.open(ctx, self.keys, [items[i] for i in to_open]), strict=True)
        )
        tally: dict[str, int] = {}  # HPKE outcomes, counted once for the job
        reasons: list[ReportRejection | None] = []
        recorded: list[tuple[bytes, int]] = []
        opened: list[int] = []
        plaintexts: list[bytes] = []
        for i, it in enumerate(items):
            reason = checked[i]
            plaintext = b""
            if reason != INVALID_MESSAGE and it.report_id in seen:
                reason = REPORT_REPLAYED  # as check_report finds it
            elif reason is None:
                share, outcome = shares[i]
                if outcome is not None:
                    tally_open(outcome, tally)
                if isinstance(share, ReportRejection):
                    reason = share
                else:
                    plaintext = share
            # Neither a malformed report's id nor that of a report too early
            # by this helper's clock is recorded: nothing of it was counted,
            # and the leader sends a too-early report again later (in a new
            # job), when this clock has caught up with its time.
            if reason not in NOT_RECORDED and it.report_id not in seen:
                seen.add(it.report_id)
                recorded.append((it.report_id, it.time))
            reasons.append(reason)
            if reason is None:
                opened.append(i)
                plaintexts.append(plaintext)
        self.keys.count_opens(tally)
        messages: dict[int, tuple[bytes, bytes]] = {}
        deltas: list[BatchAggregate] = []
        if opened:
            chosen = [items[i] for i in opened]
            init = scope.init(ctx, job_id, chosen, plaintexts)
            leader_shares: list[list[bytes | None]] = [[it.leader_verifier_share for it in chosen]]
            if scope.rounds > 1:
                leader_shares.append([it.leader_verifier_share_2 for it in chosen])
            step, last = helper_steps(
                ctx.engine, scope.context, scope.agg_param, init, leader_shares
            )
            accepted: list[tuple[int, bytes, int]] = []  # bucket, report id, row
            for row, i in enumerate(opened):
                error = step.errors[row]
                message = last.messages[row]
                share_next = step.verifier_shares[row] if isinstance(step, Round) else b""
                if error is not None or message is None or share_next is None:
                    reasons[i] = rejection_reason(error) if error else VDAF_VERIFY_ERROR
                    continue
                messages[i] = (message, share_next)
                accepted.append((ctx.task.bucket(items[i].time), items[i].report_id, row))
            if isinstance(step, OutShares):
                deltas = scope.deltas(ctx, step, accepted)
        results: list[VerifyResult] = []
        for i, it in enumerate(items):
            answer = messages.get(i)
            if answer is not None:
                results.append(VerifyResult(it.report_id, answer[0], None, answer[1]))
            else:
                results.append(VerifyResult(it.report_id, None, reasons[i] or VDAF_VERIFY_ERROR))
        return Verified(results, recorded, deltas)


def _check(
    ctx: TaskContext[HelperTask],
    scope: JobScope,
    now: float,
    horizon: int | None,
    it: VerifyInitItem,
    seen: set[bytes],
) -> ReportRejection | None:
    """The helper's own checks of one report before its share is opened
    (None: open it). `horizon` is `task.report_horizon(now)`."""
    reason = check_report(ctx.task, now, it, seen)
    if reason is not None:
        return reason
    return scope.check(ctx, horizon, it)


# --- a task's stored uploads (Prio3) --------------------------------------

# One struct per item shape (the lengths of its variable fields): a task's
# items share a few shapes, so the cache stays small; past its bound (items
# of many lengths, which only a hostile leader sends) each pack compiles its
# format again rather than growing the cache.
_ITEM_PACKERS: dict[tuple[int, int, int, int, int], Callable[..., bytes]] = {}
_ITEM_PACKERS_MAX = 64


def _item_packer(shape: tuple[int, int, int, int, int]) -> Callable[..., bytes]:
    pack = _ITEM_PACKERS.get(shape)
    if pack is None:
        i, p, e, c, v = shape
        pack = struct.Struct(f">I{i}sIQBI{p}sI{e}sI{c}sI{v}s").pack
        if len(_ITEM_PACKERS) < _ITEM_PACKERS_MAX:
            _ITEM_PACKERS[shape] = pack
    return pack


def request_hash(task_id: bytes, job_id: bytes, items: Sequence[VerifyInitItem]) -> bytes:
    """SHA-256 over the task id, the job id and each item's fields, each of
    an item's fields prefixed by its 4-byte length (time and config id as one
    9-byte field); each item packed at once, the bytes joined and hashed at
    once. Where items carry tokens (a task with invitations), the item count
    and each item's token and leader share digest follow, length-prefixed
    (a request without any hashes as before)."""
    parts = [task_id, job_id]
    append = parts.append
    for it in items:
        ct = it.encrypted_input_share
        rid, ps, enc, payload, lvs = (
            it.report_id,
            it.public_share,
            ct.enc,
            ct.payload,
            it.leader_verifier_share,
        )
        shape = (len(rid), len(ps), len(enc), len(payload), len(lvs))
        append(
            _item_packer(shape)(
                shape[0],
                rid,
                9,
                it.time,
                ct.config_id,
                shape[1],
                ps,
                shape[2],
                enc,
                shape[3],
                payload,
                shape[4],
                lvs,
            )
        )
    if any(it.token or it.leader_share_digest for it in items):
        append(struct.pack(">I", len(items)))
        for it in items:
            for field in (it.token, it.leader_share_digest):
                append(struct.pack(">I", len(field)) + field)
    return hashlib.sha256(b"".join(parts)).digest()


def encode_response(results: Sequence[VerifyResult]) -> bytes:
    return json.dumps(
        [
            [
                r.report_id.hex(),
                None if r.verifier_message is None else r.verifier_message.hex(),
                r.reject,
            ]
            for r in results
        ]
    ).encode()


def decode_response(data: bytes) -> list[VerifyResult]:
    return [
        VerifyResult(
            bytes.fromhex(i),
            None if m is None else bytes.fromhex(m),
            None if r is None else ReportRejection(r),
        )
        for i, m, r in json.loads(data)
    ]


class UploadScope:
    """A job over a task's stored uploads: one round, replay records per
    task, what it adds summed per time bucket, a batch closed by bucket."""

    agg_param = None
    rounds = 1

    def __init__(self, jobs: HelperJobs, ctx: TaskContext[HelperTask]) -> None:
        self.store = jobs.store
        self.metrics = jobs.metrics
        self.task_id = ctx.task.task_id
        self.context = vdaf_ctx(self.task_id)
        # Whether each time bucket of the job was collected, as first read.
        self._collected: dict[int, bool] = {}

    def digest(self, job_id: bytes, items: Sequence[VerifyInitItem]) -> bytes:
        return request_hash(self.task_id, job_id, items)

    def encode(self, results: Sequence[VerifyResult]) -> bytes:
        return encode_response(results)

    def stored(self, job_id: bytes, digest: bytes) -> list[VerifyResult] | None:
        stored = self.store.helper_job(self.task_id, job_id)
        return stored_answer(job_id, stored, digest, decode_response)

    def seen(self, ids: Sequence[bytes]) -> set[bytes]:
        self._collected = {}  # read again on each attempt of the job
        return self.store.seen_reports(self.task_id, ids)

    def check(
        self, ctx: TaskContext[HelperTask], horizon: int | None, it: VerifyInitItem
    ) -> ReportRejection | None:
        if horizon is not None and it.time < horizon:
            # Expired: its replay record may already be gone (DAP: report_dropped).
            return REPORT_DROPPED
        bucket = self.bucket(ctx, it)
        collected = self._collected.get(bucket)
        if collected is None:
            aggs = self.store.batch_aggregates(self.task_id, bucket, bucket + 1)
            collected = self._collected[bucket] = any(a.collected_by is not None for a in aggs)
        return BATCH_COLLECTED if collected else None

    def bucket(self, ctx: TaskContext[HelperTask], it: VerifyInitItem) -> int:
        """The bucket a report of this job joins: its time's."""
        return ctx.task.bucket(it.time)

    def open(
        self, ctx: TaskContext[HelperTask], keys: KeyRing, items: Sequence[VerifyInitItem]
    ) -> list[Opened]:
        task = ctx.task
        opened = keys.open_shares([_share_and_info(task, it) for it in items])
        return [(outcome, outcome) for outcome in opened]

    def init(
        self,
        ctx: TaskContext[HelperTask],
        job_id: bytes,
        items: Sequence[VerifyInitItem],
        plaintexts: Sequence[bytes],
    ) -> Round:
        task = ctx.task
        return ctx.engine.verify_init(
            task.verify_key,
            self.context,
            1,
            None,
            [it.report_id for it in items],
            [it.public_share for it in items],
            plaintexts,
        )

    def commit(
        self,
        ctx: TaskContext[HelperTask],
        job: HelperJob,
        results: Sequence[VerifyResult],
    ) -> list[VerifyResult] | None:
        stored = self.store.commit_helper_job(job, share_merge(ctx.engine))
        return stored_answer(job.job_id, stored, job.request_hash, decode_response)

    def deltas(
        self,
        ctx: TaskContext[HelperTask],
        out: OutShares,
        accepted: Sequence[tuple[int, bytes, int]],
    ) -> list[BatchAggregate]:
        """Summed per time bucket."""
        return job_deltas(ctx.engine, out, accepted)

    def finished(
        self,
        ctx: TaskContext[HelperTask],
        job_id: bytes,
        seconds: float,
        items: Sequence[VerifyInitItem],
        results: Sequence[VerifyResult],
        deltas: Sequence[BatchAggregate],
    ) -> None:
        task = ctx.task
        rejected = [r.reject for r in results if r.reject is not None]
        aggregated = sum(d.report_count for d in deltas)
        m = self.metrics
        if m is not None:
            m.aggregation_jobs.labels("finished").inc()
            m.aggregation_job_seconds.observe(seconds)
            if items:
                m.verify_seconds_per_report.observe(seconds / len(items))
            m.reports_accepted.labels(task.id_text).inc(aggregated)
            for reason in rejected:
                if reason == REPORT_TOO_EARLY:
                    m.reports_deferred.labels(task.id_text).inc()
                else:
                    m.reports_rejected.labels(task.id_text, reason).inc()
        too_early = rejected.count(REPORT_TOO_EARLY)
        log.info(
            "aggregation job %s: %d aggregated, %d rejected, %d too early by this clock (the"
            " leader sends them again)",
            job_id.hex(),
            aggregated,
            len(rejected) - too_early,
            too_early,
            extra={"task_id": task.id_text, "job_id": job_id.hex()},
        )


def _share_and_info(task: HelperTask, it: VerifyInitItem) -> tuple[Ciphertext, bytes]:
    """A report's sealed share to the helper and the context it opens with."""
    info = input_share_info(ROLE_HELPER, task.task_id, it.report_id, it.time, it.public_share)
    return it.encrypted_input_share, info


def check_size(job_id: bytes, items: Sequence[VerifyInitItem]) -> None:
    check_id(job_id, "aggregation_job_id")
    if len(items) > MAX_JOB_SIZE:
        raise TooLarge(f"aggregation job has {len(items)} reports; at most {MAX_JOB_SIZE}")
