"""The aggregators' own values as protobuf, beyond veil.messages.wire: a
report's rejection reason (veil.aggregator.errors.ReportRejection), a
batch interval and a task's window. The services (veil.aggregator.run.service) write them and
the leader's client of the helper (veil.aggregator.leader.helper_client)
reads them."""

from __future__ import annotations

from veil.aggregator.errors import ReportRejection
from veil.protocol.v1 import helper_pb2, messages_pb2


def interval_pb(start: int, duration: int) -> messages_pb2.Interval:
    return messages_pb2.Interval(start=start, duration=duration)


def window_pb(not_before: int, not_after: int) -> helper_pb2.TaskWindow:
    return helper_pb2.TaskWindow(not_before=not_before, not_after=not_after)


def window_from_pb(
    request: helper_pb2.AggregationJobRequest | helper_pb2.AggregateShareRequest,
) -> tuple[int, int] | None:
    """The leader's window of the request's task; None where it sends none."""
    if not request.HasField("task_window"):
        return None
    return request.task_window.not_before, request.task_window.not_after


# Rejection reasons on the wire (helper.proto's ReportError), one by one.
REJECTION_TO_PB: dict[ReportRejection, int] = {
    ReportRejection.BATCH_COLLECTED: helper_pb2.BATCH_COLLECTED,
    ReportRejection.REPORT_REPLAYED: helper_pb2.REPORT_REPLAYED,
    ReportRejection.REPORT_DROPPED: helper_pb2.REPORT_DROPPED,
    ReportRejection.HPKE_UNKNOWN_CONFIG_ID: helper_pb2.HPKE_UNKNOWN_CONFIG_ID,
    ReportRejection.HPKE_DECRYPT_ERROR: helper_pb2.HPKE_DECRYPT_ERROR,
    ReportRejection.VDAF_DECODE_ERROR: helper_pb2.VDAF_DECODE_ERROR,
    ReportRejection.VDAF_VERIFY_ERROR: helper_pb2.VDAF_VERIFY_ERROR,
    ReportRejection.REPORT_TOO_EARLY: helper_pb2.REPORT_TOO_EARLY,
    ReportRejection.TASK_EXPIRED: helper_pb2.TASK_EXPIRED,
    ReportRejection.INVALID_MESSAGE: helper_pb2.INVALID_MESSAGE,
    ReportRejection.INVALID_TOKEN: helper_pb2.INVALID_TOKEN,
}
REJECTION_FROM_PB: dict[int, ReportRejection] = {v: k for k, v in REJECTION_TO_PB.items()}
