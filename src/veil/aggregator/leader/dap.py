"""The leader's side of DAP uploads (draft-ietf-ppm-dap section 4.4), for
tasks served over DAP (a task file's [dap] table): its HPKE configuration
list and the upload of an UploadRequest, each report checked and stored
through the leader's report writer (`upload.py`), the refused ones named in
an UploadErrors answer. HTTP stays outside (`veil.aggregator.run.dap_http`).

A report is stored as veil stores any report: its time in seconds (DAP's
Time counts the task's time precision), its public share and both sealed
input shares as they came, and for a task with invitations its invitation
extension's data (veil.dap.invitation) as its token. A report with any
other public extension is refused (veil knows no other), so what is stored
is all a later open needs to rebuild the report's InputShareAad
(`open_leader_shares`,
for the job driver, which sends the reports of a DAP task to a DAP helper
through `veil.aggregator.leader.dap_client`).

The collector's side is `veil.aggregator.leader.dap_collections`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from veil.aggregator.context import TaskTable
from veil.aggregator.errors import (
    AggregatorError,
    BatchCollected,
    InvalidMessage,
    InvalidToken,
    ReportIdConflict,
    ReportRejection,
    ReportTimeRejected,
    UnknownTask,
)
from veil.aggregator.keys import KeyRing
from veil.aggregator.leader.upload import MAX_UPLOAD_REPORTS, ReportWriter
from veil.aggregator.store.records import JobReport
from veil.dap.codec import DecodeError
from veil.dap.invitation import INVITATION_EXTENSION
from veil.dap.jobs import CollectionJobReq, Query
from veil.dap.messages import (
    BatchMode,
    Extension,
    HpkeConfig,
    HpkeConfigList,
    Interval,
    PlaintextInputShare,
    Report,
    ReportMetadata,
    ReportUploadStatus,
    UploadErrors,
    UploadRequest,
)
from veil.dap.problems import DapAbort, Problem, ProblemType
from veil.dap.shares import input_share_aads, open_input_share, seal_aggregate_share
from veil.dap.versions import DapVersion, ReportError, Role, input_share_info
from veil.hpke import Ciphertext, HpkeError
from veil.messages import Report as VeilReport
from veil.task import LeaderTask


def open_leader_shares(
    keys: KeyRing, task: LeaderTask, reports: Sequence[JobReport]
) -> list[ReportRejection | bytes]:
    """The leader's input share of each stored report of a DAP task, opened
    with DAP's `info` and InputShareAad (section 4.5.2.3) over the opener's
    threads, or why it did not open (a private extension, which veil does
    not know, is invalid_message)."""
    assert task.dap is not None
    version = task.dap.dap_version
    tp = task.time_precision
    cts = [Ciphertext.from_bytes(r.leader_ct_bytes) if r.leader_ct_bytes else None for r in reports]
    public = (lambda _: ()) if task.invitation_private else _extensions
    aads = input_share_aads(
        version,
        task.task_id,
        task.dap_configuration(),
        [
            (ReportMetadata(r.report_id, r.time // tp, public(r.token)), r.public_share)
            for r in reports
        ],
    )
    info = input_share_info(version, Role.LEADER)
    # (An empty ciphertext, which upload never stores, opens as of an
    # unknown config.)
    unknown = Ciphertext(256, b"", b"")
    opened = keys.open_shares_with_aad(
        [(ct or unknown, info, aad) for ct, aad in zip(cts, aads, strict=True)]
    )
    out: list[ReportRejection | bytes] = []
    for outcome, token in zip(opened, (r.token for r in reports), strict=True):
        if isinstance(outcome, ReportRejection):
            out.append(outcome)
            continue
        try:
            share = PlaintextInputShare.decode(outcome)
        except DecodeError:
            out.append(ReportRejection.INVALID_MESSAGE)
            continue
        # The one private extension veil knows, its invitation extension,
        # where the helper is another implementation (checked at upload).
        allowed = task.invitation_private and _private_invitation(share) == token
        bad = share.private_extensions and not allowed
        out.append(ReportRejection.INVALID_MESSAGE if bad else share.payload)
    return out


def _extensions(invitation: bytes) -> tuple[Extension, ...]:
    """A stored report's public extensions: its invitation extension's data
    is kept as its token (a task with invitations), none else."""
    return (Extension(INVITATION_EXTENSION, invitation),) if invitation else ()


def _private_invitation(share: PlaintextInputShare) -> bytes | ReportError:
    """The invitation extension's data among a leader share's private
    extensions: b"" if there is none, invalid_message for any other or one
    given twice (veil knows no other)."""
    types = [e.extension_type for e in share.private_extensions]
    if not types:
        return b""
    if types != [INVITATION_EXTENSION]:
        return ReportError.INVALID_MESSAGE
    return share.private_extensions[0].extension_data


def collection_job_req(task: LeaderTask, start: int, duration: int) -> CollectionJobReq:
    """The CollectionJobReq of a time-interval collection of [start, +duration)
    seconds, or of any collection of a leader-selected task (its query is
    empty): the collector's request as DAP binds it into both aggregate
    shares (veil's collections take no aggregation parameter or
    extension, so the request is rebuilt from the batch alone)."""
    assert task.dap is not None
    if task.dap.leader_selected:
        return CollectionJobReq(Query(BatchMode.LEADER_SELECTED))
    tp = task.time_precision
    return CollectionJobReq(Query(BatchMode.TIME_INTERVAL, Interval(start // tp, duration // tp)))


def seal_leader_share(task: LeaderTask, start: int, duration: int, share: bytes) -> Ciphertext:
    """The leader's aggregate share of a DAP task sealed to the collector
    (section 4.6.7)."""
    assert task.dap is not None
    return seal_aggregate_share(
        task.dap.dap_version,
        task.collector_hpke_config,
        Role.LEADER,
        task.task_id,
        task.dap_configuration(),
        collection_job_req(task, start, duration),
        share,
    )


class DapUnavailable(Exception):
    """The leader cannot take the upload now (its backlog is full): the
    client may send the same request again later."""


class DapUploads:
    """What the leader answers over DAP: built from the leader's task table,
    keys, report writer and clock."""

    def __init__(
        self,
        tasks: TaskTable[LeaderTask],
        keys: KeyRing,
        writer: ReportWriter,
        clock: Callable[[], float],
    ) -> None:
        self.tasks = tasks
        self.keys = keys
        self.writer = writer
        self.clock = clock

    def hpke_config_list(self) -> bytes:
        """The encoded HpkeConfigList of the leader's current key (GET
        {leader}/hpke_config)."""
        self.keys.maybe_refresh_keys()
        return HpkeConfigList((HpkeConfig.of(self.keys.current_config),)).encode()

    def task(self, task_id: bytes) -> LeaderTask:
        """The DAP task `task_id`; DapAbort(unrecognizedTask) for a task
        this leader does not serve over DAP."""
        try:
            task = self.tasks.task(task_id)
        except (UnknownTask, KeyError):
            task = None
        if task is None or task.dap is None:
            raise DapAbort(
                Problem(
                    ProblemType.UNRECOGNIZED_TASK,
                    "this leader serves no DAP task of that id",
                    404,
                    task_id,
                )
            )
        return task

    def upload(self, task_id: bytes, body: bytes) -> tuple[DapVersion, UploadErrors]:
        """Handle an UploadRequest for `task_id`: each report checked and the
        acceptable ones stored, one at a time (a report already stored with
        the same content is acknowledged again). Returns the task's draft
        and the refused reports, in the request's order; raises DapAbort
        for a request refused whole."""
        task = self.task(task_id)
        assert task.dap is not None
        version = task.dap.dap_version
        try:
            request = UploadRequest.decode(body)
        except DecodeError as e:
            raise DapAbort(Problem(ProblemType.INVALID_MESSAGE, str(e), 400, task_id)) from None
        if not request.reports:
            raise DapAbort(
                Problem(ProblemType.INVALID_MESSAGE, "the upload holds no report", 400, task_id)
            )
        if len(request.reports) > MAX_UPLOAD_REPORTS:
            raise DapAbort(
                Problem(
                    ProblemType.INVALID_MESSAGE,
                    f"{len(request.reports)} reports in one upload; send at most"
                    f" {MAX_UPLOAD_REPORTS}",
                    413,
                    task_id,
                )
            )
        refused = []
        for report in request.reports:
            error = self._store(task, report)
            if error is not None:
                refused.append(ReportUploadStatus(report.metadata.report_id, error))
        return version, UploadErrors(tuple(refused))

    def _private_invitation(self, task: LeaderTask, report: Report) -> bytes | ReportError:
        """The invitation extension's data in the leader's input share of a
        task whose helper is another implementation (`Task.invitation_private`),
        opened for it at upload ("" where the share has none: the token's
        check refuses it), or why the share gives none."""
        assert task.dap is not None
        ct = report.leader_encrypted_input_share
        keypair = self.keys.keypair(ct.config_id)
        if keypair is None:  # as _store answers it
            dap_18 = task.dap.dap_version is DapVersion.DAP_18
            return ReportError.OUTDATED_CONFIG if dap_18 else ReportError.HPKE_UNKNOWN_CONFIG_ID
        try:
            share = open_input_share(
                task.dap.dap_version,
                keypair,
                Role.LEADER,
                task.task_id,
                task.dap_configuration(),
                report.metadata,
                report.public_share,
                ct,
            )
        except HpkeError:
            return ReportError.HPKE_DECRYPT_ERROR
        except DecodeError:
            return ReportError.INVALID_MESSAGE
        return _private_invitation(share)

    def _store(self, task: LeaderTask, report: Report) -> ReportError | None:
        """Store one report; the ReportError it is refused with, if any."""
        meta = report.metadata
        assert task.dap is not None
        dap_18 = task.dap.dap_version is DapVersion.DAP_18
        invitation = b""
        if task.invitation_private:
            if meta.public_extensions:
                return ReportError.INVALID_MESSAGE if dap_18 else ReportError.UNSUPPORTED_EXTENSION
            found = self._private_invitation(task, report)
            if isinstance(found, ReportError):
                return found
            invitation = found
        elif meta.public_extensions:
            types = [e.extension_type for e in meta.public_extensions]
            if task.issuer_public_key is None or set(types) != {INVITATION_EXTENSION}:
                # veil knows one report extension, for a task with invitations
                # only; -18 has no code for an unsupported one.
                return ReportError.INVALID_MESSAGE if dap_18 else ReportError.UNSUPPORTED_EXTENSION
            if len(types) > 1:  # the same extension twice (section 4.4.2)
                return ReportError.INVALID_MESSAGE
            # Checked, with the token it holds, by the report writer.
            invitation = meta.public_extensions[0].extension_data
        if self.keys.keypair(report.leader_encrypted_input_share.config_id) is None:
            # -18 asks for outdated_config here; -19 removed it.
            return ReportError.OUTDATED_CONFIG if dap_18 else ReportError.HPKE_UNKNOWN_CONFIG_ID
        if meta.time > (2**63 - 1) // task.time_precision:
            return ReportError.INVALID_MESSAGE
        seconds = meta.time * task.time_precision
        if seconds > self.clock() + task.max_clock_skew:
            return ReportError.REPORT_TOO_EARLY
        veil_report = VeilReport(
            meta.report_id,
            seconds,
            report.public_share,
            report.leader_encrypted_input_share,
            report.helper_encrypted_input_share,
            invitation,
        )
        try:
            self.writer.upload(task.task_id, [veil_report])
        except ReportIdConflict:
            return ReportError.REPORT_REPLAYED
        except InvalidToken:  # missing, malformed, or not for this report
            return ReportError.INVALID_MESSAGE
        except BatchCollected:
            return ReportError.BATCH_COLLECTED
        except ReportTimeRejected:
            return ReportError.REPORT_DROPPED
        except InvalidMessage:  # WrongLength among them: shares not of the task's sizes
            return ReportError.INVALID_MESSAGE
        except AggregatorError as e:
            if e.retryable:  # the backlog is full: the client may send it again later
                raise DapUnavailable(str(e)) from None
            raise
        return None
