"""What the leader and helper logic share: message values, checks, key handling.

The values here are the logic's view of the protocol messages; the gRPC
service modules convert between them and the generated classes, so nothing
below imports generated code.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from veil.aggregator.context import TaskContext, TaskTable
from veil.aggregator.errors import (
    BatchTooLarge,
    InvalidMessage,
    InvalidToken,
    ReportRejection,
    ReportTimeRejected,
    Unauthenticated,
    WindowMismatch,
    WindowOpen,
)
from veil.aggregator.keys import KeyRing
from veil.aggregator.opener import OpenPool
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.records import BatchAggregate, ShareMerge
from veil.dap.invitation import InvitationExtension, dap_redemption_context, sealed_key_digest
from veil.dap.versions import vdaf_context
from veil.dp.bounds import AggregateBounds
from veil.hpke import (
    Ciphertext,
    HpkeConfig,
    agg_share_info,
    seal,
)
from veil.invite.token import (
    TokenError,
    Verifier,
    redemption_context,
    report_context,
    sealed_share_digest,
)
from veil.messages import Report, vdaf_ctx
from veil.metrics import Metrics
from veil.task import (
    OPEN_ENDED,
    AggregatorTask,
    Task,
    token_matches,
)
from veil.times import format_duration, format_time
from veil.vdaf import CodecError, VdafError
from veil.vdaf.engine import Engine, OutShares

log = logging.getLogger(__name__)

CHECKSUM_SIZE = 32
# Upper bound on the number of time buckets in one collected interval.
MAX_BATCH_BUCKETS = 100_000

# Reasons a report is rejected during aggregation, by their short names.
BATCH_COLLECTED = ReportRejection.BATCH_COLLECTED
REPORT_REPLAYED = ReportRejection.REPORT_REPLAYED
VDAF_DECODE_ERROR = ReportRejection.VDAF_DECODE_ERROR
VDAF_VERIFY_ERROR = ReportRejection.VDAF_VERIFY_ERROR
REPORT_TOO_EARLY = ReportRejection.REPORT_TOO_EARLY
TASK_EXPIRED = ReportRejection.TASK_EXPIRED
INVALID_MESSAGE = ReportRejection.INVALID_MESSAGE
INVALID_TOKEN = ReportRejection.INVALID_TOKEN
REPORT_DROPPED = ReportRejection.REPORT_DROPPED


class VerifyInitItem(NamedTuple):
    """One report of an aggregation job as the helper receives it. A plain
    tuple, as VerifyResult: each side builds one of each a report, which as
    frozen dataclasses cost 1.4 and 0.8 µs, as tuples 0.3 and 0.35."""

    report_id: bytes
    time: int
    public_share: bytes
    encrypted_input_share: Ciphertext
    leader_verifier_share: bytes
    # Poplar1, second round: the leader's round-2 sketch share.
    leader_verifier_share_2: bytes = b""
    # A task with invitations: the report's token as uploaded, and SHA-256 of
    # the leader's sealed input share, which the token's challenge commits to.
    token: bytes = b""
    leader_share_digest: bytes = b""


class VerifyResult(NamedTuple):
    report_id: bytes
    verifier_message: bytes | None = None
    reject: ReportRejection | None = None
    # Poplar1, first round: the helper's round-2 sketch share.
    helper_verifier_share: bytes = b""


@dataclass(frozen=True)
class AggregationAnswer:
    """The helper's answer to an aggregation job, as the leader receives it."""

    results: list[VerifyResult]
    # The helper's clock as it answered (epoch seconds), if it said.
    helper_time: float | None = None


def rejection_reason(error: VdafError) -> ReportRejection:
    """The counted rejection reason of a report the VDAF refused."""
    return VDAF_DECODE_ERROR if isinstance(error, CodecError) else VDAF_VERIFY_ERROR


def task_vdaf_ctx(task: Task) -> bytes:
    """The VDAF's application context of a task: DAP's (``"dap-19" ||
    task_id``, draft-ietf-ppm-dap section 4.4.2) for a task served over DAP,
    veil's own otherwise."""
    if task.dap is not None:
        return vdaf_context(task.dap.dap_version, task.task_id)
    return vdaf_ctx(task.task_id)


