"""The helper of a DAP task as the leader calls it (draft-ietf-ppm-dap
sections 4.5.2.1 and 4.6.4, leader side): the leader's `HelperApi` over
DAP's HTTP routes, so that the one job driver and the one release step run
a DAP task's jobs and collections as they run a veil task's over gRPC.

An aggregation job is one POST of an AggregationJobInitReq to
``{helper}/tasks/{task-id}/aggregation_jobs``: each report's metadata (its
time in the task's time precision), public share and sealed share to the
helper, with the leader's verifier share in the VDAF's ping-pong
`initialize` message; the helper's `continue` answers carry the ping-pong
`finish` message, whose verifier message the engine's leader steps take.
The same job asked again sends the same bytes, so the helper finds the job
it created (its id derives from the body). An aggregate share is one POST
of an AggregateShareReq. Requests carry the task's aggregator token as
``Authorization: Bearer``. The helper may answer at once or later (section
3.1): an empty 2xx answer is polled at its ``Location`` until it is ready,
a ``Location`` below the resource asked, at the helper's origin (no other:
the token goes nowhere else, and no redirect is followed).
"""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from urllib.parse import urljoin

from veil.aggregator.core import AggregationAnswer, VerifyInitItem, VerifyResult
from veil.aggregator.errors import (
    AggregatorError,
    BatchCollected,
    BatchMismatch,
    BatchTooSmall,
    InvalidMessage,
    ReportRejection,
    Unauthenticated,
    Unavailable,
    UnknownTask,
)
from veil.aggregator.leader.dap import collection_job_req
from veil.aggregator.leader.peer import HelperApi
from veil.dap.codec import DecodeError
from veil.dap.invitation import INVITATION_EXTENSION
from veil.dap.jobs import (
    AggregateShare,
    AggregateShareReq,
    AggregationJobInitReq,
    AggregationJobResp,
    BatchSelector,
    ReportShare,
    VerifyInit,
    VerifyRespType,
    batch_id_extension,
)
from veil.dap.messages import BatchMode, Extension, Interval, ReportMetadata
from veil.dap.pingpong import MessageType, PingPong, initialize
from veil.dap.problems import Problem, ProblemType, media_type
from veil.dap.urls import opener, resource_within
from veil.dap.versions import ReportError
from veil.hpke import Ciphertext
from veil.task import LeaderTask

# What the leader waits for one answer, and at most between two polls.
TIMEOUT = 60.0
MAX_POLL_WAIT = 5.0
# The verification key id of veil's one key per task (as its helper reads it).
VERIFICATION_KEY_ID = 0

_REJECTIONS = {
    ReportError.BATCH_COLLECTED: ReportRejection.BATCH_COLLECTED,
    ReportError.REPORT_REPLAYED: ReportRejection.REPORT_REPLAYED,
    ReportError.REPORT_DROPPED: ReportRejection.REPORT_DROPPED,
    ReportError.HPKE_UNKNOWN_CONFIG_ID: ReportRejection.HPKE_UNKNOWN_CONFIG_ID,
    ReportError.HPKE_DECRYPT_ERROR: ReportRejection.HPKE_DECRYPT_ERROR,
    ReportError.VDAF_VERIFY_ERROR: ReportRejection.VDAF_VERIFY_ERROR,
    ReportError.REPORT_TOO_EARLY: ReportRejection.REPORT_TOO_EARLY,
    ReportError.TASK_EXPIRED: ReportRejection.TASK_EXPIRED,
    ReportError.TASK_NOT_STARTED: ReportRejection.TASK_EXPIRED,
}

_REFUSALS: dict[ProblemType, type[AggregatorError]] = {
    ProblemType.UNRECOGNIZED_TASK: UnknownTask,
    ProblemType.BATCH_MISMATCH: BatchMismatch,
    ProblemType.INVALID_BATCH_SIZE: BatchTooSmall,
    ProblemType.BATCH_OVERLAP: BatchCollected,
}


# Sends one HTTP request: (status, headers with lower-case names, body).
Send = Callable[[urllib.request.Request], tuple[int, dict[str, str], bytes]]


