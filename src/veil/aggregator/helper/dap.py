"""The helper's side of DAP's aggregation (draft-ietf-ppm-dap sections 4.5
and 4.6, helper side), for tasks served over DAP (a task file's [dap]
table): a thin adapter onto the helper's one verification path
(`HelperJobs.run`) and its one release step (`HelperRelease`), so that
replay records, batch buckets, ledgers and DP noise are the gRPC helper's.
HTTP stays outside (`veil.aggregator.run.dap_helper_http`).

What DAP changes is the bytes around the engine: the input share opens
with DAP's `info` and its InputShareAad (`DapScope.open`), verification
runs under the context ``"dap-19" || task_id``, the leader's verifier share
and the helper's verifier message travel in the VDAF's ping-pong messages,
times count the task's time precision, and the aggregate share is sealed
with DAP's `info` and its AggregateShareAad.

Both resources are created by POST with an id the helper derives from the
request's content (section 3.2, "Resource Creation"): the first 16 bytes
of SHA-256 over the body, so that a retried request finds the resource
it created, and a job asked again is answered from its stored record.
Every request is handled synchronously.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

from veil.aggregator.context import TaskContext, TaskTable
from veil.aggregator.core import (
    TASK_EXPIRED,
    VerifyInitItem,
    VerifyResult,
    authorize,
    job_deltas,
    share_merge,
)
from veil.aggregator.errors import (
    AggregatorError,
    BatchCollected,
    BatchMismatch,
    BatchTooLarge,
    BatchTooSmall,
    BudgetExhausted,
    InvalidMessage,
    JobConflict,
    ReportRejection,
    TooLarge,
    Unauthenticated,
    UnknownTask,
    WindowOpen,
)
from veil.aggregator.helper.checks import same_request
from veil.aggregator.helper.jobs import MAX_JOB_SIZE, HelperJobs, Opened, UploadScope
from veil.aggregator.helper.release import HelperRelease
from veil.aggregator.keys import KeyRing
from veil.aggregator.store.records import BatchAggregate, HelperJob, leader_selected_bucket
from veil.dap.codec import DecodeError
from veil.dap.invitation import INVITATION_EXTENSION, InvitationExtension
from veil.dap.jobs import (
    AggregateShare,
    AggregateShareReq,
    AggregationJobContinueReq,
    AggregationJobInitReq,
    BatchSelector,
    VerifyResp,
    VerifyRespType,
    continue_resp,
)
from veil.dap.messages import (
    LEADER_SELECTED_BATCH_ID_EXTENSION,
    BatchMode,
    HpkeConfig,
    HpkeConfigList,
    PlaintextInputShare,
    ReportMetadata,
    extensions_in_order,
)
from veil.dap.pingpong import finish, initialize_share
from veil.dap.problems import (
    DapAbort,
    DapUnauthorized,
    Problem,
    ProblemType,
    batch_interval_seconds,
    refuse_extensions_and_agg_param,
)
from veil.dap.shares import input_share_aads, seal_aggregate_share
from veil.dap.versions import DapVersion, ReportError, Role, input_share_info, vdaf_context
from veil.hpke import Ciphertext
from veil.invite.token import TokenError
from veil.task import HelperTask
from veil.vdaf.engine import OutShares

# The id of a DAP task's one VDAF verification key (veil's task files hold
# one key; the leader names it in every AggregationJobInitReq).
VERIFICATION_KEY_ID = 0
# The bytes of an aggregation job's and an aggregate share's id.
RESOURCE_ID_SIZE = 16

# A report the engine refused, as DAP names it. A VDAF decode error is the
# draft's invalid_message (section 4.5.2.4: an input share that cannot be
# decoded), and so is a report of a task with invitations whose token is
# missing or not for it (the draft has no closer code).
_REPORT_ERRORS = {
    ReportRejection.BATCH_COLLECTED: ReportError.BATCH_COLLECTED,
    ReportRejection.REPORT_REPLAYED: ReportError.REPORT_REPLAYED,
    ReportRejection.REPORT_DROPPED: ReportError.REPORT_DROPPED,
    ReportRejection.HPKE_UNKNOWN_CONFIG_ID: ReportError.HPKE_UNKNOWN_CONFIG_ID,
    ReportRejection.HPKE_DECRYPT_ERROR: ReportError.HPKE_DECRYPT_ERROR,
    ReportRejection.VDAF_DECODE_ERROR: ReportError.INVALID_MESSAGE,
    ReportRejection.VDAF_VERIFY_ERROR: ReportError.VDAF_VERIFY_ERROR,
    ReportRejection.REPORT_TOO_EARLY: ReportError.REPORT_TOO_EARLY,
    ReportRejection.INVALID_MESSAGE: ReportError.INVALID_MESSAGE,
    ReportRejection.INVALID_TOKEN: ReportError.INVALID_MESSAGE,
}

# The problem type and status of each of the engine's refusals of a whole
# request (anything else is an internal error).
_PROBLEMS: tuple[tuple[type[AggregatorError], ProblemType, int], ...] = (
    (UnknownTask, ProblemType.UNRECOGNIZED_TASK, 404),
    (BatchCollected, ProblemType.BATCH_OVERLAP, 400),
    (BatchMismatch, ProblemType.BATCH_MISMATCH, 400),
    (BatchTooSmall, ProblemType.INVALID_BATCH_SIZE, 400),
    (BatchTooLarge, ProblemType.INVALID_BATCH_SIZE, 400),
    (WindowOpen, ProblemType.BATCH_INVALID, 400),
    (BudgetExhausted, ProblemType.BATCH_INVALID, 400),
    (TooLarge, ProblemType.INVALID_MESSAGE, 413),
    (JobConflict, ProblemType.INVALID_MESSAGE, 409),
    (InvalidMessage, ProblemType.INVALID_MESSAGE, 400),
)


class DapRetry(Exception):
    """The helper cannot answer now (its backlog is full, or the leader's
    task window differs): the same request may be sent again later."""


def resource_id(body: bytes) -> bytes:
    """The id of the resource a POST of `body` creates (section 3.2): the
    same request always names the same resource."""
    return hashlib.sha256(body).digest()[:RESOURCE_ID_SIZE]


@dataclass(frozen=True)
class _Init:
    """An AggregationJobInitReq read: the reports the engine runs and the
    answers given before it (in the request's order, None where the engine
    answers)."""

    report_ids: list[bytes]
    items: list[VerifyInitItem]
    metadata: dict[bytes, ReportMetadata]
    early: list[VerifyResp | None]
    # The leader-selected batch the job's reports join (None: a task of
    # time buckets).
    batch_id: bytes | None = None


class DapScope(UploadScope):
    """A DAP aggregation job over its own reports: the gRPC helper's upload
    scope (replay records per task, sums per time bucket, one round) with
    DAP's open and context, its record holding the AggregationJobResp
    itself (with the reports answered before the engine, `early`), so that
    a retry or a poll gets the same bytes."""

    def __init__(
        self,
        jobs: HelperJobs,
        ctx: TaskContext[HelperTask],
        version: DapVersion,
        init: _Init,
    ) -> None:
        super().__init__(jobs, ctx)
        self.task = ctx.task
        self.version = version
        self.config = ctx.task.dap_configuration()
        self.read = init
        self.context = vdaf_context(version, self.task_id)
        # The one bucket of a leader-selected job's batch (None: each
        # report's time bucket).
        self.batch = None if init.batch_id is None else leader_selected_bucket(init.batch_id)
        # The answer: the stored one where the job was answered before,
        # else the one this request's verification encoded.
        self.answer: bytes | None = None

    def encode(self, results: Sequence[VerifyResult]) -> bytes:
        """The AggregationJobResp, kept as the answer (the job's record
        stores the same bytes)."""
        by_id = {r.report_id: r for r in results}
        parts = []
        # AggregationJobResp's encoding, each verified report's written out.
        for report_id, early in zip(self.read.report_ids, self.read.early, strict=True):
            if early is not None:
                parts.append(early.encode(self.version))
                continue
            result = by_id[report_id]
            if result.reject is None and result.verifier_message is not None:
                parts.append(continue_resp(report_id, finish(result.verifier_message)))
            else:
                parts.append(verify_resp(self.task, self.version, result).encode(self.version))
        self.answer = b"".join(parts)
        return self.answer

    def stored(self, job_id: bytes, digest: bytes) -> list[VerifyResult] | None:
        return self._answered(job_id, self.store.helper_job(self.task_id, job_id), digest)

    def commit(
        self,
        ctx: TaskContext[HelperTask],
        job: HelperJob,
        results: Sequence[VerifyResult],
    ) -> list[VerifyResult] | None:
        job = dataclasses.replace(job, batch_id=self.read.batch_id)
        stored = self.store.commit_helper_job(job, share_merge(ctx.engine))
        return self._answered(job.job_id, stored, job.request_hash)

    def bucket(self, ctx: TaskContext[HelperTask], it: VerifyInitItem) -> int:
        """A leader-selected job's reports all join its batch's bucket."""
        return super().bucket(ctx, it) if self.batch is None else self.batch

    def deltas(
        self,
        ctx: TaskContext[HelperTask],
        out: OutShares,
        accepted: Sequence[tuple[int, bytes, int]],
    ) -> list[BatchAggregate]:
        if self.batch is not None:
            accepted = [(self.batch, report_id, row) for _, report_id, row in accepted]
        return job_deltas(ctx.engine, out, accepted)

    def _answered(
        self, job_id: bytes, stored: tuple[bytes, bytes] | None, digest: bytes
    ) -> list[VerifyResult] | None:
        if stored is None:
            return None
        same_request(job_id, stored[0], digest)
        self.answer = stored[1]
        return []

    def open(
        self, ctx: TaskContext[HelperTask], keys: KeyRing, items: Sequence[VerifyInitItem]
    ) -> list[Opened]:
        aads = input_share_aads(
            self.version,
            self.task_id,
            self.config,
            [(self.read.metadata[it.report_id], it.public_share) for it in items],
        )
        info = input_share_info(self.version, Role.HELPER)
        opened = keys.open_shares_with_aad(
            [(it.encrypted_input_share, info, aad) for it, aad in zip(items, aads, strict=True)]
        )
        return [(payload_of(outcome), outcome) for outcome in opened]


def _invitation_only(task: HelperTask, meta: ReportMetadata) -> bool:
    """Whether a report's public extensions are all veil's invitation
    extension, in a task with invitations (the one place veil knows it)."""
    return task.issuer_public_key is not None and all(
        e.extension_type == INVITATION_EXTENSION for e in meta.public_extensions
    )


def payload_of(opened: ReportRejection | bytes) -> ReportRejection | bytes:
    """The VDAF input share of an opened PlaintextInputShare, or why there
    is none: veil knows no report extension (section 4.5.2.4: an unknown
    one makes the input share invalid_message)."""
    if isinstance(opened, ReportRejection):
        return opened
    try:
        share = PlaintextInputShare.decode(opened)
    except DecodeError:
        return ReportRejection.INVALID_MESSAGE
    if share.private_extensions:
        return ReportRejection.INVALID_MESSAGE
    return share.payload


def verify_resp(task: HelperTask, version: DapVersion, result: VerifyResult) -> VerifyResp:
    """The engine's answer for one report as DAP's VerifyResp: continue with
    the ping-pong finish message (the helper's state FinishedWithOutbound),
    or reject."""
    if result.reject is None and result.verifier_message is not None:
        return VerifyResp(
            result.report_id, VerifyRespType.CONTINUE, finish(result.verifier_message)
        )
    reason = result.reject or ReportRejection.VDAF_VERIFY_ERROR
    error = _REPORT_ERRORS.get(reason, ReportError.INVALID_MESSAGE)
    if reason == TASK_EXPIRED:
        # Outside the task's window: -18's task_expired (or task_not_started);
        # -19 removed both, and veil's leader answers such an upload
        # report_dropped.
        error = ReportError.REPORT_DROPPED
        if version is DapVersion.DAP_18:
            error = ReportError.TASK_EXPIRED
    return VerifyResp(result.report_id, VerifyRespType.REJECT, error=error)


class DapHelper:
    """What the helper answers over DAP: built from its task table, keys,
    aggregation jobs and releases (`Helper`'s parts)."""

    def __init__(
        self,
        tasks: TaskTable[HelperTask],
        keys: KeyRing,
        jobs: HelperJobs,
        releases: HelperRelease,
    ) -> None:
        self.tasks = tasks
        self.keys = keys
        self.jobs = jobs
        self.releases = releases

    def hpke_config_list(self) -> bytes:
        """The encoded HpkeConfigList of the helper's current key."""
        self.keys.maybe_refresh_keys()
        return HpkeConfigList((HpkeConfig.of(self.keys.current_config),)).encode()

    def context(self, task_id: bytes, token: str | None) -> TaskContext[HelperTask]:
        """The DAP task `task_id` with its bearer token checked."""
        try:
            ctx = self.tasks.context(task_id)
        except (UnknownTask, KeyError):
            ctx = None
        if ctx is None or ctx.task.dap is None:
            raise DapAbort(
                Problem(
                    ProblemType.UNRECOGNIZED_TASK,
                    "this helper serves no DAP task of that id",
                    404,
                    task_id,
                )
            )
        try:
            authorize(ctx.task, token, ctx.task.aggregator_token_hash, "aggregator")
        except Unauthenticated as e:
            raise DapUnauthorized(str(e)) from None
        return ctx

    # -- aggregation jobs (section 4.5) -------------------------------------

    def init_job(
        self, task_id: bytes, token: str | None, body: bytes
    ) -> tuple[bytes, DapVersion, bytes]:
        """An AggregationJobInitReq: (the job's id, the task's draft, the
        encoded AggregationJobResp). Each report is checked, opened and
        verified through the helper's one path, and the job is committed
        with what it adds; the same request again gets the same answer."""
        ctx = self.context(task_id, token)
        task = ctx.task
        assert task.dap is not None
        version = task.dap.dap_version
        try:
            request = AggregationJobInitReq.decode(body)
        except DecodeError as e:
            raise _invalid(str(e), task_id) from None
        init = self._read_init(task, version, request)
        job_id = resource_id(body)
        scope = DapScope(self.jobs, ctx, version, init)
        try:
            results = self.jobs.run(ctx, scope, job_id, init.items, time.monotonic())
        except AggregatorError as e:
            raise _mapped(e, task_id) from None
        answer = scope.answer if scope.answer is not None else scope.encode(results)
        return job_id, version, answer

    def _read_init(
        self, task: HelperTask, version: DapVersion, request: AggregationJobInitReq
    ) -> _Init:
        """The job-wide checks of section 4.5.2.2, then each report read
        into the engine's item, or answered at once."""
        task_id = task.task_id
        if not extensions_in_order(request.extensions):
            raise _invalid("the aggregation job's extensions are not in increasing order", task_id)
        assert task.dap is not None
        extensions = request.extensions
        batch_id: bytes | None = None
        if task.dap.leader_selected:
            # Section 5.2.2: the batch id is required, and well formed.
            try:
                batch_id = request.batch_id()
            except DecodeError as e:
                raise _invalid(str(e), task_id) from None
            if batch_id is None:
                raise _invalid(
                    "a leader-selected task's aggregation job names its batch"
                    " (the leader_selected_batch_id extension)",
                    task_id,
                )
            extensions = tuple(
                e for e in extensions if e.extension_type != LEADER_SELECTED_BATCH_ID_EXTENSION
            )
        refuse_extensions_and_agg_param(task_id, extensions, request.agg_param, "aggregation job")
        if len(request.verify_inits) > MAX_JOB_SIZE:
            raise DapAbort(
                Problem(
                    ProblemType.INVALID_MESSAGE,
                    f"{len(request.verify_inits)} reports in one aggregation job; at most"
                    f" {MAX_JOB_SIZE}",
                    413,
                    task_id,
                )
            )
        ids = [v.report_share.metadata.report_id for v in request.verify_inits]
        if len(set(ids)) != len(ids):
            raise _invalid("the aggregation job names a report twice", task_id)
        if request.verification_key_id != VERIFICATION_KEY_ID and version is DapVersion.DAP_18:
            # -18 has no report error for it.
            raise _invalid(
                f"unknown verification key id {request.verification_key_id}; this task's is"
                f" {VERIFICATION_KEY_ID}",
                task_id,
            )
        items: list[VerifyInitItem] = []
        metadata: dict[bytes, ReportMetadata] = {}
        early: list[VerifyResp | None] = []
        for v in request.verify_inits:
            share = v.report_share
            meta = share.metadata
            refusal: ReportError | None = None
            leader_share = b""
            invitation = InvitationExtension(b"", b"")
            if request.verification_key_id != VERIFICATION_KEY_ID:
                refusal = ReportError.UNKNOWN_VERIFICATION_KEY_ID
            elif meta.public_extensions and not _invitation_only(task, meta):
                # veil knows one report extension, for a task with invitations
                # only; -18 has no code for an unsupported one.
                dap_18 = version is DapVersion.DAP_18
                refusal = (
                    ReportError.INVALID_MESSAGE if dap_18 else ReportError.UNSUPPORTED_EXTENSION
                )
            elif len(meta.public_extensions) > 1:  # the same extension twice
                refusal = ReportError.INVALID_MESSAGE
            else:
                if meta.public_extensions:
                    # The token is checked with the report's other checks
                    # (helper_token_valid); a missing one fails there.
                    try:
                        invitation = InvitationExtension.decode(
                            meta.public_extensions[0].extension_data
                        )
                    except TokenError:
                        refusal = ReportError.INVALID_MESSAGE
                verifier_share = initialize_share(v.payload)
                if verifier_share is None:
                    # The VDAF's ping-pong rejects a message it cannot read.
                    refusal = refusal or ReportError.VDAF_VERIFY_ERROR
                else:
                    leader_share = verifier_share
            if refusal is not None:
                early.append(VerifyResp(meta.report_id, VerifyRespType.REJECT, error=refusal))
                continue
            early.append(None)
            metadata[meta.report_id] = meta
            items.append(
                VerifyInitItem(
                    meta.report_id,
                    meta.time * task.time_precision,
                    share.public_share,
                    share.encrypted_input_share,
                    leader_share,
                    b"",
                    invitation.token,
                    invitation.leader_key_digest,
                )
            )
        ids = [v.report_share.metadata.report_id for v in request.verify_inits]
        return _Init(ids, items, metadata, early, batch_id)

    def job_known(self, task_id: bytes, token: str | None, job_id: bytes) -> DapVersion:
        """The task's draft, if this helper holds the job; DapAbort with
        unrecognizedAggregationJob if not."""
        ctx = self.context(task_id, token)
        assert ctx.task.dap is not None
        if self.jobs.store.helper_job(task_id, job_id) is None:
            raise DapAbort(
                Problem(
                    ProblemType.UNRECOGNIZED_AGGREGATION_JOB,
                    "this helper holds no aggregation job of that id in this task",
                    404,
                    task_id,
                )
            )
        return ctx.task.dap.dap_version

    def continue_job(self, task_id: bytes, token: str | None, job_id: bytes, body: bytes) -> None:
        """An AggregationJobContinueReq (section 4.5.3.2). A DAP task's VDAF
        is Prio3, whose verification ends in the initialization: no report
        of a job awaits a continuation, so every one is refused, with the
        draft's error for its step."""
        self.job_known(task_id, token, job_id)
        try:
            request = AggregationJobContinueReq.decode(body)
        except DecodeError as e:
            raise _invalid(str(e), task_id) from None
        if request.step == 0:
            raise _invalid("a continuation's step is at least 1", task_id)
        if request.step != 1:
            raise DapAbort(
                Problem(
                    ProblemType.STEP_MISMATCH,
                    f"the aggregation job is at step 0, not {request.step - 1}",
                    400,
                    task_id,
                )
            )
        raise _invalid(
            "no report of this job awaits a continuation: Prio3 verifies in one round", task_id
        )

    def poll_job(
        self, task_id: bytes, token: str | None, job_id: bytes, step: str | None
    ) -> tuple[DapVersion, bytes]:
        """GET of a job (section 4.5.2.2): the stored AggregationJobResp of
        its initialization, at step 0 (the only step of a Prio3 job)."""
        version = self.job_known(task_id, token, job_id)
        if step is None or not step.isdigit():
            raise _invalid("polling an aggregation job names its step (?step=N)", task_id)
        if int(step) != 0:
            raise DapAbort(
                Problem(
                    ProblemType.STEP_MISMATCH,
                    f"the aggregation job ended at step 0, not {int(step)}",
                    400,
                    task_id,
                )
            )
        stored = self.jobs.store.helper_job(task_id, job_id)
        assert stored is not None
        return version, stored[1]

    # -- aggregate shares (section 4.6.4) -------------------------------------

    def aggregate_share(
        self, task_id: bytes, token: str | None, body: bytes
    ) -> tuple[bytes, bytes]:
        """An AggregateShareReq: (the share's id, the encoded AggregateShare),
        released through the helper's one release step (its count and
        checksum against the leader's, its floor, ledger and noise) and
        sealed to the collector with DAP's AggregateShareAad; the same
        request again gets the same bytes."""
        ctx = self.context(task_id, token)
        task = ctx.task
        assert task.dap is not None
        version = task.dap.dap_version
        try:
            request = AggregateShareReq.decode(body)
        except DecodeError as e:
            raise _invalid(str(e), task_id) from None
        selector = request.batch_selector
        query = request.collection_job_req.query
        mode = BatchMode.LEADER_SELECTED if task.dap.leader_selected else BatchMode.TIME_INTERVAL
        if selector.batch_mode is not mode:
            raise _invalid(f"this task's batch mode is {task.dap.batch_mode}", task_id)
        if query.batch_mode is not mode or query.batch_interval != selector.batch_interval:
            # A leader-selected query is empty: any batch id agrees with it.
            raise DapAbort(
                Problem(
                    ProblemType.BATCH_INVALID,
                    "the batch selector is not the collection's query",
                    400,
                    task_id,
                )
            )
        extensions = request.collection_job_req.extensions
        if not extensions_in_order(extensions):
            raise DapAbort(
                Problem(
                    ProblemType.INVALID_EXTENSION,
                    "the collection job's extensions are not in increasing order",
                    400,
                    task_id,
                )
            )
        if extensions:
            raise DapAbort(
                Problem(
                    ProblemType.UNSUPPORTED_EXTENSION,
                    "this task takes no collection job extension",
                    400,
                    task_id,
                    tuple(e.extension_type for e in extensions),
                )
            )
        if request.collection_job_req.agg_param:
            raise _invalid("Prio3's aggregation parameter is empty", task_id)
        start, duration = self._batch(task, selector)
        config = task.dap_configuration()
        collector = task.collector_hpke_config

        def seal(share: bytes) -> Ciphertext:
            return seal_aggregate_share(
                version,
                collector,
                Role.HELPER,
                task_id,
                config,
                request.collection_job_req,
                share,
            )

        share_id = resource_id(body)
        try:
            ct = self.releases.aggregate_share(
                task_id,
                token,
                share_id,
                start,
                duration,
                request.report_count,
                request.checksum,
                seal=seal,
                batch_id=selector.batch_id,
            )
        except AggregatorError as e:
            raise _mapped(e, task_id) from None
        return share_id, AggregateShare(ct).encode()

    def _batch(self, task: HelperTask, selector: BatchSelector) -> tuple[int, int]:
        """The (start, duration) the release step takes for the selected
        batch: its interval in seconds, or a leader-selected batch's bucket
        (duration 1). batchInvalid for an empty interval, or a batch id of
        which this helper aggregated no report (section 4.6.4: it names no
        batch bucket that can be collected)."""
        task_id = task.task_id
        if selector.batch_id is not None:
            bucket = leader_selected_bucket(selector.batch_id)
            if not self.releases.store.batch_aggregates(task_id, bucket, bucket + 1):
                raise DapAbort(
                    Problem(
                        ProblemType.BATCH_INVALID,
                        "this helper aggregated no report into a batch of that id",
                        400,
                        task_id,
                    )
                )
            return bucket, 1
        interval = selector.batch_interval
        assert interval is not None
        return batch_interval_seconds(task_id, interval, task.time_precision)

    def stored_share(self, task_id: bytes, token: str | None, share_id: bytes) -> bytes:
        """GET of an aggregate share: the AggregateShare released before."""
        self.context(task_id, token)
        stored = self.releases.store.get_collection(task_id, share_id)
        if stored is None or stored.helper_ct is None:
            raise DapAbort(
                Problem(
                    ProblemType.INVALID_MESSAGE,
                    "this helper released no aggregate share of that id in this task",
                    404,
                    task_id,
                )
            )
        return AggregateShare(stored.helper_ct).encode()


def _invalid(detail: str, task_id: bytes) -> DapAbort:
    return DapAbort(Problem(ProblemType.INVALID_MESSAGE, detail, 400, task_id))


def _mapped(e: AggregatorError, task_id: bytes) -> Exception:
    """The engine's refusal of a whole request as DAP answers it."""
    if e.retryable:
        return DapRetry(str(e))
    if isinstance(e, Unauthenticated):
        return DapUnauthorized(str(e))
    for kind, problem, status in _PROBLEMS:
        if isinstance(e, kind):
            return DapAbort(Problem(problem, str(e), status, task_id))
    return e
