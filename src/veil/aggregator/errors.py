"""Rejections an aggregator reports: each says its gRPC status, whether the
same request may succeed later (`retryable`) and its `kind`, the name that
travels to the peer.

The logic raises these; the service layer turns `status` (a grpc.StatusCode
name, kept as a string so that the logic does not import grpc) and the message
into the call's status, and sends `kind` and `retryable` in the call's
trailing metadata (veil.grpc_util.ERROR_KIND_KEY, RETRYABLE_KEY), and
`retry_after` where the error advises a wait (RETRY_AFTER_KEY). The leader
re-raises what the helper raised from its kind (`from_peer`), never from the
status code alone: a RESOURCE_EXHAUSTED that gRPC raises locally for an
oversized message is not the helper's BudgetExhausted. Messages tell the
caller what to change.
"""

from __future__ import annotations

import enum
import re
from typing import ClassVar


class AggregatorError(Exception):
    """Base class. `retryable`: the same request may succeed later, unchanged
    (a transient fault); otherwise the refusal is permanent for that request."""

    status: ClassVar[str] = "INTERNAL"
    retryable: ClassVar[bool] = False
    kind: ClassVar[str] = "aggregator_error"
    # Seconds the caller should wait before sending the same request again,
    # where the server advises a wait (Overloaded); None: no advice.
    retry_after: float | None = None

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.kind = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()
        BY_KIND[cls.kind] = cls


# Every error class by its kind (subclasses add themselves as they are defined).
BY_KIND: dict[str, type[AggregatorError]] = {AggregatorError.kind: AggregatorError}


class Unauthenticated(AggregatorError):
    status = "UNAUTHENTICATED"


class UnknownTask(AggregatorError):
    status = "NOT_FOUND"


class NotFound(AggregatorError):
    status = "NOT_FOUND"


class InvalidMessage(AggregatorError):
    status = "INVALID_ARGUMENT"


class WrongLength(InvalidMessage):
    """A report part whose size is not the one its task's VDAF and HPKE suite fix."""


class InvalidAggParam(InvalidMessage):
    """A Poplar1 aggregation parameter that is malformed on its own: bad
    encoding, prefixes of the wrong length or out of order, or a level that
    is not one of the task's byte levels."""


class TooManyPrefixes(InvalidAggParam):
    """More candidate prefixes in one query than both aggregators allow."""


class AggParamRefused(AggregatorError):
    """A Poplar1 aggregation parameter that breaks the draft's validity rule
    against the batch's earlier queries (levels increase, each prefix extends
    one of the previous level's), or a batch overlapping another queried one."""

    status = "FAILED_PRECONDITION"


class InvalidToken(AggregatorError):
    """A report of a task with invitations without a valid token for it."""

    status = "PERMISSION_DENIED"


class ReportTimeRejected(AggregatorError):
    """Too far in the future, or outside the task's validity window."""

    status = "OUT_OF_RANGE"


class ReportIdConflict(AggregatorError):
    status = "ALREADY_EXISTS"


class BatchCollected(AggregatorError):
    status = "FAILED_PRECONDITION"


class LevelCollected(BatchCollected):
    """A Poplar1 batch queried twice at one level."""


class WindowOpen(AggregatorError):
    """A batch of a task whose window has not closed yet."""

    status = "FAILED_PRECONDITION"


class BatchTooSmall(AggregatorError):
    status = "FAILED_PRECONDITION"


class BatchTooLarge(AggregatorError):
    """More reports than the task's field can sum without wrapping around."""

    status = "FAILED_PRECONDITION"


class BatchMismatch(AggregatorError):
    """The helper's view of a batch differs from the leader's count or checksum."""

    status = "ABORTED"


class JobConflict(AggregatorError):
    status = "ALREADY_EXISTS"


class BudgetExhausted(AggregatorError):
    status = "RESOURCE_EXHAUSTED"


class TooLarge(AggregatorError):
    """A request over a size limit: the aggregator's, or gRPC's message limit."""

    status = "RESOURCE_EXHAUSTED"


class Unavailable(AggregatorError):
    """The aggregator (or its database) cannot serve the request now."""

    status = "UNAVAILABLE"
    retryable = True


