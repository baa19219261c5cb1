"""DAP's media type and its problem documents (draft-ietf-ppm-dap section
3.6 "Errors", section 9.1 "Protocol Message Media Type").

Every DAP message travels as ``application/ppm-dap;message=NAME``;
`media_type` writes that header and `message_of` reads one, refusing
another type or a missing or unknown message. An error is an RFC 9457
problem document (``application/problem+json``) whose `type` is one of
DAP's URNs, ``urn:ietf:params:ppm:dap:error:NAME``, with the task id in a
`taskid` member where the task is known.
"""

from __future__ import annotations

import base64
import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from veil.dap.messages import Extension, Interval

MEDIA_TYPE = "application/ppm-dap"
PROBLEM_MEDIA_TYPE = "application/problem+json"

#: The `message` parameter of each message's media type (section 9.1).
MESSAGES = (
    "hpke-config-list",
    "upload-req",
    "upload-errors",
    "aggregation-job-init-req",
    "aggregation-job-resp",
    "aggregation-job-continue-req",
    "aggregate-share-req",
    "aggregate-share",
    "collection-job-req",
    "collection-job-resp",
)


class MediaTypeError(ValueError):
    """A Content-Type that is not DAP's media type for the expected message."""


def media_type(message: str) -> str:
    """The Content-Type of a DAP message, e.g.
    ``application/ppm-dap;message=upload-req``."""
    if message not in MESSAGES:
        raise ValueError(f"{message!r} is not a DAP message")
    return f"{MEDIA_TYPE};message={message}"


def message_of(content_type: str | None) -> str:
    """The DAP message a Content-Type names. Type, subtype and parameter
    names are case-insensitive (RFC 9110 section 8.3.1); the message's
    value is compared exactly, and may be quoted. The draft's optional
    `version` parameter is accepted and not read; any other parameter is
    refused, as is a parameter given twice."""
    if not content_type:
        raise MediaTypeError("no Content-Type: a DAP message is application/ppm-dap")
    kind, *params = content_type.split(";")
    if kind.strip().lower() != MEDIA_TYPE:
        raise MediaTypeError(f"Content-Type {kind.strip()!r} is not {MEDIA_TYPE}")
    found: dict[str, str] = {}
    for param in params:
        name, sep, value = param.strip().partition("=")
        name = name.strip().lower()
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        if not sep or not name or name in found:
            raise MediaTypeError(f"malformed media type parameters in {content_type!r}")
        if name not in ("message", "version"):
            raise MediaTypeError(f"unknown media type parameter {name!r}")
        found[name] = value
    message = found.get("message")
    if message is None:
        raise MediaTypeError(f"{MEDIA_TYPE} needs its message parameter")
    if message not in MESSAGES:
        raise MediaTypeError(f"{message!r} is not a DAP message")
    return message


class ProblemType(enum.Enum):
    """DAP's error types (section 3.6, the errors sub-namespace of
    urn:ietf:params:ppm:dap)."""

    INVALID_MESSAGE = "invalidMessage"
    UNRECOGNIZED_TASK = "unrecognizedTask"
    UNRECOGNIZED_AGGREGATION_JOB = "unrecognizedAggregationJob"
    BATCH_INVALID = "batchInvalid"
    INVALID_BATCH_SIZE = "invalidBatchSize"
    INVALID_AGGREGATION_PARAMETER = "invalidAggregationParameter"
    BATCH_MISMATCH = "batchMismatch"
    STEP_MISMATCH = "stepMismatch"
    BATCH_OVERLAP = "batchOverlap"
    UNSUPPORTED_EXTENSION = "unsupportedExtension"
    INVALID_EXTENSION = "invalidExtension"

    @property
    def urn(self) -> str:
        return URN_PREFIX + self.value


URN_PREFIX = "urn:ietf:params:ppm:dap:error:"
_BY_URN = {t.urn: t for t in ProblemType}