def report_checksum(report_id: bytes) -> bytes:
    return hashlib.sha256(report_id).digest()


def xor(a: bytes, b: bytes) -> bytes:
    if len(a) != len(b):
        raise ValueError("xor of byte strings of different lengths")
    return (int.from_bytes(a) ^ int.from_bytes(b)).to_bytes(len(a))


def authorize(task: Task, token: str | None, stored_hash: bytes | None, who: str) -> None:
    """Constant-time check of a bearer token against its stored SHA-256."""
    if stored_hash is None:
        raise Unauthenticated(f"task {task.id_text} has no {who} token configured here")
    if token is None:
        raise Unauthenticated(f"missing bearer token: send 'authorization: Bearer <{who} token>'")
    if not token_matches(token, stored_hash):
        raise Unauthenticated(f"wrong {who} token for task {task.id_text}")


def check_interval(task: Task, start: int, duration: int) -> None:
    tp = task.time_precision
    if duration <= 0 or start % tp or duration % tp:
        raise InvalidMessage(
            f"batch interval [{start}, +{duration}) must be non-empty and aligned to the"
            f" task's time_precision of {tp} s"
        )
    if duration // tp > MAX_BATCH_BUCKETS:
        raise InvalidMessage(f"batch interval spans more than {MAX_BATCH_BUCKETS} time buckets")


def _when(t: int) -> str:
    return format_time(t) if 0 <= t < OPEN_ENDED else str(t)


def check_window_closed(task: Task, start: int, now: float) -> None:
    """Refuses to close a batch of a task with a window (a survey's) while
    reports may still arrive: collecting marks the batch collected, and every
    later upload to it would fail. Each aggregator checks this on its own."""
    if task.not_after < OPEN_ENDED and start < task.not_after and now < task.not_after:
        raise WindowOpen(
            f"the task accepts reports until {format_time(task.not_after)}: its batches can be"
            f" collected after that, in {format_duration(task.not_after - now)}"
        )


def check_window_agrees(task: Task, window: tuple[int, int] | None) -> None:
    """At the helper: refuses, retryably, a request whose leader gives the
    task another window than this aggregator's task file (`window`, the
    leader's [not_before, not_after); None from a leader that does not send
    it). The window is the one task parameter an organisation changes on its
    own (veil survey close, veil survey extend): until both have, the two
    would judge report times and the end of collection differently."""
    if window is None or window == (task.not_before, task.not_after):
        return
    theirs, ours = window, (task.not_before, task.not_after)
    what = "start" if theirs[1] == ours[1] else "end" if theirs[0] == ours[0] else "window"
    raise WindowMismatch(
        f"task {task.id_text}: the leader's and the helper's task files give it another"
        f" {what}: the leader's window is [{_when(theirs[0])}, {_when(theirs[1])}), the"
        f" helper's [{_when(ours[0])}, {_when(ours[1])}); each organisation runs veil"
        " survey close (or extend) with the same time and reloads its servers (SIGHUP)"
    )


def check_report_time(task: Task, report_time: int, now: float) -> None:
    """Raises ReportTimeRejected for a report too far in the future or outside the task."""
    if report_time > now + task.max_clock_skew:
        raise ReportTimeRejected(
            f"report time {report_time} is {int(report_time - now)} s in the future; at most"
            f" {task.max_clock_skew} s of clock skew is allowed: check the client's clock"
        )
    if not task.not_before <= report_time < task.not_after:
        raise ReportTimeRejected(
            f"report time {format_time(report_time)} is outside the task's window"
            f" [{_when(task.not_before)}, {_when(task.not_after)}): the survey"
            + (" is closed" if report_time >= task.not_after else " is not open yet")
        )
    horizon = task.report_horizon(now)
    if horizon is not None and report_time < horizon:
        # Refused, not stored: garbage collection may already have deleted
        # reports this old, so a replay of one would go unnoticed.
        raise ReportTimeRejected(
            f"report time {report_time} is older than the task's report_expiry_age of"
            f" {task.report_expiry_age} s: the report has expired"
        )


