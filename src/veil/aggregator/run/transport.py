"""The aggregators' gRPC server, where a call waiting for its request costs no thread.

gRPC's synchronous server gives each call one of its worker threads as soon
as the call's headers arrive, and the thread then waits for the request for
as long as the client likes: eight calls that never sent a body stalled a
leader or a helper, health checks included (issue 26). Here calls run on an
asyncio gRPC server (grpc.aio) on one event-loop thread:

- a call waiting for its request is a coroutine, a few kilobytes; a servicer
  method runs only once its whole request has arrived, in a bounded pool of
  `workers` threads, where storage and VDAF work may block;
- the request must arrive within `receive_seconds` of the headers, or the
  call ends with DEADLINE_EXCEEDED (RequestTimeout, retryable);
- at most `max_waiting_calls` calls wait for their requests at once; one
  more ends the call that has waited longest (UNAVAILABLE, TooManyWaiting,
  retryable). Idle calls cost bounded memory, and a newcomer is never
  refused for them: an honest call's request follows its headers at once;
- at most `max_queued_calls` calls whose request has arrived wait for a
  worker thread; one more is refused at once (UNAVAILABLE, Busy, retryable)
  and its request dropped, so that requests held in memory are bounded by
  workers + max_queued_calls, however many clients send at once;
- a call that needs a token is refused from its metadata, before its request
  is read, when the token is no served task's (UNAUTHENTICATED);
- each connection carries at most `max_calls_per_connection` calls at once
  (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS), is pinged when silent, closed
  when idle, and asked to reconnect when old (gRPC core's own limits).

There is deliberately no limit per client address: respondents behind one
NAT, or every browser respondent through the survey page's one connection,
share an address, and a cap on it would let one of them lock out the rest.

Servicer methods stay synchronous and see a `CallContext`: the part of
grpc.ServicerContext they use (metadata, peer, trailing metadata, abort).
docs/reports/RELIABILITY.md gives the measurements behind these choices.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from veil.aggregator.errors import (
    AggregatorError,
    Busy,
    RequestTimeout,
    TooManyWaiting,
    Unavailable,
)
from veil.grpc_util import ERROR_KIND_KEY, RETRY_AFTER_KEY, RETRYABLE_KEY

log = logging.getLogger(__name__)

T = TypeVar("T")
Metadata = tuple[tuple[str, str | bytes], ...]

# Each default once: the dataclass, the config reader and the docs agree.
DEFAULT_RECEIVE_SECONDS = 30.0
DEFAULT_MAX_WAITING_CALLS = 1000
DEFAULT_MAX_CALLS_PER_CONNECTION = 100
DEFAULT_IDLE_SECONDS = 300.0
DEFAULT_MAX_AGE_SECONDS = 3600.0
DEFAULT_KEEPALIVE_SECONDS = 60.0
DEFAULT_WORKERS = 8
DEFAULT_MAX_QUEUED_CALLS = 16
# A connection past its age gets this long to finish its calls before it is
# closed; a peer that does not answer a keepalive ping in this long is gone;
# a connection must finish its TLS and HTTP/2 handshake in this long.
AGE_GRACE_SECONDS = 120.0
KEEPALIVE_TIMEOUT_SECONDS = 20.0
HANDSHAKE_SECONDS = 10.0


@dataclass(frozen=True)
class ConnectionLimits:
    """What one idle or slow client can hold of a server (`[connections]`)."""

    receive_seconds: float = DEFAULT_RECEIVE_SECONDS
    max_waiting_calls: int = DEFAULT_MAX_WAITING_CALLS
    max_calls_per_connection: int = DEFAULT_MAX_CALLS_PER_CONNECTION
    idle_seconds: float = DEFAULT_IDLE_SECONDS
    max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS
    keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS
    workers: int = DEFAULT_WORKERS
    max_queued_calls: int = DEFAULT_MAX_QUEUED_CALLS

    def grpc_options(self) -> list[tuple[str, int]]:
        """gRPC core's channel arguments for the per-connection limits."""

        def ms(seconds: float) -> int:
            return max(1, round(seconds * 1000))

        return [
            ("grpc.max_concurrent_streams", self.max_calls_per_connection),
            ("grpc.max_connection_idle_ms", ms(self.idle_seconds)),
            ("grpc.max_connection_age_ms", ms(self.max_age_seconds)),
            ("grpc.max_connection_age_grace_ms", ms(AGE_GRACE_SECONDS)),
            ("grpc.keepalive_time_ms", ms(self.keepalive_seconds)),
            ("grpc.keepalive_timeout_ms", ms(KEEPALIVE_TIMEOUT_SECONDS)),
            # Keep pinging a connection whose calls are all waiting (by
            # default the server stops after two pings without data).
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.server_handshake_timeout_ms", ms(HANDSHAKE_SECONDS)),
        ]


