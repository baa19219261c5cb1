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

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from veil.aggregator.leader.dap import DapAbort, DapUnavailable, DapUploads
from veil.dap.messages import TASK_ID_SIZE
from veil.dap.problems import (
    PROBLEM_MEDIA_TYPE,
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


def problem_response(problem: Problem) -> Response:
    return Response(
        problem.to_json(),
        problem.status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers={"Cache-Control": "no-store"},
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


def dap_app(uploads: DapUploads, max_body: int) -> Starlette:
    """The leader's DAP routes over `uploads`; an upload's body may hold at
    most `max_body` bytes."""

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
            return problem_response(
                Problem(
                    ProblemType.UNRECOGNIZED_TASK,
                    "a task id is 32 bytes in unpadded base64url",
                    404,
                )
            )
        try:
            if message_of(request.headers.get("content-type")) != "upload-req":
                raise MediaTypeError(f"an upload is {media_type('upload-req')}")
        except MediaTypeError as e:
            return problem_response(Problem(ProblemType.INVALID_MESSAGE, str(e), 415, task_id))
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > max_body):
            return _too_large(task_id, max_body)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body:
                return _too_large(task_id, max_body)
        try:
            version, errors = await run_in_threadpool(uploads.upload, task_id, bytes(body))
        except DapAbort as e:
            return problem_response(e.problem)
        except DapUnavailable as e:
            return Response(
                str(e), 503, media_type="text/plain", headers={"Retry-After": str(RETRY_AFTER)}
            )
        if not errors.statuses:
            return Response(b"", 200)
        return Response(errors.encode(version), 200, media_type=media_type("upload-errors"))

    return Starlette(
        routes=[
            Route("/hpke_config", hpke_config, methods=["GET"]),
            Route("/tasks/{task_id}/reports", upload, methods=["POST"]),
        ]
    )


def _too_large(task_id: bytes, max_body: int) -> Response:
    return problem_response(
        Problem(
            ProblemType.INVALID_MESSAGE,
            f"an upload's body holds at most {max_body} bytes",
            413,
            task_id,
        )
    )