def check_token(task: Task, token: bytes, context: bytes, where: str) -> None:
    """Raises InvalidToken unless `token` is valid for the report whose
    redemption context is `context` (veil.invite.token.redemption_context)
    in `task` (a task with invitations): one RSA verification."""
    assert task.issuer_public_key is not None
    if not token:
        raise InvalidToken(
            f"{where} carries no invitation token; this survey takes answers from invited"
            " respondents only"
        )
    try:
        Verifier(task.issuer_public_key).check(token, context)
    except TokenError as e:
        raise InvalidToken(f"{where}: invalid invitation token: {e}") from None


def token_context(
    task: Task,
    report_id: bytes,
    time: int,
    public_share: bytes,
    leader_digest: bytes,
    helper_ct: Ciphertext,
) -> bytes:
    """The redemption context a report's token must be signed for, given the
    leader's part of it: over gRPC the digests of both sealed shares, over
    DAP those of their HPKE keys (veil.dap.invitation: the token rides in
    what the shares are sealed with)."""
    if task.dap is not None:
        helper_digest = sealed_key_digest(helper_ct.config_id, helper_ct.enc)
        return dap_redemption_context(
            task.task_id, report_id, time, public_share, leader_digest, helper_digest
        )
    return redemption_context(
        task.task_id,
        report_id,
        time,
        public_share,
        leader_digest,
        sealed_share_digest(helper_ct.to_bytes()),
    )


def report_token(task: Task, report: Report) -> tuple[bytes, bytes]:
    """An uploaded report's token and the redemption context it must be
    signed for (the leader's view: both sealed shares at hand). A DAP
    report's token field holds its invitation extension's data, whose
    leader key digest must be the leader's share's. Raises TokenError for
    an extension that is not one."""
    if task.dap is None:
        return report.token, report_context(task.task_id, report)
    if not report.token:
        return b"", bytes(32)  # check_token refuses a missing token first
    carried = InvitationExtension.decode(report.token)
    leader = report.leader_ct
    if not hmac.compare_digest(
        carried.leader_key_digest, sealed_key_digest(leader.config_id, leader.enc)
    ):
        raise TokenError("the invitation extension names another leader share than the report's")
    context = token_context(
        task,
        report.report_id,
        report.time,
        report.public_share,
        carried.leader_key_digest,
        report.helper_ct,
    )
    return carried.token, context


def helper_token_valid(task: Task, it: VerifyInitItem) -> bool:
    """Whether a report of a job carries a valid token for its content, by
    the helper's own reckoning: the public share's digest and its own sealed
    share's from what it received, only the leader's sealed share's digest
    from the leader (which can only spoil its own part; over DAP it comes in
    the report's invitation extension, which both shares are sealed with)."""
    try:
        context = token_context(
            task,
            it.report_id,
            it.time,
            it.public_share,
            it.leader_share_digest,
            it.encrypted_input_share,
        )
        check_token(task, it.token, context, "the report")
    except (InvalidToken, TokenError):
        return False
    return True


def job_deltas(
    engine: Engine,
    out: OutShares,
    accepted: Iterable[tuple[int, bytes, int]],
    agg_param: Any = None,
) -> list[BatchAggregate]:
    """What a job adds to each time bucket, from (bucket, report_id, row)
    triples of reports that passed, with each bucket's output shares added
    in the batch field and converted once."""
    rows: dict[int, list[int]] = {}
    sums: dict[int, int] = {}  # the XOR of the reports' checksums, as an integer
    sha256 = hashlib.sha256
    for bucket, report_id, row in accepted:
        rows.setdefault(bucket, []).append(row)
        sums[bucket] = sums.get(bucket, 0) ^ int.from_bytes(sha256(report_id).digest())
    return [
        BatchAggregate(
            bucket,
            engine.encode_agg_share(agg_param, engine.aggregate(agg_param, out, picked)),
            len(picked),
            sums[bucket].to_bytes(CHECKSUM_SIZE),
        )
        for bucket, picked in rows.items()
    ]


def share_merge(engine: Engine, agg_param: Any = None) -> ShareMerge:
    """Field addition of two encoded aggregate shares, for the store to apply under its lock."""

    def merge(a: bytes, b: bytes) -> bytes:
        decode = engine.decode_agg_share
        return engine.encode_agg_share(
            agg_param, engine.merge(agg_param, [decode(agg_param, a), decode(agg_param, b)])
        )

    return merge


