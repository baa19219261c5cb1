"""The collector of a DAP task (draft-ietf-ppm-dap section 4.6, collector
side): the same results as `Collector`, over DAP's HTTP routes.

A collection job is created by POSTing a CollectionJobReq (a time-interval
query) to ``{leader}/tasks/{task-id}/collection_jobs`` with the collector's
token as ``Authorization: Bearer``; the leader answers with the job's
``Location``, which is polled until it holds the CollectionJobResp (a
``Location`` elsewhere than the task's collection jobs at the leader's
origin is refused, and no redirect is followed, a 3xx to the request
being an error naming its Location: the token goes to the leader the
task file names, nowhere else). Each
aggregate share is opened with DAP's ``info`` and AggregateShareAad (the
task's configuration and the very request), decoded and unsharded with the
task's VDAF, and estimated as `Collector` does. A retry sends the same
request, and veil's leader finds the same job (its id derives from the
body), so a collection interrupted while pending is resumed by collecting
the same batch again, or by polling the job the leader named (its id, the
last segment of its ``Location``, which a result carries).

Everything read from the network is checked before it is used: the status,
the media type, the message's encoding, the interval against the query; a
refusal's problem document becomes a `CollectionError` naming the draft's
error type.
"""

from __future__ import annotations

import base64
import secrets
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any
from urllib.parse import urljoin

import grpc

from veil.collector.collector import (
    MAX_POLL,
    CollectionError,
    CollectionJobFailed,
    CollectionResult,
    Collector,
    UnusableTask,
    _Waiting,
    batch_result,
)
from veil.collector.estimate import estimates
from veil.dap.codec import DecodeError
from veil.dap.jobs import CollectionJobReq, CollectionJobResp, Query
from veil.dap.messages import BatchMode, Interval
from veil.dap.problems import MediaTypeError, Problem, ProblemType, media_type, message_of
from veil.dap.shares import open_aggregate_share
from veil.dap.urls import opener, resource_within
from veil.dap.versions import Role
from veil.hpke import Ciphertext, HpkeError
from veil.task import CollectorTask, expect_role
from veil.trust import check_roots

# The size of a collection job's id (veil's leader's, and what veil collect
# --job-id takes).
JOB_ID_SIZE = 16
# The largest answer read from the leader: a CollectionJobResp holds two
# aggregate shares, far below this for every task veil can serve.
MAX_ANSWER = 16 << 20

# A refusal's HTTP status as the gRPC status `CollectionError` carries.
_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
}
_PROBLEM_CODES = {
    ProblemType.BATCH_OVERLAP: grpc.StatusCode.FAILED_PRECONDITION,
    ProblemType.INVALID_BATCH_SIZE: grpc.StatusCode.FAILED_PRECONDITION,
    ProblemType.BATCH_INVALID: grpc.StatusCode.FAILED_PRECONDITION,
}


