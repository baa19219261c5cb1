"""How an `AsyncClient` reaches the aggregators and where its work runs.

The grpc.aio channels to the leader and the helper (opened on first use,
inside the running loop: grpc.aio binds a channel to the loop it is created
in), a blocking channel to the leader for the requests a worker thread
sends itself (`veil.client.gather`), each call retried by the client's
policy, and the pool of threads that shards, seals and writes the outbox
off the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, TypeVar

import grpc

from veil.client.base import ClientBase, ClientOptions, UploadResult
from veil.client.retry import UploadError
from veil.grpc_util import open_aio_channel, open_channel
from veil.messages import Report
from veil.messages.wire import upload_request
from veil.protocol.v1 import helper_pb2_grpc, leader_pb2_grpc

# Retries are logged as the AsyncClient's (the logger an application sets up for it).
log = logging.getLogger("veil.client.aio")

T = TypeVar("T")

_UNREADABLE = "the server's answer is not the message its method returns"


class AioTransport:
    """The channels, the retries and the worker threads of one AsyncClient.

    `executor`: where the CPU-bound work runs; None: a pool of `workers`
    threads (default: the number of CPUs, at most 4) owned here and shut
    down on `close()`.
    """

    def __init__(
        self,
        base: ClientBase,
        options: ClientOptions,
        executor: Executor | None,
        workers: int | None,
    ) -> None:
        self._base = base
        self._task = base.task
        self._tls = (options.leader_root_certificates, options.helper_root_certificates)
        self._client_cert = (options.private_key, options.certificate_chain)
        self._own_executor = executor is None
        pool_size = workers or min(4, os.cpu_count() or 1)
        self.executor = executor or ThreadPoolExecutor(
            max_workers=pool_size, thread_name_prefix="veil-client"
        )
        # A lone request holds a pool thread while it waits for the leader
        # (Gatherer._build_and_send): the client's own pool does that only
        # with a second thread left to build the next request meanwhile, so
        # a slow leader does not hold up the building of the calls behind
        # it. An executor passed in is the caller's to size (docs/CLIENT.md).
        self.lone_path = not self._own_executor or pool_size >= 2
        self._channels: tuple[grpc.aio.Channel, grpc.aio.Channel] | None = None
        self.leader: Any = None
        self.helper: Any = None
        # A blocking channel to the leader for a lone request, opened on the
        # first one.
        self._blocking_channel: grpc.Channel | None = None
        self._blocking_leader: Any = None
        self.closed = False

    def stubs(self) -> None:
        """Open the grpc.aio channels (`leader`, `helper`) if not yet open.
        Raises UploadError (CANCELLED) once the client was closed."""
        if self.closed:
            raise UploadError(grpc.StatusCode.CANCELLED, "the client was closed")
        if self._channels is None:
            task = self._task
            leader = open_aio_channel(task.leader_address, self._tls[0], *self._client_cert)
            helper = open_aio_channel(task.helper_address, self._tls[1], *self._client_cert)
            self._channels = (leader, helper)
            self.leader = leader_pb2_grpc.LeaderStub(leader)  # type: ignore[no-untyped-call]
            self.helper = helper_pb2_grpc.HelperStub(helper)  # type: ignore[no-untyped-call]

    def blocking_stub(self) -> Any:
        """The leader's stub on the blocking channel, for a worker thread."""
        if self._blocking_channel is None:
            self._blocking_channel = open_channel(
                self._task.leader_address, self._tls[0], *self._client_cert
            )
            self._blocking_leader = leader_pb2_grpc.LeaderStub(self._blocking_channel)  # type: ignore[no-untyped-call]
        return self._blocking_leader

    async def close_channels(self) -> None:
        self.closed = True
        if self._channels is not None:
            for channel in self._channels:
                await channel.close()
            self._channels = None
        if self._blocking_channel is not None:
            self._blocking_channel.close()
            self._blocking_channel = None

    def close_executor(self) -> None:
        if self._own_executor:
            self.executor.shutdown(wait=False)

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a worker thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args))

    async def call(
        self, stub: Any, method: str, request: Any, failed: grpc.RpcError | None = None
    ) -> Any:
        """The call's answer, retried by the client's policy; `failed`: the
        first attempt, made elsewhere (a worker thread), failed so."""
        policy = self._base.policy
        attempt = 0
        while True:
            if failed is None:
                try:
                    reply = await getattr(stub, method)(request, timeout=self._base.timeout)
                except grpc.RpcError as e:
                    failed = e
                else:
                    if reply is None:
                        # grpc.aio answers None where the blocking stub raises
                        # INTERNAL: the server's answer did not parse.
                        raise UploadError(grpc.StatusCode.INTERNAL, _UNREADABLE)
                    return reply
            error = UploadError.from_rpc(failed)
            failed = None
            if self.closed or not policy.should_retry(error, attempt):
                raise self._base.unreachable(error, stub is self.leader, attempt + 1) from None
            wait = policy.delay(attempt, error.retry_after)
            log.info("retrying in %.1f s after %s (attempt %d)", wait, error.code.name, attempt + 1)
            await asyncio.sleep(wait)
            attempt += 1

    async def resend(self, request: Any, failed: grpc.RpcError | None = None) -> UploadResult:
        """An UploadReports request's answer, retried (`failed`: as `call`)."""
        self.stubs()
        reply = await self.call(self.leader, "UploadReports", request, failed)
        return UploadResult(reply.accepted, reply.duplicates)

    async def send(self, reports: Sequence[Report]) -> UploadResult:
        """Upload `reports` in one request, retried."""
        self.stubs()
        return await self.resend(upload_request(self._task.task_id, reports))