def batch_summary(
    engine: Engine, aggregates: Sequence[BatchAggregate], agg_param: Any = None
) -> tuple[list[int], int, bytes]:
    """(aggregate share, report count, checksum) of a batch's buckets."""
    share = engine.merge(
        agg_param,
        [engine.decode_agg_share(agg_param, a.agg_share) for a in aggregates if a.agg_share],
    )
    count = sum(a.report_count for a in aggregates)
    checksum = bytes(CHECKSUM_SIZE)
    for a in aggregates:
        checksum = xor(checksum, a.checksum)
    return share, count, checksum


def check_id(value: bytes, name: str) -> None:
    """A job id of a request: 16 bytes (InvalidMessage names the field)."""
    if len(value) != 16:
        raise InvalidMessage(f"{name} must be 16 bytes")


def seal_share(
    task: Task,
    role: int,
    start: int,
    duration: int,
    count: int,
    payload: bytes,
    agg_param: bytes = b"",
) -> Ciphertext:
    """An aggregator's noised aggregate share of a batch, sealed to the
    collector under the batch's context (its released count, the noise's
    parameters, the aggregation parameter)."""
    assert task.collector_hpke_config is not None
    return seal(
        task.collector_hpke_config,
        agg_share_info(
            role,
            task.task_id,
            start,
            duration,
            task.dp.released_count(count),
            dp_params=task.dp.binding(task.vdaf),
            agg_param=agg_param,
        ),
        payload,
    )


def check_batch_size(task: Task, bounds: AggregateBounds, count: int) -> None:
    """Raises BatchTooLarge for a batch whose sum could wrap around the field."""
    if count > bounds.max_batch_size:
        raise BatchTooLarge(
            f"the batch holds more reports than this task can sum without wrapping around"
            f" the field (at most {bounds.max_batch_size}): collect shorter intervals"
        )


AT = TypeVar("AT", bound=AggregatorTask)


class AggregatorBase(Generic[AT]):
    """One aggregator as its callers see it: the tasks it serves (`table`,
    each with its context), its HPKE keys (`keys`), its store and clock.
    The leader's and the helper's parts are built from these pieces, never
    from this object."""

    role_name = "aggregator"
    # The task type this aggregator serves (LeaderTask or HelperTask).
    task_type: type[AggregatorTask] = AggregatorTask

    def __init__(
        self,
        tasks: Mapping[bytes, AT],
        store: Datastore,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
        open_threads: int = 0,
    ) -> None:
        self.metrics = metrics
        self.store = store
        self.clock = clock
        self.table: TaskTable[AT] = TaskTable(self.role_name, self.task_type)
        self.add_tasks(tasks)
        self.keys = KeyRing(store, clock, metrics, open_threads)

    def add_tasks(self, tasks: Mapping[bytes, AT]) -> list[AT]:
        """Serve these tasks too (at start, and on SIGHUP for task files added
        to the config since); returns the ones that were new. A task already
        served must come back unchanged: task parameters are immutable."""
        return [c.task for c in self.table.add(tasks)]

    def change_windows(self, tasks: Mapping[bytes, AT]) -> list[tuple[AT, AT]]:
        """Serve these served tasks with their files' windows now (SIGHUP
        after veil survey close or extend); returns (before, after) pairs."""
        return self.table.change_windows(tasks)

    @property
    def tasks(self) -> dict[bytes, AT]:
        return self.table.tasks

    def task(self, task_id: bytes) -> AT:
        return self.table.task(task_id)

    def context(self, task_id: bytes) -> TaskContext[AT]:
        return self.table.context(task_id)

    # The keys, for the service and the operator's commands.

    @property
    def current_config(self) -> HpkeConfig:
        return self.keys.current_config

    @property
    def opener(self) -> OpenPool:
        return self.keys.opener

    def refresh_keys(self) -> None:
        self.keys.refresh_keys()

    def hpke_configs(self, task_id: bytes) -> list[HpkeConfig]:
        if task_id:
            self.task(task_id)
        self.keys.maybe_refresh_keys()
        return [self.keys.current_config]
