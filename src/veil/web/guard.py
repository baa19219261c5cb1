"""Who may hold a connection to `veil survey serve`, and for how long.

uvicorn's HTTP/1.1 protocol (h11) times a connection only between requests
(keep-alive) and caps connections for the server as a whole: a client that
opens a connection and sends nothing, or half a request, holds it for good,
and one address can fill every slot (the whole page then answers 503). So
the page is served through `GuardedH11Protocol`, uvicorn's own protocol with
a guard at the asyncio level, where a connection begins:

- a connection is counted from its TCP accept, before any byte or TLS
  handshake; one address (an IPv6 /64) may hold `max_per_address`, beyond
  which it is answered 503 and closed at once, so it costs a moment and no
  slot. All together hold at most `max_connections` (by default sized from
  memory: `connection_cap`); a newcomer beyond that ends the connection
  whose incomplete request has waited longest (answered 503 if it had
  begun), as the gRPC side ends its oldest waiting call, so connections
  that never finish a request, from however many addresses, cannot keep a
  newcomer out; only when every connection has a whole request in hand is
  the newcomer refused;
- a request's headers must arrive within `header_timeout` of the
  connection's start (TLS handshake included), or of its previous response,
  and the whole request, body included, within `read_timeout`; otherwise it
  is answered 408 (if it had begun) and closed. Data trickling in does not
  restart the clock;
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
import resource
import socket
import ssl
import time
from pathlib import Path
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
# What one connection may cost beyond its request body: the protocol, h11's
# buffers, the transport and, under TLS, its buffers. Measured: 1,280
# connections each holding 30 KB of a body took 78 KiB each (48 KiB beyond
# what they had sent).
CONNECTION_OVERHEAD = 64 * 1024
# The share of the memory available at start that connections may take.
MEMORY_SHARE = 8
# File descriptors kept for everything else (the database, gRPC, logs).
FD_RESERVE = 256
MIN_CONNECTIONS = 64


def available_memory() -> int:
    """Bytes this process may still use: the system's MemAvailable, or less
    where a cgroup (v2) limits it; 1 GiB where neither can be read."""
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        current = Path("/sys/fs/cgroup/memory.current").read_text().strip()
        if limit != "max":
            found.append(max(0, int(limit) - int(current)))
    except (OSError, ValueError):
        pass
    return min(found) if found else 1 << 30


def connection_cap(max_body: int, memory: int | None = None, fds: int | None = None) -> int:
    """How many connections may be open at once when `--max-connections` is
    not given: an eighth of `memory` (default: what is available now) at
    `max_body` + CONNECTION_OVERHEAD each, and no more than the open-file
    limit (default: this process's soft RLIMIT_NOFILE) leaves after
    FD_RESERVE; at least MIN_CONNECTIONS."""
    if memory is None:
        memory = available_memory()
    if fds is None:
        fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if fds == resource.RLIM_INFINITY:
            fds = 1 << 20
    by_memory = memory // MEMORY_SHARE // (max_body + CONNECTION_OVERHEAD)
    return max(MIN_CONNECTIONS, min(by_memory, fds - FD_RESERVE))


def raise_fd_limit() -> None:
    """The soft open-file limit raised to the hard one (at most 2^20): each
    connection is a descriptor, and a default soft limit of 1024 would refuse
    connections long before memory runs short."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = min(hard, 1 << 20) if hard != resource.RLIM_INFINITY else 1 << 20
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError):
        pass


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
        self.max_connections = (
            limits.max_connections
            if limits.max_connections is not None
            else connection_cap(limits.max_body)
        )
        self.open = 0
        self.per_address: dict[str, int] = {}
        # The connections whose request is incomplete, the longest waiting
        # first (a dict keeps insertion order).
        self.waiting: dict[GuardedH11Protocol, None] = {}
        self.refused_address = self.refused_total = self.cut_off = self.unreadable = 0
        self.evicted = 0
        self._reported = -REPORT_EVERY  # the first refusal is logged at once

    def admit(self, peer: str) -> str | None:
        """The slot a new connection from `peer` takes (release it when the
        connection ends), or None when it must be refused. At the total cap
        the connection that has waited longest for its request is ended to
        make room, if there is one."""
        # "" stands for a trusted proxy (no cap of its own); any other peer
        # has a key, "unknown" if it has no address.
        key = "" if self.limits.trusts(peer) else address_key(peer) or "unknown"
        if key and self.per_address.get(key, 0) >= self.limits.max_per_address:
            self.refused_address += 1
            self._report()
            return None
        if self.open >= self.max_connections:
            victim = next(iter(self.waiting), None)
            if victim is None:
                self.refused_total += 1
                self._report()
                return None
            victim.evict()
            self.evicted += 1
            self._report()
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
            "refused %d connections over %d from one address and %d over %d in all, ended %d"
            " that had waited longest for newcomers, cut off %d requests not complete within"
            " %g s (their headers within %g s), answered %d that were not HTTP/1.1 with 400"
            " (since the previous such line)",
            self.refused_address,
            self.limits.max_per_address,
            self.refused_total,
            self.max_connections,
            self.evicted,
            self.cut_off,
            self.limits.read_timeout,
            self.limits.header_seconds,
            self.unreadable,
        )
        self._reported = now
        self.refused_address = self.refused_total = self.cut_off = self.unreadable = 0
        self.evicted = 0


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol behind a `ConnectionGuard` (see the module).
    `guarded_protocol` makes the subclass that names its guard."""

    guard: ClassVar[ConnectionGuard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slot: str | None = None
        self._seen = False  # uvicorn's protocol has the connection
        self._raw: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._started = 0.0  # when the current request's clock began
        self._body_clock = False  # the deadline is the whole request's, not the headers'
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
            self._seen = True
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
                ssl_handshake_timeout=self.guard.limits.header_seconds,
            )
        except Exception:
            # A failed or abandoned handshake: asyncio has closed the socket.
            tls = None
        if tls is None or tls.is_closing() or self._slot is None:
            self._end()
            if tls is not None and not tls.is_closing():
                tls.abort()  # ended for a newcomer during its handshake
            return
        self._seen = True
        super().connection_made(tls)
        # asyncio may hand over what followed the handshake before this
        # coroutine resumes: it waits in _early.
        early, self._early = b"".join(self._early), []
        if early:
            self.data_received(early)
        else:
            self._track()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()
        if self._seen:  # else refused, or ended in its TLS handshake: uvicorn never saw it
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
        self._disarm()
        if self._slot is not None:
            self.guard.release(self._slot)
            self._slot = None

    def _arm(self) -> None:
        """Start the clock of a request (the headers' deadline first), and
        count the connection as waiting, the newest."""
        if self._deadline is None:
            self._started = self.loop.time()
            self._body_clock = False
            self._deadline = self.loop.call_at(
                self._started + self.guard.limits.header_seconds, self._expired
            )
            self.guard.waiting[self] = None

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self.guard.waiting.pop(self, None)

    def _track(self) -> None:
        """The clock runs while a request is incomplete: from the connection's
        start, or its previous response, until the client's whole request;
        once the headers are in, the deadline is the whole request's."""
        if self.transport is None or self.transport.is_closing():
            return
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE):
            self._disarm()
            return
        self._arm()
        if self.conn.their_state is h11.SEND_BODY and not self._body_clock:
            self._body_clock = True
            assert self._deadline is not None
            self._deadline.cancel()
            self._deadline = self.loop.call_at(
                self._started + self.guard.limits.read_timeout, self._expired
            )

    def evict(self) -> None:
        """End this connection, whose request has waited longest, for a
        newcomer (the guard's cap is reached): 503 if the request had begun."""
        transport = self.transport
        self._end()
        if transport is None:  # still in its TLS handshake
            if self._raw is not None:
                self._raw.abort()
            return
        if transport.is_closing():
            return
        if self._begun() and not self._answering():
            transport.write(
                raw_response(
                    503,
                    "too many connections; try again in a moment",
                    {"retry-after": str(RETRY_AFTER)},
                )
            )
        transport.close()

    def _begun(self) -> bool:
        return self.conn.their_state is not h11.IDLE or bool(self.conn.trailing_data[0])

    def _answering(self) -> bool:
        cycle = self.cycle
        return cycle is not None and cycle.response_started and not cycle.response_complete

    def _expired(self) -> None:
        self._deadline = None
        self.guard.waiting.pop(self, None)
        if self.transport is None:  # still in its TLS handshake
            if self._raw is not None:
                self._raw.abort()
            return
        if self.transport.is_closing():
            return
        self.guard.timed_out()
        if self._begun() and not self._answering():
            limits = self.guard.limits
            message = (
                f"the request did not arrive within {limits.read_timeout:g} s"
                if self._body_clock
                else f"the request's headers did not arrive within {limits.header_seconds:g} s"
            )
            self.transport.write(raw_response(408, message))
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
    raise_fd_limit()
    # uvicorn logs a line for every request h11 cannot parse: counted in the
    # guard's line instead, so that garbage cannot flood the log.
    logging.getLogger("uvicorn.error").addFilter(_not_unreadable)
    uvicorn.Server(config).run(sockets=[listener])


def _not_unreadable(record: logging.LogRecord) -> bool:
    return record.msg != "Invalid HTTP request received."
