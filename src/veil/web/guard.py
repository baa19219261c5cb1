"""Who may hold a connection to `veil survey serve`, and for how long.

uvicorn's HTTP/1.1 protocol (h11) times a connection only between requests
(keep-alive) and caps connections for the server as a whole: a client that
opens a connection and sends nothing, or half a request, holds it for good,
and one address can fill every slot (the whole page then answers 503). So
the page is served through `GuardedH11Protocol`, uvicorn's own protocol with
a guard at the asyncio level, where a connection begins:

- a connection is counted from its TCP accept, before any byte or TLS
  handshake; one address (an IPv6 /64) may hold `max_per_address`, all
  together `max_connections`; beyond that it is answered 503 and closed at
  once, so it costs a moment and no slot;
- a whole request, headers and body, must arrive within `read_timeout` of
  the connection's start (TLS handshake included), or of its previous
  response; otherwise it is answered 408 (if it had begun) and closed. Data
  trickling in does not restart the clock;
- a request h11 cannot parse is answered 400 with the page's security
  headers, like every other response.

TLS is done here too (`loop.start_tls`), not by uvicorn: asyncio would
otherwise hold a connection up to 60 s in its handshake before the protocol
ever saw it. A reverse proxy named as trusted (`ServeLimits.proxy_header`)
is exempt from the per-address cap: every client comes through it.

Refusals, cut-offs and requests h11 could not parse are logged as counts,
at most one line a minute, without addresses: a flood of them cannot flood
the log.
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
import socket
import ssl
import time
from typing import Any, ClassVar

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from veil.web.app import SECURITY_HEADERS, ServeLimits, address_key

log = logging.getLogger("veil.web")

# Seconds a refused client is asked to wait (Retry-After).
RETRY_AFTER = 5
# Seconds between two log lines of counts.
REPORT_EVERY = 60.0


def raw_response(status: int, message: str, headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, with the page's
    security headers: for answers given outside the application."""
    body = json.dumps({"error": message}).encode()
    fields = {
        "content-type": "application/json",
        "content-length": str(len(body)),
        "connection": "close",
        "cache-control": "no-store",
        **{name.lower(): value for name, value in SECURITY_HEADERS.items()},
        **(headers or {}),
    }
    head = f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in fields.items()
    )
    return head.encode("latin-1") + b"\r\n" + body


