"""Uploads (draft-ietf-ppm-dap section 4.4, leader side): each report of an
upload is checked, and the upload stored all or nothing, while the backlog
of reports waiting for aggregation admits it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from veil.aggregator.context import TaskTable
from veil.aggregator.core import check_report_time, check_token, report_token
from veil.aggregator.errors import (
    AggregatorError,
    BatchCollected,
    InvalidMessage,
    ReportIdConflict,
    ReportTimeRejected,
    TooLarge,
    WrongLength,
)
from veil.aggregator.keys import KeyRing
from veil.aggregator.leader.admission import AdmissionLimits, Backlog
from veil.aggregator.leader.meter import LeaderMeter
from veil.aggregator.leader.peer import HelperPeer
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.records import BucketCollected, ReportIdTaken
from veil.invite.token import TokenError
from veil.messages import REPORT_ID_SIZE, Report, ReportBatch
from veil.task import LeaderTask

# What one upload request may hold: at most this many reports, each of the
# exact size its task fixes (ReportSizes), and at most the server's
# max_message_bytes in all (gRPC refuses a larger request before parsing it).
MAX_UPLOAD_REPORTS = 10_000


class ReportWriter:
    """Checks and stores the reports of the tasks in `tasks`."""

    def __init__(
        self,
        tasks: TaskTable[LeaderTask],
        keys: KeyRing,
        store: Datastore,
        clock: Callable[[], float],
        peer: HelperPeer,
        meter: LeaderMeter,
        admission: AdmissionLimits,
    ) -> None:
        self.tasks = tasks
        self.keys = keys
        self.store = store
        self.clock = clock
        self.peer = peer
        self.meter = meter
        self.backlog = Backlog(admission, self.count_backlog)

    def upload(self, task_id: bytes, reports: Sequence[Report] | ReportBatch) -> tuple[int, int]:
        """Validate and store reports, all or nothing, if the backlog admits
        them (else Overloaded). Returns (stored, duplicates)."""
        batch = reports if isinstance(reports, ReportBatch) else ReportBatch.of(reports)
        task = self.tasks.task(task_id)
        stored = 0
        try:
            # What needs neither store nor backlog first: an upload refused
            # for its tokens never holds a reservation that could turn an
            # invited respondent away as overloaded.
            self._check_shape(task, batch)
            self.backlog.reserve(task_id, len(batch))
            try:
                stored, duplicates = self._upload(task, batch)
            finally:
                self.backlog.settle(task_id, len(batch), stored)
        except AggregatorError as e:
            self.meter.upload_refused(task, e)
            raise
        self.meter.uploaded(task, stored, duplicates)
        return stored, duplicates

    def _check_shape(self, task: LeaderTask, batch: ReportBatch) -> None:
        """The checks an upload's reports pass before it is admitted: how
        many, and for a task with invitations each report's id and token,
        bound to the report's content (one RSA verification each, the
        reports in order)."""
        if not len(batch):
            raise InvalidMessage("the upload holds no report")
        if len(batch) > MAX_UPLOAD_REPORTS:
            raise TooLarge(f"{len(batch)} reports in one upload; send at most {MAX_UPLOAD_REPORTS}")
        if task.issuer_public_key is not None:
            seen: set[bytes] = set()
            for i in range(len(batch)):
                self._check_identity(task, batch.report(i), i, seen)

    def _upload(self, task: LeaderTask, batch: ReportBatch) -> tuple[int, int]:
        task_id = task.task_id
        now = self.clock()
        helper_horizon = self.peer.horizon(task, now)
        # Each column checked in one pass; only an upload that fails one (or
        # carries tokens, whose reports were checked one by one) is checked
        # report by report, which finds the first report at fault and says
        # what is wrong.
        if task.issuer_public_key is not None:
            for i in range(len(batch)):
                self._check_content(task, batch.report(i), i, now, helper_horizon)
        elif not self._passes(task, batch, now, helper_horizon):
            seen: set[bytes] = set()
            for i in range(len(batch)):
                r = batch.report(i)
                self._check_identity(task, r, i, seen)
                self._check_content(task, r, i, now, helper_horizon)
        buckets = {task.bucket(t) for t in set(batch.times)}
        try:
            return self.store.put_report_batch(task_id, buckets, batch)
        except BucketCollected as e:
            raise BatchCollected(
                f"the batch holding time bucket {e.bucket} was already collected; reports for it"
                " are no longer accepted"
            ) from None
        except ReportIdTaken as e:
            if task.issuer_public_key is not None:
                # The id is the token's: this is a spent token come back.
                raise ReportIdConflict(
                    f"report {e.report_id.hex()}: its invitation token was already spent on a"
                    " report with other content; an invitation answers each question once"
                ) from None
            raise ReportIdConflict(
                f"report id {e.report_id.hex()} was already uploaded with other content; use a"
                " fresh report id"
            ) from None

    def _passes(
        self, task: LeaderTask, batch: ReportBatch, now: float, helper_horizon: int | None
    ) -> bool:
        """Whether every report of a batch without tokens passes
        `_check_identity` and `_check_content` (never True where one would
        not)."""
        sizes = self.tasks.context(task.task_id).sizes
        n = len(batch)
        if set(map(len, batch.report_ids)) != {REPORT_ID_SIZE} or len(set(batch.report_ids)) != n:
            return False
        if any(batch.tokens):
            return False
        for column, size in (
            (batch.public_shares, sizes.public_share),
            (batch.leader_encs, sizes.enc),
            (batch.leader_payloads, sizes.leader_payload),
            (batch.helper_encs, sizes.enc),
            (batch.helper_payloads, sizes.helper_payload),
        ):
            if set(map(len, column)) != {size}:
                return False
        for t in set(batch.times):
            if t % task.time_precision or (helper_horizon is not None and t < helper_horizon):
                return False
            try:
                check_report_time(task, t, now)
            except AggregatorError:
                return False
        return all(self.keys.keypair(c) is not None for c in set(batch.leader_config_ids))

    def _check_identity(self, task: LeaderTask, r: Report, i: int, seen: set[bytes]) -> None:
        """Raise the specific error for report `i`'s id or token, if it has
        one (`seen`: the report ids ahead of it in the upload, to which it
        adds its own)."""
        where = f"report {i} ({r.report_id.hex()})"
        if len(r.report_id) != REPORT_ID_SIZE:
            raise InvalidMessage(f"report {i}: report_id must be {REPORT_ID_SIZE} bytes")
        if r.report_id in seen:
            raise InvalidMessage(f"{where} appears twice in one upload")
        seen.add(r.report_id)
        if task.issuer_public_key is not None:
            # The token's challenge commits to the whole report as it came.
            try:
                token, context = report_token(task, r)
            except TokenError as e:
                raise InvalidMessage(f"{where}: {e}") from None
            check_token(task, token, context, where)
        elif r.token:
            raise InvalidMessage(f"{where}: this task takes no token (no invitations)")

    def _check_content(
        self, task: LeaderTask, r: Report, i: int, now: float, helper_horizon: int | None
    ) -> None:
        """Raise the specific error for report `i`'s shares, time or key, if
        it has one."""
        where = f"report {i} ({r.report_id.hex()})"
        try:
            self.tasks.context(task.task_id).sizes.check(r.public_share, r.leader_ct, r.helper_ct)
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
        if self.keys.keypair(r.leader_ct.config_id) is None:
            raise InvalidMessage(
                f"{where}: unknown leader HPKE config id {r.leader_ct.config_id}; fetch the"
                " leader's HPKE config again"
            )

    def count_backlog(self) -> dict[bytes, int]:
        """Each served task's reports waiting for aggregation, as stored now."""
        store = self.store
        counts = {tid: store.unaggregated_count(tid, 0, 2**63 - 1) for tid in self.tasks.tasks}
        self.meter.backlog(counts)
        return counts
