"""DAP over HTTP at the leader (draft-ietf-ppm-dap sections 3 and 4.4): the
routes a DAP client uses, as a Starlette application, thin as the gRPC
services are (decode, call the logic, encode, map errors):

- ``GET /hpke_config``: the leader's HpkeConfigList;
- ``POST /tasks/{task-id}/reports``: an UploadRequest for a task served over
  DAP, answered with an empty body when every report was stored, or with
  UploadErrors naming the refused ones.

A request refused whole is answered with a problem document of DAP's
types (`veil.dap.problems`). Which connections may reach the routes (caps,
timeouts, TLS) is the listener's: `veil leader` serves this application
behind the survey page's connection guard (`veil.web.guard`), on the
`[dap] listen` address of its configuration.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import TypeVar

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from veil.aggregator.leader.dap import DapUnavailable, DapUploads
from veil.aggregator.leader.dap_collections import DapCollections
from veil.dap.messages import TASK_ID_SIZE
from veil.dap.problems import (
    PROBLEM_MEDIA_TYPE,
    DapAbort,
    DapUnauthorized,
    MediaTypeError,
    Problem,
    ProblemType,
    media_type,
    message_of,
)

# How long a client may keep the leader's HPKE configurations (the draft
# asks for caching; veil's keys rotate with a pending period, so short).
HPKE_CONFIG_MAX_AGE = 300
# Seconds a client is asked to wait before sending an upload again.
RETRY_AFTER = 5
# Seconds a collector is asked to wait between two polls of a collection job.
COLLECTION_RETRY_AFTER = 2

T = TypeVar("T")


def problem_response(problem: Problem) -> Response:
    return Response(
        problem.to_json(),
        problem.status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers={"Cache-Control": "no-store"},
    )


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header (RFC 6750
    section 2.1; the scheme's name is case-insensitive); None without one."""
    value = request.headers.get("authorization")
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


def unauthorized(detail: str) -> Response:
    # No DAP error type fits, and the draft keeps its URNs to its own
    # types: RFC 9457's about:blank with the status's title.
    body = {"type": "about:blank", "title": "Unauthorized", "status": 401, "detail": detail}
    return Response(
        json.dumps(body, separators=(",", ":")).encode(),
        401,
        media_type=PROBLEM_MEDIA_TYPE,
        headers={"WWW-Authenticate": "Bearer", "Cache-Control": "no-store"},
    )


def task_id_of(text: str) -> bytes | None:
    """A task id from its URL form (base64url without padding, section 3);
    None for anything else."""
    if len(text) != 43 or not text.isascii():
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=")
    except (binascii.Error, ValueError):
        return None
    if len(raw) != TASK_ID_SIZE or base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != text:
        return None
    return raw