class ConnectionGuard:
    """The counts of open connections, per address and in all, and of what
    was refused or cut off since the last log line."""

    def __init__(self, limits: ServeLimits, tls: ssl.SSLContext | None = None) -> None:
        self.limits = limits
        self.tls = tls
        self.open = 0
        self.per_address: dict[str, int] = {}
        self.refused_address = self.refused_total = self.cut_off = self.unreadable = 0
        self._reported = -REPORT_EVERY  # the first refusal is logged at once

    def admit(self, peer: str) -> str | None:
        """The slot a new connection from `peer` takes (release it when the
        connection ends), or None when it must be refused."""
        if self.open >= self.limits.max_connections:
            self.refused_total += 1
            self._report()
            return None
        # "" stands for a trusted proxy (no cap of its own); any other peer
        # has a key, "unknown" if it has no address.
        key = "" if self.limits.trusts(peer) else address_key(peer) or "unknown"
        if key and self.per_address.get(key, 0) >= self.limits.max_per_address:
            self.refused_address += 1
            self._report()
            return None
        self.open += 1
        if key:
            self.per_address[key] = self.per_address.get(key, 0) + 1
        return key

    def release(self, key: str) -> None:
        self.open -= 1
        if key:
            left = self.per_address[key] - 1
            if left:
                self.per_address[key] = left
            else:
                del self.per_address[key]

    def timed_out(self) -> None:
        self.cut_off += 1
        self._report()

    def not_http(self) -> None:
        self.unreadable += 1
        self._report()

    def _report(self) -> None:
        now = time.monotonic()
        if now - self._reported < REPORT_EVERY:
            return
        log.warning(
            "refused %d connections over %d from one address and %d over %d in all, cut off"
            " %d requests not complete within %g s, answered %d that were not HTTP/1.1 with"
            " 400 (since the previous such line)",
            self.refused_address,
            self.limits.max_per_address,
            self.refused_total,
            self.limits.max_connections,
            self.cut_off,
            self.limits.read_timeout,
            self.unreadable,
        )
        self._reported = now
        self.refused_address = self.refused_total = self.cut_off = self.unreadable = 0


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol behind a `ConnectionGuard` (see the module).
    `guarded_protocol` makes the subclass that names its guard."""

    guard: ClassVar[ConnectionGuard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slot: str | None = None
        self._raw: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._handshake: asyncio.Task[None] | None = None
        self._early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        peer = transport.get_extra_info("peername")
        slot = self.guard.admit(str(peer[0]) if peer else "")
        if slot is None:
            transport.write(
                raw_response(
                    503,
                    "too many connections; try again in a moment",
                    {"retry-after": str(RETRY_AFTER)},
                )
            )
            transport.close()
            return
        self._slot = slot
        self._raw = transport
        self._arm()
        if self.guard.tls is None:
            super().connection_made(transport)
        else:
            self._handshake = self.loop.create_task(self._start_tls(transport))

    async def _start_tls(self, raw: asyncio.Transport) -> None:
        assert self.guard.tls is not None
        try:
            tls = await self.loop.start_tls(
                raw,
                self,
                self.guard.tls,
                server_side=True,
                ssl_handshake_timeout=self.guard.limits.read_timeout,
            )
        except Exception:
            # A failed or abandoned handshake: asyncio has closed the socket.
            tls = None
        if tls is None or tls.is_closing():
            self._end()
            return
        super().connection_made(tls)
        # asyncio may hand over what followed the handshake before this
        # coroutine resumes: it waits in _early.
        early, self._early = b"".join(self._early), []
        if early:
            self.data_received(early)
        else:
            self._track()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._slot is None:
            return  # refused (or ended in its TLS handshake): uvicorn never saw it
        self._end()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.transport is None:  # TLS is up, but connection_made is still to come
            self._early.append(data)
            return
        super().data_received(data)
        self._track()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track()

    def send_400_response(self, msg: str) -> None:
        self.guard.not_http()
        self.transport.write(raw_response(400, f"not an HTTP/1.1 request this server reads: {msg}"))
        self.transport.close()

    def _end(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._slot is not None:
            self.guard.release(self._slot)
            self._slot = None

    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.guard.limits.read_timeout, self._expired)

    def _track(self) -> None:
        """The clock runs while a request is incomplete: from the connection's
        start, or its previous response, until the client's whole request."""
        if self.transport is None or self.transport.is_closing():
            return
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE):
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
        else:
            self._arm()

    def _expired(self) -> None:
        self._deadline = None
        if self.transport is None:  # still in its TLS handshake
            if self._raw is not None:
                self._raw.abort()
            return
        if self.transport.is_closing():
            return
        self.guard.timed_out()
        begun = self.conn.their_state is not h11.IDLE or bool(self.conn.trailing_data[0])
        cycle = self.cycle
        answering = cycle is not None and cycle.response_started and not cycle.response_complete
        if begun and not answering:
            self.transport.write(
                raw_response(
                    408,
                    f"the request did not arrive within {self.guard.limits.read_timeout:g} s",
                )
            )
        self.transport.close()


def guarded_protocol(guard: ConnectionGuard) -> type[GuardedH11Protocol]:
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"guard": guard})


def tls_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    """The page's server-side TLS: the default context (TLS 1.2 or later),
    HTTP/1.1 only. OSError or ssl.SSLError if the files do not load."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile, keyfile)
    context.set_alpn_protocols(["http/1.1"])
    return context


def serve(
    app: Any,
    listener: socket.socket,
    limits: ServeLimits,
    *,
    tls: ssl.SSLContext | None = None,
    log_level: str = "warning",
) -> None:
    """Run `app` on the bound `listener` under uvicorn, every connection
    guarded; returns when uvicorn stops (SIGINT, SIGTERM)."""
    config = uvicorn.Config(
        app,
        http=guarded_protocol(ConnectionGuard(limits, tls)),
        log_level=log_level,
        # Client addresses are the peers' own, or a trusted proxy's header
        # (read by the application only; see ServeLimits).
        proxy_headers=False,
        server_header=False,
        date_header=False,
        # The guard caps connections; uvicorn's own cap would answer 503
        # without the security headers.
        limit_concurrency=None,
        timeout_keep_alive=5,
    )
    # uvicorn logs a line for every request h11 cannot parse: counted in the
    # guard's line instead, so that garbage cannot flood the log.
    logging.getLogger("uvicorn.error").addFilter(_not_unreadable)
    uvicorn.Server(config).run(sockets=[listener])


def _not_unreadable(record: logging.LogRecord) -> bool:
    return record.msg != "Invalid HTTP request received."
