"""Rejections an aggregator reports, each with the gRPC status it maps to.

The logic raises these; the service layer turns `status` (a grpc.StatusCode
name, kept as a string so that the logic does not import grpc) and the message
into the call's status. Messages tell the caller what to change.
"""

from __future__ import annotations

from typing import ClassVar


class AggregatorError(Exception):
    status: ClassVar[str] = "INTERNAL"


class Unauthenticated(AggregatorError):
    status = "UNAUTHENTICATED"


class UnknownTask(AggregatorError):
    status = "NOT_FOUND"


class NotFound(AggregatorError):
    status = "NOT_FOUND"


class InvalidMessage(AggregatorError):
    status = "INVALID_ARGUMENT"


class ReportTimeRejected(AggregatorError):
    """Too far in the future, or outside the task's validity window."""

    status = "OUT_OF_RANGE"


class ReportIdConflict(AggregatorError):
    status = "ALREADY_EXISTS"


class BatchCollected(AggregatorError):
    status = "FAILED_PRECONDITION"


class WindowOpen(AggregatorError):
    """A batch of a task whose window has not closed yet."""

    status = "FAILED_PRECONDITION"


class BatchTooSmall(AggregatorError):
    status = "FAILED_PRECONDITION"


class BatchMismatch(AggregatorError):
    """The helper's view of a batch differs from the leader's count or checksum."""

    status = "ABORTED"


class JobConflict(AggregatorError):
    status = "ALREADY_EXISTS"


class BudgetExhausted(AggregatorError):
    status = "RESOURCE_EXHAUSTED"


class TooLarge(AggregatorError):
    status = "RESOURCE_EXHAUSTED"


class Unavailable(AggregatorError):
    status = "UNAVAILABLE"


# gRPC status names and their numeric codes (grpc.StatusCode values): stored
# with a failed collection job and reported when it is polled.
STATUS_CODES = {
    "OK": 0,
    "INVALID_ARGUMENT": 3,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "OUT_OF_RANGE": 11,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "UNAUTHENTICATED": 16,
}

# The class a refusal from the other aggregator is re-raised as, by status.
BY_STATUS: dict[str, type[AggregatorError]] = {
    "UNAUTHENTICATED": Unauthenticated,
    "NOT_FOUND": NotFound,
    "INVALID_ARGUMENT": InvalidMessage,
    "OUT_OF_RANGE": ReportTimeRejected,
    "ALREADY_EXISTS": JobConflict,
    "FAILED_PRECONDITION": BatchTooSmall,
    "ABORTED": BatchMismatch,
    "RESOURCE_EXHAUSTED": BudgetExhausted,
    "UNAVAILABLE": Unavailable,
}