class Overloaded(Unavailable):
    """The leader holds as many reports waiting for aggregation as it admits
    ([admission] in the server configuration): nothing was stored, and the
    same request will be taken once the backlog has drained. `retry_after`
    is the server's advice, in seconds, sent to the caller with the refusal."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RequestTimeout(AggregatorError):
    """A call whose request had not arrived `receive_seconds` after its
    headers (veil.aggregator.run.transport): the client is idle or too slow."""

    status = "DEADLINE_EXCEEDED"
    retryable = True


class TooManyWaiting(Unavailable):
    """More calls were waiting for their requests than the server keeps
    (`max_waiting_calls`); this one had waited longest and was ended."""


class Busy(Unavailable):
    """More calls had their requests in and waited for a worker thread than
    the server queues (`max_queued_calls`, veil.aggregator.run.transport): this
    one was refused unserved, its request dropped."""


class WindowMismatch(Unavailable):
    """The leader's and the helper's task files give a task different windows:
    one organisation has closed or extended the survey (veil survey close,
    veil survey extend) and the other not yet, or not to the same time.
    Nothing is done for the task until they agree; the same request is taken
    once both files match."""

    status = "FAILED_PRECONDITION"


class NoiseUnavailable(Unavailable):
    """No noise vector drawn ahead is ready yet (nothing was spent): retry shortly."""


class NoiseFailed(AggregatorError):
    """Drawing the task's noise failed (nothing was spent); the server's log says why."""

    status = "INTERNAL"


class RpcFailed(AggregatorError):
    """A call to the peer failed without a veil refusal: gRPC's own error or a
    peer that does not say what it raised (not a refusal by the peer)."""

    status = "INTERNAL"


class Internal(AggregatorError):
    """An unexpected failure inside the aggregator (details in its log)."""

    status = "INTERNAL"


class ReportRejection(enum.StrEnum):
    """Why a report was rejected during aggregation: the ReportError enum of
    helper.proto (draft-ietf-ppm-dap section 4.5.1.4, ReportError), plus the
    leader's own JOB_FAILED for the reports of a job it gave up on."""

    BATCH_COLLECTED = "batch_collected"
    REPORT_REPLAYED = "report_replayed"
    REPORT_DROPPED = "report_dropped"
    HPKE_UNKNOWN_CONFIG_ID = "hpke_unknown_config_id"
    HPKE_DECRYPT_ERROR = "hpke_decrypt_error"
    VDAF_DECODE_ERROR = "vdaf_decode_error"
    VDAF_VERIFY_ERROR = "vdaf_verify_error"
    REPORT_TOO_EARLY = "report_too_early"
    TASK_EXPIRED = "task_expired"
    INVALID_MESSAGE = "invalid_message"
    INVALID_TOKEN = "invalid_token"
    # Leader only, never on the wire: the job's error is recorded with the job.
    JOB_FAILED = "job_failed"


# gRPC status names and their numeric codes (grpc.StatusCode values): stored
# with a failed collection job and reported when it is polled.
STATUS_CODES = {
    "OK": 0,
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "OUT_OF_RANGE": 11,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "DATA_LOSS": 15,
    "UNAUTHENTICATED": 16,
}

# Statuses of a call that failed on the way (the peer unreachable, the
# deadline passed, the call dropped): the request may not have arrived.
TRANSPORT_STATUSES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN"})


def from_peer(status: str, details: str, kind: str | None, peer: str) -> AggregatorError:
    """The error a failed call to the other aggregator (`peer`, e.g. "the
    helper at host:port") stands for.

    With `kind` (the peer's trailing metadata) it is exactly what the peer
    raised. Without it the call failed before or outside the peer's logic: a
    transport failure is Unavailable, gRPC's message-size limit is TooLarge,
    anything else RpcFailed; never one of the peer's refusals.
    """
    cls = BY_KIND.get(kind) if kind is not None else None
    if cls is not None:
        if cls.retryable:
            return cls(f"{peer} is unavailable: {details}")
        return cls(f"{peer} refused: {details}")
    if status in TRANSPORT_STATUSES:
        return Unavailable(f"call to {peer} failed ({status}): {details}")
    if status == "RESOURCE_EXHAUSTED":
        return TooLarge(f"call to {peer} exceeds a gRPC message limit: {details}")
    return RpcFailed(f"call to {peer} failed ({status}) without a veil error: {details}")
