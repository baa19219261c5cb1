"""The issuer's HTTP endpoint: ``POST /invitation``, in `veil survey serve`
(for the page) and alone in `veil survey issuer` (for CLI-only surveys).

Request (application/json, at most MAX_BODY bytes)::

    {"invitation": "<code>", "blinded": ["<base64url, 256 bytes>", ...]}

one blinded message per question, in the survey's question order. Answer:
``{"blind_signatures": [...]}`` in the same order, or ``{"error": "..."}``
with 400 (malformed), 403 (unknown or used invitation: "This invitation has
already been used."), 413, 415, 429 (too many refused invitations from this
address, with Retry-After) or 503 (the issuer could not record the
redemption: nothing was used, send the same request again). Nothing is
stored for a refused request.

Refused redemptions (403) are limited per client address, a token bucket of
FAILURES_BURST refusals refilled at FAILURES_PER_MINUTE: guessing codes
(128 random bits) cannot succeed anyway, but a guesser's stream of 403s
would otherwise fill the logs and metrics. An address out of refusals is
answered 429 before its code is looked up, so behind one address (a NAT) a
respondent waits out someone else's guesses.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from veil.invite.issuer import Issuer, IssuerError

PATH = "/invitation"
MAX_BODY = 8 * 1024
FAILURES_BURST = 10
FAILURES_PER_MINUTE = 10
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


class FailureLimit:
    """Refused redemptions per client address: a token bucket each, of
    `burst` refusals refilled at `per_minute`. Memory is bounded: past
    MAX_TRACKED addresses, those whose buckets are full again are dropped
    (and if none is, all are: the limit errs towards letting requests in)."""

    MAX_TRACKED = 100_000

    def __init__(
        self,
        burst: int = FAILURES_BURST,
        per_minute: float = FAILURES_PER_MINUTE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = float(burst)
        self.refill = per_minute / 60.0
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def _tokens(self, key: str, now: float) -> float:
        tokens, last = self._buckets.get(key, (self.burst, now))
        return min(self.burst, tokens + (now - last) * self.refill)

    def retry_after(self, key: str) -> int | None:
        """None if `key` may try a code now, else the whole seconds to wait."""
        tokens = self._tokens(key, self.clock())
        if tokens >= 1.0:
            return None
        return max(1, math.ceil((1.0 - tokens) / self.refill))

    def refused(self, key: str) -> None:
        now = self.clock()
        if key not in self._buckets and len(self._buckets) >= self.MAX_TRACKED:
            full = [k for k in self._buckets if self._tokens(k, now) >= self.burst]
            for k in full or list(self._buckets):
                del self._buckets[k]
        self._buckets[key] = (max(0.0, self._tokens(key, now) - 1.0), now)


def _peer(request: Request) -> str:
    return request.client.host if request.client else ""


def endpoint(
    issuer: Issuer,
    address: Callable[[Request], str] = _peer,
    limit: FailureLimit | None = None,
) -> Callable[[Request], Awaitable[Response]]:
    """The Starlette handler of POST /invitation for `issuer`; `address`
    names the client a request comes from (the page's own rule behind a
    proxy), `limit` bounds its refused redemptions."""
    failures = limit if limit is not None else FailureLimit()

    async def redeem(request: Request) -> Response:
        try:
            client = address(request)
        except ValueError as e:  # a trusted proxy's header names no client
            return _error(400, str(e))
        wait = failures.retry_after(client)
        if wait is not None:
            response = _error(
                429,
                f"too many invalid or used invitations from this address; try again in {wait} s",
            )
            response.headers["Retry-After"] = str(wait)
            return response
        body = await read_json_body(request, MAX_BODY, "the request")
        if isinstance(body, Response):
            return body
        try:
            code, blinded = parse_request(body)
            sigs = await run_in_threadpool(issuer.redeem, code, blinded)
        except IssuerError as e:
            if e.status == 403:
                failures.refused(client)
            return _error(e.status, str(e))
        return JSONResponse(
            {"blind_signatures": [base64.urlsafe_b64encode(s).decode().rstrip("=") for s in sigs]}
        )

    return redeem
