"""What the helper checks of every report and every job, for both kinds of
task (every job's scope, veil.aggregator.helper.jobs)."""

from __future__ import annotations

from collections.abc import Callable

from veil.aggregator.core import (
    INVALID_MESSAGE,
    INVALID_TOKEN,
    REPORT_REPLAYED,
    REPORT_TOO_EARLY,
    TASK_EXPIRED,
    VerifyInitItem,
    VerifyResult,
    helper_token_valid,
)
from veil.aggregator.errors import JobConflict, ReportRejection
from veil.messages import REPORT_ID_SIZE
from veil.task import HelperTask


def check_report(
    task: HelperTask, now: float, it: VerifyInitItem, seen: set[bytes]
) -> ReportRejection | None:
    """The helper's own checks of one report before its share is opened:
    well formed, not seen, not too early by this clock, in the task's
    window, and for a task with invitations a valid token for the report's
    content (one RSA verification)."""
    # Times are stored as 64-bit signed integers: anything else is malformed,
    # and a malformed report's id is not recorded as seen.
    if len(it.report_id) != REPORT_ID_SIZE or not 0 <= it.time < 2**63:
        return INVALID_MESSAGE
    if it.report_id in seen:
        return REPORT_REPLAYED
    if it.time > now + task.max_clock_skew:
        return REPORT_TOO_EARLY
    if not task.not_before <= it.time < task.not_after:
        return TASK_EXPIRED
    if task.issuer_public_key is not None and not helper_token_valid(task, it):
        return INVALID_TOKEN
    return None


def same_request(job_id: bytes, stored_digest: bytes, digest: bytes) -> None:
    """A job id run again must carry the same request (JobConflict if not)."""
    if stored_digest != digest:
        raise JobConflict(
            f"aggregation job {job_id.hex()} was already run with other content; use a fresh job id"
        )


def stored_answer(
    job_id: bytes,
    stored: tuple[bytes, bytes] | None,
    digest: bytes,
    decode: Callable[[bytes], list[VerifyResult]],
) -> list[VerifyResult] | None:
    """A job's stored answer, (request digest, encoded answer) as its record
    keeps them, decoded; None if there is none. A request that differs from
    the stored one is a JobConflict."""
    if stored is None:
        return None
    same_request(job_id, stored[0], digest)
    return decode(stored[1])