class Refused(Exception):
    """End the call with this status (what `CallContext.abort` raises)."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: Metadata = ()) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.trailing = trailing


def refusal(error: AggregatorError) -> Refused:
    """`error` as a call's end: its status and message, and its kind, whether
    to retry and any advised wait in the trailing metadata (read back by
    veil.aggregator.errors.from_peer and veil.grpc_util.RpcRefused)."""
    trailing = [(ERROR_KIND_KEY, error.kind), (RETRYABLE_KEY, "1" if error.retryable else "0")]
    if error.retry_after is not None:
        trailing.append((RETRY_AFTER_KEY, str(round(error.retry_after * 1000))))
    return Refused(grpc.StatusCode[error.status], str(error), tuple(trailing))


class CallContext:
    """What a synchronous servicer method sees of its call: the methods of
    grpc.ServicerContext that veil's services use."""

    def __init__(self, metadata: Metadata, peer: str, time_remaining: float | None) -> None:
        self._metadata = metadata
        self._peer = peer
        self._deadline = None if time_remaining is None else time.monotonic() + time_remaining
        self.trailing: Metadata = ()

    def invocation_metadata(self) -> Metadata:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def set_trailing_metadata(self, metadata: Metadata) -> None:
        self.trailing = tuple(metadata)

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise Refused(code, details, self.trailing)


@dataclass(frozen=True)
class UnaryMethod:
    """A synchronous unary method: request bytes in, response bytes out.

    `check_metadata` runs before the request is read, on the event loop (it
    must not block), and raises Refused to end the call there."""

    call: Callable[[bytes, CallContext], bytes]
    check_metadata: Callable[[Metadata], None] | None = None