class DapHelperClient:
    """`HelperApi` over DAP's HTTP, for tasks served over DAP. `tls` is the
    context an https helper endpoint is reached with (the system's trust if
    None); `send` replaces the HTTP client (a test's in-process helper)."""

    def __init__(
        self,
        tls: ssl.SSLContext | None = None,
        timeout: float = TIMEOUT,
        send: Send | None = None,
    ) -> None:
        self.tls = tls
        self.timeout = timeout
        self.send = send or self._urlopen
        self._opener = opener(tls)

    def aggregate(
        self,
        task: LeaderTask,
        job_id: bytes,
        items: Sequence[VerifyInitItem],
        prefix_round: tuple[bytes, int, int, int] | None = None,
        batch_id: bytes | None = None,
    ) -> AggregationAnswer:
        assert task.dap is not None and prefix_round is None
        assert (batch_id is not None) == task.dap.leader_selected
        version = task.dap.dap_version
        tp = task.time_precision
        request = AggregationJobInitReq(
            VERIFICATION_KEY_ID,
            b"",
            () if batch_id is None else (batch_id_extension(batch_id),),
            tuple(
                VerifyInit(
                    ReportShare(
                        # A task with invitations: the stored invitation
                        # extension (veil.aggregator.leader.dap), public
                        # unless the helper is another implementation.
                        ReportMetadata(
                            it.report_id,
                            it.time // tp,
                            (Extension(INVITATION_EXTENSION, it.token),)
                            if it.token and not task.invitation_private
                            else (),
                        ),
                        it.public_share,
                        it.encrypted_input_share,
                    ),
                    initialize(it.leader_verifier_share),
                )
                for it in items
            ),
        )
        body = self._post(
            task,
            "aggregation_jobs",
            request.encode(),
            "aggregation-job-init-req",
            "aggregation-job-resp",
        )
        try:
            resps = AggregationJobResp.decode(body, version).verify_resps
        except DecodeError as e:
            raise InvalidMessage(f"the helper's AggregationJobResp: {e}") from None
        results = []
        for resp in resps:
            if resp.type is VerifyRespType.REJECT:
                assert resp.error is not None
                reason = _REJECTIONS.get(resp.error, ReportRejection.INVALID_MESSAGE)
                results.append(VerifyResult(resp.report_id, None, reason))
                continue
            try:
                message = PingPong.decode(resp.payload) if resp.payload else None
            except DecodeError:
                message = None
            if message is None or message.type is not MessageType.FINISH:
                # Prio3 ends after the helper's first answer: anything but
                # its finish message is a step the leader cannot take
                # (section 4.5.2.1: the job is abandoned).
                raise InvalidMessage(
                    f"the helper answered report {resp.report_id.hex()} with a"
                    f" {resp.type.name.lower()} that does not finish it"
                )
            results.append(VerifyResult(resp.report_id, message.verifier_message))
        return AggregationAnswer(results)

    def aggregate_share(
        self,
        task: LeaderTask,
        collection_id: bytes,
        start: int,
        duration: int,
        report_count: int,
        checksum: bytes,
        agg_param: bytes = b"",
        batch_id: bytes | None = None,
    ) -> Ciphertext:
        assert not agg_param
        tp = task.time_precision
        if batch_id is not None:
            selector = BatchSelector(BatchMode.LEADER_SELECTED, batch_id=batch_id)
        else:
            selector = BatchSelector(BatchMode.TIME_INTERVAL, Interval(start // tp, duration // tp))
        request = AggregateShareReq(
            collection_job_req(task, start, duration),
            selector,
            report_count,
            checksum,
        )
        body = self._post(
            task, "aggregate_shares", request.encode(), "aggregate-share-req", "aggregate-share"
        )
        try:
            return AggregateShare.decode(body).encrypted_aggregate_share
        except DecodeError as e:
            raise InvalidMessage(f"the helper's AggregateShare: {e}") from None

    def _post(
        self, task: LeaderTask, resource: str, body: bytes, sent: str, expected: str
    ) -> bytes:
        """POST `body` to the creation URL of `resource`; the representation
        the helper answers, polled at its Location while it is not ready."""
        assert task.dap is not None
        base = task.dap.helper_endpoint
        url = urljoin(
            base if base.endswith("/") else base + "/", f"tasks/{task.id_text}/{resource}"
        )
        headers = {
            "Content-Type": media_type(sent),
            "Authorization": f"Bearer {task.aggregator_token}",
        }
        status, answer, got = self._call(urllib.request.Request(url, body, headers, method="POST"))
        deadline = time.monotonic() + self.timeout
        while not got:
            # Deferred (section 3.1): poll the resource until it is ready.
            location = answer.get("location")
            if location is None or time.monotonic() > deadline:
                raise Unavailable(f"the helper deferred its {resource} answer and did not give it")
            wait = answer.get("retry-after", "1")
            time.sleep(min(float(wait) if wait.isdigit() else 1.0, MAX_POLL_WAIT))
            try:
                # The token goes to this resource at the helper, nowhere else.
                there = resource_within(url, location, url + "/")
            except ValueError as e:
                raise InvalidMessage(f"the helper deferred its {resource} answer: {e}") from None
            poll = urllib.request.Request(
                there, headers={"Authorization": headers["Authorization"]}
            )
            status, answer, got = self._call(poll)
        if answer.get("content-type", "").replace(" ", "") != media_type(expected):
            raise InvalidMessage(
                f"the helper answered {status} with {answer.get('content-type')!r}, not"
                f" {media_type(expected)}"
            )
        return got

    def _call(self, request: urllib.request.Request) -> tuple[int, dict[str, str], bytes]:
        status, headers, body = self.send(request)
        if status >= 400:
            raise _refusal(status, body)
        return status, headers, body

    def _urlopen(self, request: urllib.request.Request) -> tuple[int, dict[str, str], bytes]:
        try:
            with self._opener.open(request, timeout=self.timeout) as r:
                return r.status, _lower(r.headers.items()), r.read()
        except urllib.error.HTTPError as e:
            return e.code, _lower(e.headers.items()), e.read()
        except (urllib.error.URLError, OSError) as e:
            raise Unavailable(f"cannot reach the DAP helper: {e}") from None


def _lower(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {k.lower(): v for k, v in items}


def _refusal(status: int, body: bytes) -> AggregatorError:
    """The helper's refusal as the leader's drivers take it."""
    if status == 401 or status == 403:
        return Unauthenticated("the DAP helper refused the task's aggregator token")
    if status >= 500 or status == 429:
        return Unavailable(f"the DAP helper answered {status}")
    try:
        problem = Problem.from_json(body, status)
    except ValueError:
        return InvalidMessage(f"the DAP helper refused the request ({status})")
    kind = _REFUSALS.get(problem.type, InvalidMessage)
    return kind(f"the DAP helper: {problem.type.value}: {problem.detail}")


class ByProtocol:
    """The leader's `HelperApi` for every task: DAP's for a task served over
    DAP, veil's gRPC client for the others."""

    def __init__(self, grpc: HelperApi, dap: HelperApi) -> None:
        self.grpc = grpc
        self.dap = dap

    def aggregate(
        self,
        task: LeaderTask,
        job_id: bytes,
        items: Sequence[VerifyInitItem],
        prefix_round: tuple[bytes, int, int, int] | None = None,
        batch_id: bytes | None = None,
    ) -> AggregationAnswer:
        if task.dap is not None:
            return self.dap.aggregate(task, job_id, items, prefix_round, batch_id)
        return self.grpc.aggregate(task, job_id, items, prefix_round)

    def aggregate_share(
        self,
        task: LeaderTask,
        collection_id: bytes,
        start: int,
        duration: int,
        report_count: int,
        checksum: bytes,
        agg_param: bytes = b"",
        batch_id: bytes | None = None,
    ) -> Ciphertext:
        if task.dap is not None:
            return self.dap.aggregate_share(
                task, collection_id, start, duration, report_count, checksum, agg_param, batch_id
            )
        return self.grpc.aggregate_share(
            task, collection_id, start, duration, report_count, checksum, agg_param
        )
