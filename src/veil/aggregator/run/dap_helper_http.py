"""DAP over HTTP at the helper (draft-ietf-ppm-dap sections 4.5 and 4.6,
helper side): the routes a DAP leader uses, as a Starlette application,
thin as the gRPC services are (decode, call the logic in
`veil.aggregator.helper.dap`, encode, map errors):

- ``GET /hpke_config``: the helper's HpkeConfigList;
- ``POST /tasks/{task-id}/aggregation_jobs`` with an AggregationJobInitReq:
  the job is created, run and answered at once (an AggregationJobResp, the
  job's location in ``Location``);
- ``GET /tasks/{task-id}/aggregation_jobs/{job-id}?step=0``: the same
  answer again; ``POST`` there, an AggregationJobContinueReq, is refused
  (Prio3 verifies in one round); ``DELETE`` keeps what replay checks need;
- ``POST /tasks/{task-id}/aggregate_shares`` with an AggregateShareReq: the
  AggregateShare, its location in ``Location``; ``GET`` of that location
  serves it again, ``DELETE`` keeps it.

Every request but the HPKE configuration's carries the task's aggregator
token as ``Authorization: Bearer TOKEN`` (section 3.4); a request without it
is answered 401 before its body is read. Which connections may reach the
routes is the listener's (`veil helper` runs them behind the survey page's
connection guard, on its `[dap] listen` address), as at the leader.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from veil.aggregator.helper.dap import (
    RESOURCE_ID_SIZE,
    DapHelper,
    DapRetry,
)
from veil.aggregator.run.dap_http import (
    HPKE_CONFIG_MAX_AGE,
    RETRY_AFTER,
    bearer_token,
    problem_response,
    read_message,
    task_id_of,
    unauthorized,
)
from veil.dap.problems import (
    DapAbort,
    DapUnauthorized,
    Problem,
    ProblemType,
    media_type,
)

Handler = Callable[[Request], Awaitable[Response]]


def resource_id_of(text: str) -> bytes | None:
    """An aggregation job's or aggregate share's id from its URL form
    (16 bytes in unpadded base64url); None for anything else."""
    if len(text) != 22 or not text.isascii():
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "==")
    except (binascii.Error, ValueError):
        return None
    if len(raw) != RESOURCE_ID_SIZE or _b64(raw) != text:
        return None
    return raw


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _answer(call: Handler) -> Handler:
    """Map the logic's refusals to their answers."""

    async def handler(request: Request) -> Response:
        try:
            return await call(request)
        except DapAbort as e:
            return problem_response(e.problem)
        except DapUnauthorized as e:
            return unauthorized(str(e))
        except DapRetry as e:
            return Response(
                str(e), 503, media_type="text/plain", headers={"Retry-After": str(RETRY_AFTER)}
            )

    return handler