class RpcServer:
    """An asyncio gRPC server on an event-loop thread of its own, serving
    synchronous methods in a pool of `limits.workers` threads, with the
    standard health service. Its methods are called from other threads."""

    def __init__(
        self,
        options: Sequence[tuple[str, int]] = (),
        limits: ConnectionLimits | None = None,
        on_unread: Callable[[str], None] | None = None,
    ) -> None:
        """`on_unread(reason)` is told of each call ended before its request
        was read ("receive_timeout", "too_many_waiting" or "unauthenticated"),
        or read and dropped unserved ("busy")."""
        self.limits = limits or ConnectionLimits()
        self._on_unread = on_unread
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rpc-loop", daemon=True)
        self._thread.start()
        self.executor = ThreadPoolExecutor(self.limits.workers, thread_name_prefix="rpc")
        # Calls waiting for their requests, oldest first (event-loop thread only).
        self._waiting: dict[object, asyncio.Timeout] = {}
        # Calls whose request has arrived: running in a worker or queued for
        # one (event-loop thread only).
        self._received = 0
        self._evicted: set[object] = set()
        self._stopping = False
        all_options = [*options, *self.limits.grpc_options()]
        self._server, self.health = self._run(self._create(all_options))
        self._add_health()

    async def _create(self, options: list[tuple[str, int]]) -> tuple[Any, Any]:
        # Both belong to the loop they are made on.
        return grpc.aio.server(options=options), health_aio.HealthServicer()

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    @property
    def waiting(self) -> int:
        """Calls now waiting for their requests."""
        return len(self._waiting)

    @property
    def received(self) -> int:
        """Calls whose requests have arrived: running in a worker or queued for one."""
        return self._received

    def add_insecure_port(self, address: str) -> int:
        return int(self._server.add_insecure_port(address))

    def add_secure_port(self, address: str, credentials: grpc.ServerCredentials) -> int:
        return int(self._server.add_secure_port(address, credentials))

    def start(self) -> None:
        self._run(self._server.start())

    def set_serving(self, *services: str) -> None:
        for name in services:
            self._run(self.health.set(name, health_pb2.HealthCheckResponse.SERVING))

    def stop(self, grace: float | None) -> None:
        """Say NOT_SERVING, refuse new calls, end the calls still waiting for
        their requests (UNAVAILABLE, retryable: they would only hold the stop
        up), give calls in flight `grace` seconds, then end the loop and the
        worker threads (work not started is dropped; work running finishes
        its step)."""
        if not self._loop.is_running():
            return
        self._run(self.health.enter_graceful_shutdown())
        self._run(self._stop(grace))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self.executor.shutdown(wait=True, cancel_futures=True)

    async def _stop(self, grace: float | None) -> None:
        stopped = asyncio.ensure_future(self._server.stop(grace))
        await asyncio.sleep(0)  # new calls are refused from here on
        self._stopping = True
        for timeout in self._waiting.values():
            if not timeout.expired():
                timeout.reschedule(self._loop.time())
        await stopped

    def add_unary_service(self, service: str, methods: Mapping[str, UnaryMethod]) -> None:
        """Serve `methods` (by name) as the unary methods of `service` (its full name)."""
        handlers = {
            # A stream-unary handler runs at the call's headers and reads the
            # request itself, so that it can check the metadata first and
            # bound the wait; on the wire a unary call is the same.
            name: grpc.stream_unary_rpc_method_handler(self._unary(method))
            for name, method in methods.items()
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, handlers),)
        )

    def _unary(self, method: UnaryMethod) -> Callable[[Any, Any], Awaitable[bytes]]:
        async def handle(requests: Any, context: Any) -> bytes:
            metadata: Metadata = tuple(context.invocation_metadata() or ())
            call = CallContext(metadata, context.peer(), context.time_remaining())
            try:
                if method.check_metadata is not None:
                    try:
                        method.check_metadata(metadata)
                    except Refused:
                        self._count_unread("unauthenticated")
                        raise
                request = await self._receive(context)
                if self._received >= self.limits.workers + self.limits.max_queued_calls:
                    self._count_unread("busy")
                    raise refusal(
                        Busy(
                            "the server has as many calls queued for its workers as it"
                            " holds; nothing was done: retry"
                        )
                    )
                self._received += 1
                try:
                    response = await self._loop.run_in_executor(
                        self.executor, method.call, request, call
                    )
                finally:
                    self._received -= 1
            except Refused as r:
                await context.abort(r.code, r.details, r.trailing)
                raise AssertionError("abort returned") from None
            if call.trailing:
                context.set_trailing_metadata(call.trailing)
            return response

        return handle

    async def _receive(self, context: Any) -> bytes:
        """The call's request, once it has arrived: within receive_seconds,
        unless max_waiting_calls newer calls come first."""
        key = object()
        try:
            async with asyncio.timeout(self.limits.receive_seconds) as timeout:
                self._waiting[key] = timeout
                if len(self._waiting) > self.limits.max_waiting_calls:
                    self._evict_oldest()
                message = await context.read()
        except TimeoutError:
            if self._stopping:
                raise refusal(Unavailable("the server is shutting down; retry")) from None
            if key in self._evicted:
                self._count_unread("too_many_waiting")
                raise refusal(
                    TooManyWaiting(
                        f"more than {self.limits.max_waiting_calls} calls were waiting for"
                        " their requests and this one had waited longest; retry"
                    )
                ) from None
            self._count_unread("receive_timeout")
            raise refusal(
                RequestTimeout(
                    f"the request did not arrive within {self.limits.receive_seconds:g} s"
                    " of the call's headers"
                )
            ) from None
        finally:
            self._waiting.pop(key, None)
            self._evicted.discard(key)
        if not isinstance(message, bytes):  # grpc.aio.EOF: the client sent none
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "the call ended without a request")
        return message

    def _evict_oldest(self) -> None:
        for key, timeout in list(self._waiting.items()):
            del self._waiting[key]
            try:
                # Expire it now: its wait ends with TimeoutError on the next turn.
                timeout.reschedule(self._loop.time())
            except RuntimeError:
                continue  # already expiring on its own; try the next
            self._evicted.add(key)
            return

    def _count_unread(self, reason: str) -> None:
        if self._on_unread is not None:
            self._on_unread(reason)

    def _add_health(self) -> None:
        """The standard health service (grpc.health.v1), its requests read
        under the same limits as every other call's."""
        health = self.health
        decode = health_pb2.HealthCheckRequest.FromString
        encode = health_pb2.HealthCheckResponse.SerializeToString

        async def request(context: Any) -> Any:
            try:
                raw = await self._receive(context)
                return decode(raw)
            except Refused as r:
                await context.abort(r.code, r.details, r.trailing)
            except DecodeError:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed health check")
            raise AssertionError("abort returned")

        async def check(requests: Any, context: Any) -> Any:
            return await health.Check(await request(context), context)

        async def watch(requests: Any, context: Any) -> None:
            await health.Watch(await request(context), context)

        handlers = {
            "Check": grpc.stream_unary_rpc_method_handler(check, response_serializer=encode),
            "Watch": grpc.stream_stream_rpc_method_handler(watch, response_serializer=encode),
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("grpc.health.v1.Health", handlers),)
        )