class DapCollector:
    """Collects batches of one DAP task (a task file with a `[dap]` table)
    from its leader over DAP; `collect` takes and returns what
    `Collector.collect` does. `leader_root_certificates` (PEM) trusts an
    https leader endpoint (the system's roots if None), checked against the
    CA the task pins for the leader."""

    def __init__(
        self,
        task: CollectorTask,
        *,
        leader_root_certificates: bytes | None = None,
        timeout: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.task: CollectorTask = expect_role(task, CollectorTask)
        if task.dap is None:
            raise UnusableTask(f"task {task.id_text} is not served over DAP (no [dap] table)")
        if task.vdaf.is_prefix:
            raise UnusableTask("a poplar1 task is not served over DAP")
        # As Collector: what the results need is computed before anything is spent.
        try:
            self.bounds = task.dp.bounds(task.vdaf)
            self.bounds.check_batch_floor(task.min_batch_size)
            self.vdaf = task.vdaf.instantiate()
            estimates(task, [0] * len(self.vdaf.agg_init(None)), 0.95, task.min_batch_size)
        except ValueError as e:
            raise UnusableTask(
                f"this task's results cannot be computed ({e}); nothing was collected or spent"
            ) from None
        check_roots(leader_root_certificates, None, task.leader_ca_sha256)
        self.dap = task.dap
        self.configuration = task.dap_configuration()
        self.timeout = timeout
        self.clock = clock
        self.tls = (
            None
            if leader_root_certificates is None
            else ssl.create_default_context(cadata=leader_root_certificates.decode())
        )
        base = self.dap.leader_endpoint
        self.tasks_url = urljoin(
            base if base.endswith("/") else base + "/", f"tasks/{task.id_text}"
        )
        self._auth = {"Authorization": f"Bearer {task.collector_token}"}
        self._opener = opener(self.tls)

    def close(self) -> None:
        """Nothing to close (each request is its own connection); kept so that
        a DapCollector is used as a Collector is."""

    def __enter__(self) -> DapCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def collect(
        self,
        start: int,
        duration: int,
        *,
        wait: float = 300.0,
        poll_interval: float = 0.05,
        confidence: float = 0.95,
        simultaneous: bool = False,
        collection_job_id: bytes | None = None,
        on_wait: Callable[[str], None] | None = None,
        on_job: Callable[[bytes], None] | None = None,
    ) -> CollectionResult:
        """Collect the batch [start, start + duration) (seconds since the epoch,
        multiples of the task's time_precision), as `Collector.collect`. The
        leader names the job (its `Location`): the result's
        `collection_job_id`, told to `on_job` once the job is created.
        `collection_job_id`, a job the leader named before (16 bytes), is
        polled instead of creating one (a GET of the job's resource, section 4.6).
        Raises CollectionError."""
        if self.dap.leader_selected:
            raise ValueError(
                "this task is leader-selected: the leader chooses each batch (collect_next)"
            )
        tp = self.task.time_precision
        if start % tp or duration % tp or duration <= 0:
            raise ValueError(
                f"the batch [{start}, +{duration}) is not whole time precisions ({tp} s)"
            )
        began = self.clock()
        query = Interval(start // tp, duration // tp)
        request = CollectionJobReq(Query(BatchMode.TIME_INTERVAL, query))
        url, resp = self._job(
            request, began, wait, poll_interval, on_wait, collection_job_id, on_job
        )
        try:
            self._within(resp, query)
            result = self._result(request, resp, (start, duration), confidence, simultaneous, began)
        except CollectionError as e:
            if collection_job_id is None:
                raise
            # The job polled may be of another batch: its shares bind its own request.
            raise CollectionError(
                e.code,
                f"{e.message} (was collection job {collection_job_id.hex()} created for the"
                f" batch [{start}, +{duration})?)",
            ) from None
        return replace(result, collection_job_id=_job_id(url))

    def collect_next(
        self,
        *,
        wait: float = 300.0,
        poll_interval: float = 0.05,
        confidence: float = 0.95,
        simultaneous: bool = False,
        collection_job_id: bytes | None = None,
        on_wait: Callable[[str], None] | None = None,
        on_job: Callable[[bytes], None] | None = None,
    ) -> CollectionResult:
        """Collect the next batch of a leader-selected task: the leader
        chooses one that holds min_batch_size reports and that no collection
        has (the query is empty, section 5.2.1). The result's
        `collection_job_id` is the leader's job (DAP's CollectionJobResp
        names no batch id; None where the leader names its job otherwise
        than by 16 bytes), told to `on_job` once the job is created, its
        start and duration the interval the leader answered. A leader
        without a batch ready refuses with invalidBatchSize (a
        CollectionError). `collection_job_id`, a job the leader named
        before, is polled instead of asking for the next batch (its result
        is that job's batch's). Raises CollectionError."""
        if not self.dap.leader_selected:
            raise ValueError("this task is time-interval: name the batch's interval (collect)")
        began = self.clock()
        request = CollectionJobReq(Query(BatchMode.LEADER_SELECTED))
        url, resp = self._job(
            request, began, wait, poll_interval, on_wait, collection_job_id, on_job
        )
        tp = self.task.time_precision
        got = resp.interval
        batch = (got.start * tp, got.duration * tp)
        result = self._result(request, resp, batch, confidence, simultaneous, began)
        # Released and opened: a job named otherwise than by JOB_ID_SIZE bytes
        # still gives its batch (None, as `collect`), which asking again would not.
        return replace(result, collection_job_id=_job_id(url))

    def delete(self, collection_job_id: bytes, *, wait: float = 30.0) -> None:
        """Delete a collection job at the leader (DAP's DELETE of the job,
        draft-ietf-ppm-dap section 4.6): the collector gives it up. A veil
        leader keeps what a batch collected once needs (its ledger, every
        share released, the batch closed for good; docs/DAP.md, Readings).
        `collection_job_id` is the job's id, as `collect_next` gives it.
        Raises CollectionError (a job the leader does not hold is NOT_FOUND)."""
        request = urllib.request.Request(
            f"{self.tasks_url}/collection_jobs/{_b64(collection_job_id)}",
            headers=self._auth,
            method="DELETE",
        )
        status, _, _ = self._call(request, self.clock() + wait, None)
        if status != 200:
            raise self._bad(f"answered the deletion of its collection job {status}")

    def _job(
        self,
        request: CollectionJobReq,
        began: float,
        wait: float,
        poll_interval: float,
        on_wait: Callable[[str], None] | None,
        job_id: bytes | None = None,
        on_job: Callable[[bytes], None] | None = None,
    ) -> tuple[str, CollectionJobResp]:
        """POST `request` (or take the job `job_id` the leader named before)
        and poll the job until the leader answers its CollectionJobResp:
        (the job's URL, the answer)."""
        deadline = began + wait
        waiting = None if on_wait is None else _Waiting(on_wait, self.clock)
        if job_id is not None:
            if len(job_id) != JOB_ID_SIZE:
                raise ValueError(f"a collection job id is {JOB_ID_SIZE} bytes, not {len(job_id)}")
            url = f"{self.tasks_url}/collection_jobs/{_b64(job_id)}"
        else:
            headers = {**self._auth, "Content-Type": media_type("collection-job-req")}
            post = urllib.request.Request(
                f"{self.tasks_url}/collection_jobs", request.encode(), headers, method="POST"
            )
            # An unreachable leader fails fast here; later polls ride out restarts.
            status, answer, _ = self._call(post, min(deadline, began + 15.0), waiting)
            location = answer.get("location")
            if 300 <= status < 400:
                to = f"to {location!r}" if location else "without a Location"
                raise self._bad(
                    f"answered the collection job request {status}, a redirect {to}: veil"
                    " follows no redirect, which would carry the collector's token elsewhere"
                    " (the task's leader_endpoint must be where the leader answers)"
                )
            if status != 201 or not location:
                raise self._bad(f"answered the collection job request {status} without a Location")
            try:
                # The token goes to the task's jobs at the leader, nowhere else.
                url = resource_within(
                    self.tasks_url + "/", location, f"{self.tasks_url}/collection_jobs/"
                )
            except ValueError as e:
                raise self._bad(f"named its collection job elsewhere: {e}") from None
            named = _job_id(url)
            if named is not None and on_job is not None:
                on_job(named)
        body = b""
        while not body:
            if self.clock() > deadline:
                raise CollectionError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"the collection job at {url} still pending after {wait} s; collect the"
                    " same batch again to resume",
                )
            if waiting is not None and self.clock() - began >= 5.0:
                waiting.say(f"waiting for the aggregators to finish the job at {url}", 0.1)
            time.sleep(poll_interval)
            poll_interval = min(poll_interval * 1.5, MAX_POLL)
            status, answer, body = self._call(
                urllib.request.Request(url, headers=self._auth), deadline, waiting, polling=True
            )
            if status != 200:
                raise self._bad(f"answered a poll of its collection job {status}")
        return url, self._response(answer, body)

    def _result(
        self,
        request: CollectionJobReq,
        resp: CollectionJobResp,
        batch: tuple[int, int],
        confidence: float,
        simultaneous: bool,
        began: float,
    ) -> CollectionResult:
        """Both shares opened, merged and estimated."""
        shares = [
            self._open(role, request, ct, resp.report_count)
            for role, ct in (
                (Role.LEADER, resp.leader_encrypted_agg_share),
                (Role.HELPER, resp.helper_encrypted_agg_share),
            )
        ]
        return batch_result(
            self.task, self.vdaf, self.bounds, shares, resp.report_count,
            batch, confidence, simultaneous, self.clock() - began,
        )  # fmt: skip

    def _within(self, resp: CollectionJobResp, query: Interval) -> None:
        """The answer's interval lies within the query's."""
        got = resp.interval
        if got.start < query.start or got.start + got.duration > query.start + query.duration:
            raise self._bad(
                f"answered the interval [{got.start}, +{got.duration}) (time precisions), not"
                f" within the query's [{query.start}, +{query.duration})"
            )

    def _response(self, answer: dict[str, str], body: bytes) -> CollectionJobResp:
        """The CollectionJobResp the leader answered, checked."""
        try:
            if message_of(answer.get("content-type")) != "collection-job-resp":
                raise MediaTypeError(f"{answer.get('content-type')!r} is not a CollectionJobResp")
            resp = CollectionJobResp.decode(body)
        except (MediaTypeError, DecodeError) as e:
            raise self._bad(
                f"answered its collection job without a CollectionJobResp: {e}"
            ) from None
        return resp

    def _open(self, role: Role, request: CollectionJobReq, ct: Ciphertext, count: int) -> list[int]:
        """One aggregator's share, opened with DAP's associated data and decoded."""
        assert self.task.collector_hpke_keypair is not None
        try:
            plaintext = open_aggregate_share(
                self.dap.dap_version, self.task.collector_hpke_keypair, role,
                self.task.task_id, self.configuration, request, ct,
            )  # fmt: skip
            return list(self.vdaf.decode_agg_share(None, plaintext))
        except (HpkeError, ValueError) as e:
            raise CollectionError(
                grpc.StatusCode.DATA_LOSS,
                f"cannot open the {role.name.lower()}'s aggregate share of {count} reports: {e}"
                " (it must be sealed to this task file's collector key, for this task's DAP"
                " configuration and this very request)",
            ) from None

    def _bad(self, what: str) -> CollectionError:
        return CollectionError(
            grpc.StatusCode.INTERNAL, f"the DAP leader at {self.dap.leader_endpoint} {what}"
        )

    def _call(
        self,
        request: urllib.request.Request,
        deadline: float,
        waiting: _Waiting | None,
        polling: bool = False,
    ) -> tuple[int, dict[str, str], bytes]:
        """The leader's answer to `request`, sent again while the leader is
        unreachable or says to retry (503, 429) and the deadline allows;
        CollectionError for a refusal."""
        delay = 0.2
        while True:
            status, headers, body = self._urlopen(request)
            if 0 < status < 400:
                return status, headers, body
            error = self._refusal(status, body, polling)
            if status in (0, 429, 503) and self.clock() + delay < deadline:
                pause = delay * (0.5 + secrets.randbelow(1000) / 1000)
                if waiting is not None:
                    waiting.say(f"retrying: {error.message}", pause)
                time.sleep(pause)
                delay = min(delay * 2, 5.0)
                continue
            raise error

    def _refusal(self, status: int, body: bytes, polling: bool) -> CollectionError:
        where = f"the DAP leader at {self.dap.leader_endpoint}"
        if status == 0:
            return CollectionError(
                grpc.StatusCode.UNAVAILABLE,
                f"cannot reach {where}: {body.decode(errors='replace')}",
                retryable=True,
            )
        if status in (429, 503) or status >= 500:
            return CollectionError(
                grpc.StatusCode.UNAVAILABLE,
                f"{where} answered {status}",
                retryable=status in (429, 503),
            )
        code = _CODES.get(status, grpc.StatusCode.UNKNOWN)
        try:
            problem = Problem.from_json(body, status)
        except ValueError:
            detail = "the collector's token was refused" if status == 401 else "no DAP problem"
            return CollectionError(code, f"{where} answered {status} ({detail})")
        code = _PROBLEM_CODES.get(problem.type, code)
        text = f"{where} refused the collection: {problem.type.value}: {problem.detail}"
        if polling and problem.type is ProblemType.BATCH_INVALID:
            # The job ran and failed: veil's leader answers its poll so.
            return CollectionJobFailed(code, text)
        return CollectionError(code, text)

    def _urlopen(self, request: urllib.request.Request) -> tuple[int, dict[str, str], bytes]:
        """Sends `request`: status 0 with the reason as body when the leader
        cannot be reached."""
        try:
            with self._opener.open(request, timeout=self.timeout) as r:
                return r.status, _lower(r.headers.items()), r.read(MAX_ANSWER + 1)[:MAX_ANSWER]
        except urllib.error.HTTPError as e:
            return e.code, _lower(e.headers.items()), e.read(MAX_ANSWER)
        except (urllib.error.URLError, OSError) as e:
            return 0, {}, str(getattr(e, "reason", e)).encode()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _job_id(url: str) -> bytes | None:
    """The id of the collection job at `url`: its last segment, JOB_ID_SIZE
    bytes in unpadded base64url (veil's leader's; the draft's resource,
    `{leader}/tasks/{task-id}/collection_jobs/{collection-job-id}`); None
    for anything else."""
    text = url.rstrip("/").rsplit("/", 1)[-1]
    if not text.isascii():
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        return None
    return raw if len(raw) == JOB_ID_SIZE and _b64(raw) == text else None


def _lower(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {k.lower(): v for k, v in items}


def collector_for(
    task: CollectorTask, *, protocol: str | None = None, **options: Any
) -> Collector | DapCollector:
    """The collector of `task`: over DAP (`DapCollector`) for a task with a
    `[dap]` table, else veil's gRPC (`Collector`); `protocol` ("grpc" or
    "dap") chooses. `options` go to the collector's constructor."""
    chosen = protocol or ("dap" if task.dap is not None else "grpc")
    if chosen == "dap":
        return DapCollector(task, **options)
    if chosen == "grpc":
        return Collector(task, **options)
    raise ValueError(f"protocol must be 'grpc' or 'dap', not {protocol!r}")