def dap_app(
    uploads: DapUploads, max_body: int, collections: DapCollections | None = None
) -> Starlette:
    """The leader's DAP routes over `uploads` (and `collections`, the
    collector's routes); a request's body may hold at most `max_body`
    bytes."""

    async def hpke_config(request: Request) -> Response:
        body = await run_in_threadpool(uploads.hpke_config_list)
        return Response(
            body,
            media_type=media_type("hpke-config-list"),
            headers={"Cache-Control": f"max-age={HPKE_CONFIG_MAX_AGE}"},
        )

    async def upload(request: Request) -> Response:
        task_id = task_id_of(request.path_params["task_id"])
        if task_id is None:
            return _unknown_task()
        try:
            body = await read_message(request, task_id, "upload-req", max_body, "an upload is")
            version, errors = await run_in_threadpool(uploads.upload, task_id, body)
        except DapAbort as e:
            return problem_response(e.problem)
        except DapUnavailable as e:
            return _unavailable(e)
        if not errors.statuses:
            return Response(b"", 200)
        return Response(errors.encode(version), 200, media_type=media_type("upload-errors"))

    async def create_collection(request: Request) -> Response:
        assert collections is not None
        task_id = task_id_of(request.path_params["task_id"])
        if task_id is None:
            return _unknown_task()
        try:
            body = await read_message(
                request, task_id, "collection-job-req", max_body, "a collection job is"
            )
        except DapAbort as e:
            return problem_response(e.problem)
        job = await _collector_call(collections.create, task_id, bearer_token(request), body)
        if isinstance(job, Response):
            return job
        root = request.scope.get("root_path", "")
        where = f"{root}/tasks/{_b64(task_id)}/collection_jobs/{_b64(job)}"
        # Deferred (section 3.1): the collector polls the job's location.
        return Response(
            b"", 201, headers={"Location": where, "Retry-After": str(COLLECTION_RETRY_AFTER)}
        )

    async def poll_collection(request: Request) -> Response:
        assert collections is not None
        job = _collection_job_of(request)
        if isinstance(job, Response):
            return job
        task_id, job_id = job
        answer = await _collector_call(collections.poll, task_id, bearer_token(request), job_id)
        if isinstance(answer, Response):
            return answer
        if answer is None:
            return Response(b"", 200, headers={"Retry-After": str(COLLECTION_RETRY_AFTER)})
        return Response(answer, 200, media_type=media_type("collection-job-resp"))

    async def delete_collection(request: Request) -> Response:
        assert collections is not None
        job = _collection_job_of(request)
        if isinstance(job, Response):
            return job
        task_id, job_id = job
        refused = await _collector_call(collections.delete, task_id, bearer_token(request), job_id)
        if isinstance(refused, Response):
            return refused
        return Response(b"", 200)

    routes = [
        Route("/hpke_config", hpke_config, methods=["GET"]),
        Route("/tasks/{task_id}/reports", upload, methods=["POST"]),
    ]
    if collections is not None:
        routes += [
            Route("/tasks/{task_id}/collection_jobs", create_collection, methods=["POST"]),
            Route("/tasks/{task_id}/collection_jobs/{job_id}", poll_collection, methods=["GET"]),
            Route(
                "/tasks/{task_id}/collection_jobs/{job_id}",
                delete_collection,
                methods=["DELETE"],
            ),
        ]
    return Starlette(routes=routes)


async def read_message(
    request: Request, task_id: bytes, message: str, max_body: int, what: str = "this route takes"
) -> bytes:
    """The request's body, the DAP `message` its media type names, of at most
    `max_body` bytes; otherwise DapAbort with the draft's invalidMessage, 415
    for another media type ("{what} {media type}"), 413 for a larger body (its
    declared length checked before anything is read)."""
    try:
        if message_of(request.headers.get("content-type")) != message:
            raise MediaTypeError(f"{what} {media_type(message)}")
    except MediaTypeError as e:
        raise DapAbort(Problem(ProblemType.INVALID_MESSAGE, str(e), 415, task_id)) from None
    too_large = DapAbort(
        Problem(
            ProblemType.INVALID_MESSAGE,
            f"a request's body holds at most {max_body} bytes",
            413,
            task_id,
        )
    )
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > max_body):
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_body:
            raise too_large
    return bytes(body)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _id16(text: str) -> bytes | None:
    """A 16-byte id from its URL form (unpadded base64url); None otherwise."""
    if len(text) != 22 or not text.isascii():
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "==")
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == 16 and _b64(raw) == text else None


def _collection_job_of(request: Request) -> tuple[bytes, bytes] | Response:
    """The task id and collection job id of a collection job's URL, or the
    problem response refusing it."""
    task_id = task_id_of(request.path_params["task_id"])
    if task_id is None:
        return _unknown_task()
    job = _id16(request.path_params["job_id"])
    if job is None:
        return problem_response(
            Problem(ProblemType.INVALID_MESSAGE, "no collection job of that id", 404, task_id)
        )
    return task_id, job


async def _collector_call(
    call: Callable[[bytes, str | None, bytes], T], task_id: bytes, token: str | None, arg: bytes
) -> T | Response:
    """`call(task_id, token, arg)` run off the event loop: its answer, or
    the response its refusal maps to (a problem document, 401, or 503)."""
    try:
        return await run_in_threadpool(call, task_id, token, arg)
    except DapAbort as e:
        return problem_response(e.problem)
    except DapUnauthorized as e:
        return unauthorized(str(e))
    except DapUnavailable as e:
        return _unavailable(e)


def _unknown_task() -> Response:
    return problem_response(
        Problem(ProblemType.UNRECOGNIZED_TASK, "a task id is 32 bytes in unpadded base64url", 404)
    )


def _unavailable(e: Exception) -> Response:
    return Response(str(e), 503, media_type="text/plain", headers={"Retry-After": str(RETRY_AFTER)})
