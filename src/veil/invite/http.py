"""The issuer's HTTP endpoint: ``POST /invitation``, in `veil survey serve`
(for the page) and alone in `veil survey issuer` (for CLI-only surveys).

Request (application/json, at most MAX_BODY bytes)::

    {"invitation": "<code>", "blinded": ["<base64url, 256 bytes>", ...]}

one blinded message per question, in the survey's question order. Answer:
``{"blind_signatures": [...]}`` in the same order, or ``{"error": "..."}``
with 400 (malformed), 403 (unknown or used invitation: "This invitation has
already been used."), 413 or 415. Nothing is stored for a refused request.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from veil.invite.issuer import Issuer, IssuerError

PATH = "/invitation"
MAX_BODY = 8 * 1024
_B64URL = re.compile(r"[A-Za-z0-9_-]*={0,2}")


def _b64(value: Any) -> bytes:
    if not isinstance(value, str) or not _B64URL.fullmatch(value) or len(value) > 1024:
        raise IssuerError("each blinded message must be base64url text")
    try:
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        raise IssuerError("each blinded message must be base64url text") from None


def parse_request(body: bytes) -> tuple[str, list[bytes]]:
    """(code, blinded messages) of a request body; raises IssuerError."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise IssuerError("the body is not JSON") from None
    if not isinstance(doc, dict) or set(doc) != {"invitation", "blinded"}:
        raise IssuerError('the body must be {"invitation": ..., "blinded": [...]}')
    code, blinded = doc["invitation"], doc["blinded"]
    if not isinstance(code, str):
        raise IssuerError("`invitation` must be text")
    if not isinstance(blinded, list) or len(blinded) > 256:
        raise IssuerError("`blinded` must be a list of base64url texts")
    return code, [_b64(b) for b in blinded]


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def read_json_body(request: Request, limit: int, what: str) -> bytes | Response:
    """The body of a JSON POST of at most `limit` bytes, or the error answer to send.

    `what` names the body in the 415 answer ("send {what} as application/json").
    """
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return _error(415, f"send {what} as application/json")
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        return _error(413, f"the body is larger than {limit} bytes")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                return _error(413, f"the body is larger than {limit} bytes")
    except ClientDisconnect:
        return _error(400, "the connection closed before the body was complete")
    return bytes(body)


def endpoint(issuer: Issuer) -> Callable[[Request], Awaitable[Response]]:
    """The Starlette handler of POST /invitation for `issuer`."""

    async def redeem(request: Request) -> Response:
        body = await read_json_body(request, MAX_BODY, "the request")
        if isinstance(body, Response):
            return body
        try:
            code, blinded = parse_request(body)
            sigs = await run_in_threadpool(issuer.redeem, code, blinded)
        except IssuerError as e:
            return _error(e.status, str(e))
        return JSONResponse(
            {"blind_signatures": [base64.urlsafe_b64encode(s).decode().rstrip("=") for s in sigs]}
        )

    return redeem