def dap_helper_app(helper: DapHelper, max_body: int) -> Starlette:
    """The helper's DAP routes over `helper`; a request's body may hold at
    most `max_body` bytes."""

    async def task_of(request: Request) -> tuple[bytes, str | None]:
        """The task id of the path and the request's token, checked."""
        task_id = task_id_of(request.path_params["task_id"])
        if task_id is None:
            raise DapAbort(
                Problem(
                    ProblemType.UNRECOGNIZED_TASK,
                    "a task id is 32 bytes in unpadded base64url",
                    404,
                )
            )
        token = bearer_token(request)
        await run_in_threadpool(helper.context, task_id, token)
        return task_id, token

    def resource_of(request: Request, task_id: bytes, name: str) -> bytes:
        raw = resource_id_of(request.path_params[name])
        if raw is None:
            kind = (
                ProblemType.UNRECOGNIZED_AGGREGATION_JOB
                if name == "job_id"
                else ProblemType.INVALID_MESSAGE
            )
            raise DapAbort(Problem(kind, "an id is 16 bytes in unpadded base64url", 404, task_id))
        return raw

    async def body_of(request: Request, task_id: bytes, message: str) -> bytes:
        """The request's body, a DAP `message` of at most `max_body` bytes."""
        return await read_message(request, task_id, message, max_body)

    def location(request: Request, task_id: bytes, kind: str, raw: bytes) -> str:
        return f"{request.scope.get('root_path', '')}/tasks/{_b64(task_id)}/{kind}/{_b64(raw)}"

    async def hpke_config(request: Request) -> Response:
        body = await run_in_threadpool(helper.hpke_config_list)
        return Response(
            body,
            media_type=media_type("hpke-config-list"),
            headers={"Cache-Control": f"max-age={HPKE_CONFIG_MAX_AGE}"},
        )

    @_answer
    async def create_job(request: Request) -> Response:
        task_id, token = await task_of(request)
        body = await body_of(request, task_id, "aggregation-job-init-req")
        job_id, _, answer = await run_in_threadpool(helper.init_job, task_id, token, body)
        return Response(
            answer,
            200,
            media_type=media_type("aggregation-job-resp"),
            headers={"Location": location(request, task_id, "aggregation_jobs", job_id)},
        )

    @_answer
    async def poll_job(request: Request) -> Response:
        task_id, token = await task_of(request)
        job_id = resource_of(request, task_id, "job_id")
        step = request.query_params.get("step")
        _, answer = await run_in_threadpool(helper.poll_job, task_id, token, job_id, step)
        return Response(answer, 200, media_type=media_type("aggregation-job-resp"))

    @_answer
    async def continue_job(request: Request) -> Response:
        task_id, token = await task_of(request)
        job_id = resource_of(request, task_id, "job_id")
        body = await body_of(request, task_id, "aggregation-job-continue-req")
        await run_in_threadpool(helper.continue_job, task_id, token, job_id, body)
        raise AssertionError("a continuation is always refused")  # pragma: no cover

    @_answer
    async def delete_job(request: Request) -> Response:
        # Deleting a job keeps what replay and double-collection checks
        # need (section 4.5.4), which is all a finished Prio3 job holds.
        task_id, token = await task_of(request)
        job_id = resource_of(request, task_id, "job_id")
        await run_in_threadpool(helper.job_known, task_id, token, job_id)
        return Response(b"", 200)

    @_answer
    async def create_share(request: Request) -> Response:
        task_id, token = await task_of(request)
        body = await body_of(request, task_id, "aggregate-share-req")
        share_id, answer = await run_in_threadpool(helper.aggregate_share, task_id, token, body)
        return Response(
            answer,
            200,
            media_type=media_type("aggregate-share"),
            headers={"Location": location(request, task_id, "aggregate_shares", share_id)},
        )

    @_answer
    async def get_share(request: Request) -> Response:
        task_id, token = await task_of(request)
        share_id = resource_of(request, task_id, "share_id")
        answer = await run_in_threadpool(helper.stored_share, task_id, token, share_id)
        return Response(answer, 200, media_type=media_type("aggregate-share"))

    @_answer
    async def delete_share(request: Request) -> Response:
        # The released share stays: it is what a retried request gets, and
        # the batch stays collected (section 4.6.5).
        task_id, token = await task_of(request)
        share_id = resource_of(request, task_id, "share_id")
        await run_in_threadpool(helper.stored_share, task_id, token, share_id)
        return Response(b"", 200)

    tasks = "/tasks/{task_id}"
    return Starlette(
        routes=[
            Route("/hpke_config", hpke_config, methods=["GET"]),
            Route(f"{tasks}/aggregation_jobs", create_job, methods=["POST"]),
            Route(f"{tasks}/aggregation_jobs/{{job_id}}", poll_job, methods=["GET"]),
            Route(f"{tasks}/aggregation_jobs/{{job_id}}", continue_job, methods=["POST"]),
            Route(f"{tasks}/aggregation_jobs/{{job_id}}", delete_job, methods=["DELETE"]),
            Route(f"{tasks}/aggregate_shares", create_share, methods=["POST"]),
            Route(f"{tasks}/aggregate_shares/{{share_id}}", get_share, methods=["GET"]),
            Route(f"{tasks}/aggregate_shares/{{share_id}}", delete_share, methods=["DELETE"]),
        ]
    )