@dataclass(frozen=True)
class Problem:
    """A problem document with one of DAP's types. `status` is the HTTP
    status it travels with (a client error unless the draft says
    otherwise); `task_id` (32 bytes) becomes the `taskid` member;
    `unsupported_extensions` the member of that name (section 4.4.2, an
    upload's unknown extensions)."""

    type: ProblemType
    detail: str
    status: int = 400
    task_id: bytes | None = None
    unsupported_extensions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not 400 <= self.status <= 599:
            raise ValueError("a problem document travels with a 4xx or 5xx status")

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "type": self.type.urn,
            "title": _TITLES[self.type],
            "status": self.status,
            "detail": self.detail,
        }
        if self.task_id is not None:
            doc["taskid"] = base64.urlsafe_b64encode(self.task_id).rstrip(b"=").decode()
        if self.unsupported_extensions:
            doc["unsupported_extensions"] = list(self.unsupported_extensions)
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, body: bytes, status: int) -> Problem:
        """The problem document an HTTP response carried, if it is one of
        DAP's types; ValueError for anything else (not JSON, not an object,
        another type), which the caller reports with the status alone."""
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise ValueError("the response's body is not JSON") from None
        if not isinstance(doc, dict) or doc.get("type") not in _BY_URN:
            raise ValueError("the response is not a DAP problem document")
        detail = doc.get("detail")
        task_id = None
        if isinstance(doc.get("taskid"), str):
            try:
                task_id = base64.urlsafe_b64decode(doc["taskid"] + "=" * (-len(doc["taskid"]) % 4))
            except ValueError:
                task_id = None
        extensions = doc.get("unsupported_extensions")
        return cls(
            _BY_URN[doc["type"]],
            detail if isinstance(detail, str) else "",
            status,
            task_id if task_id is not None and len(task_id) == 32 else None,
            tuple(e for e in extensions if isinstance(e, int) and 0 <= e < 1 << 16)
            if isinstance(extensions, list)
            else (),
        )


class DapAbort(Exception):
    """A request refused whole, with the problem document to answer (the
    leader's and the helper's routes alike)."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.detail)
        self.problem = problem


class DapUnauthorized(Exception):
    """A request without the task's bearer token: DAP has no error type for
    it, and the route answers 401."""


def refuse_extensions_and_agg_param(
    task_id: bytes, extensions: Sequence[Extension], agg_param: bytes, job: str
) -> None:
    """DapAbort for a Prio3 time-interval task's `job` ("aggregation job",
    "collection job") that carries an extension (none applies: a
    leader-selected batch id is the other batch mode's) or a non-empty
    aggregation parameter (Prio3's is empty)."""
    if extensions:
        raise DapAbort(
            Problem(
                ProblemType.UNSUPPORTED_EXTENSION,
                f"this task takes no {job} extension",
                400,
                task_id,
                tuple(e.extension_type for e in extensions),
            )
        )
    if agg_param:
        raise DapAbort(
            Problem(
                ProblemType.INVALID_AGGREGATION_PARAMETER,
                "Prio3's aggregation parameter is empty",
                400,
                task_id,
            )
        )


def batch_interval_seconds(
    task_id: bytes, interval: Interval, time_precision: int
) -> tuple[int, int]:
    """The (start, duration) in seconds of a query's batch interval (given
    in units of the task's `time_precision`); DapAbort with batchInvalid for
    an empty interval or one ending past the time range."""
    tp = time_precision
    if interval.duration == 0 or (interval.start + interval.duration) * tp >= 2**63:
        raise DapAbort(
            Problem(
                ProblemType.BATCH_INVALID,
                "a batch interval is non-empty and within the time range",
                400,
                task_id,
            )
        )
    return interval.start * tp, interval.duration * tp


_TITLES = {
    ProblemType.INVALID_MESSAGE: "A message could not be parsed or was otherwise invalid.",
    ProblemType.UNRECOGNIZED_TASK: "The task id is unknown.",
    ProblemType.UNRECOGNIZED_AGGREGATION_JOB: "The aggregation job id is unknown.",
    ProblemType.BATCH_INVALID: "The query's batch boundary check failed.",
    ProblemType.INVALID_BATCH_SIZE: "The batch holds an invalid number of reports.",
    ProblemType.INVALID_AGGREGATION_PARAMETER: "The aggregation parameter is invalid.",
    ProblemType.BATCH_MISMATCH: "The aggregators disagree on the reports of a batch.",
    ProblemType.STEP_MISMATCH: "The aggregators disagree on the aggregation step.",
    ProblemType.BATCH_OVERLAP: "The query includes reports collected in another batch.",
    ProblemType.UNSUPPORTED_EXTENSION: "An extension is not supported.",
    ProblemType.INVALID_EXTENSION: "An extension list is out of order or an extension invalid.",
}
