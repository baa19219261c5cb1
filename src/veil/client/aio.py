"""`AsyncClient`: the client for asyncio applications, on grpc.aio.

The same surface, retry policy, errors and outbox as `veil.client.Client`,
with coroutines. Sharding and sealing (NumPy field arithmetic and HPKE, a
few hundred microseconds of CPU per report) and the outbox's SQLite writes
(an fsync each) never run on the event loop: they go to a thread pool, so
a web handler awaiting an upload leaves the loop free for other requests.
Concurrent `upload` calls, and `upload_batch` calls smaller than a request,
are gathered into shared requests: each call's sharding and its request
have a fixed cost (about a millisecond of CPU), which calls of one or ten
measurements would otherwise pay each. A request with nothing to gather
(a lone caller awaiting each answer) is built and sent by one worker
thread on a blocking channel (with an outbox: built, stored and flushed),
so that the loop is woken once a call (`AsyncClient._build_and_send`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from veil.client.base import CONFIG_LIFETIME, ClientBase, Sent, UploadResult, advance
from veil.client.outbox import DEFAULT_MAX_REPORTS
from veil.client.retry import UploadError
from veil.grpc_util import open_aio_channel, open_channel
from veil.hpke import ROLE_HELPER, ROLE_LEADER, HpkeConfig
from veil.messages import Report
from veil.messages.wire import upload_request
from veil.protocol.v1 import helper_pb2_grpc, leader_pb2_grpc
from veil.task import Task

log = logging.getLogger(__name__)

T = TypeVar("T")


_UNREADABLE = "the server's answer is not the message its method returns"


@dataclass(frozen=True)
class _Call:
    """An `upload` or a small `upload_batch` call waiting to be gathered."""

    values: list[Any]
    report_time: int | None
    future: asyncio.Future[UploadResult]


@dataclass(frozen=True)
class _Lone:
    """A lone request built in a worker thread, and what came of its first
    attempt there: the answer, the failure, or None (not sent)."""

    prepared: list[tuple[_Call, list[Report]]]
    request: Any  # the UploadRequest, None when not sent
    outcome: UploadResult | Exception | None


@dataclass(frozen=True)
class _Stored:
    """A lone request built, stored in the outbox and flushed in a worker
    thread: the flush's result, or where it stopped (a first attempt that
    failed there: the plan, the request and the failure)."""

    prepared: list[tuple[_Call, list[Report]]]
    result: UploadResult | None
    plan: Generator[list[Report], Sent, UploadResult] | None = None
    request: Any = None
    failure: Exception | None = None


def _split(members: list[_Call], built: list[Report]) -> list[tuple[_Call, list[Report]]]:
    """Each call with its reports, from the reports of all, in call order."""
    prepared = []
    start = 0
    for call in members:
        prepared.append((call, built[start : start + len(call.values)]))
        start += len(call.values)
    return prepared


class AsyncClient:
    """Uploads measurements for one task from asyncio code.

    Takes the arguments of `veil.client.Client` (trust, mTLS, timeout,
    retries, backoff, max_delay, batch_size, clock, config_lifetime, outbox,
    outbox_max_reports), plus `executor`: where sharding, sealing and the
    outbox's writes run. By default the client owns a thread pool of
    `workers` threads (default: the number of CPUs, at most 4) and shuts it
    down on `close()`; an executor passed in is left running. A process pool
    does not fit: the work closes over the client's task and VDAF.

    One `AsyncClient` may be shared by any number of tasks of one event
    loop: the HPKE configs are fetched once (under a lock), every call draws
    its own report ids, and one flush of the outbox runs at a time. Use it
    from the loop it was first used on; open and close it inside that loop
    (e.g. in a Starlette/FastAPI lifespan).

    Example::

        import asyncio

        from veil.client import AsyncClient
        from veil.task import load_task

        async def main() -> None:
            async with AsyncClient(load_task("client/task.toml")) as client:
                await client.upload(1)
                await asyncio.gather(*(client.upload(v) for v in (0, 1, 1)))

        asyncio.run(main())
    """

    def __init__(
        self,
        task: Task,
        *,
        leader_root_certificates: bytes | None = None,
        helper_root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        timeout: float = 30.0,
        retries: int = 5,
        backoff: float = 0.5,
        max_delay: float = 30.0,
        batch_size: int = 1000,
        clock: Callable[[], float] = time.time,
        config_lifetime: float = CONFIG_LIFETIME,
        outbox: str | os.PathLike[str] | None = None,
        outbox_max_reports: int = DEFAULT_MAX_REPORTS,
        executor: Executor | None = None,
        workers: int | None = None,
    ) -> None:
        self._base = ClientBase(
            task,
            leader_root_certificates=leader_root_certificates,
            helper_root_certificates=helper_root_certificates,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            max_delay=max_delay,
            batch_size=batch_size,
            clock=clock,
            config_lifetime=config_lifetime,
            outbox=outbox,
            outbox_max_reports=outbox_max_reports,
        )
        self.task = task
        self.vdaf = self._base.vdaf
        self._tls = (leader_root_certificates, helper_root_certificates)
        self._client_cert = (private_key, certificate_chain)
        self._own_executor = executor is None
        pool_size = workers or min(4, os.cpu_count() or 1)
        self._executor = executor or ThreadPoolExecutor(
            max_workers=pool_size, thread_name_prefix="veil-client"
        )
        # A lone request holds a pool thread while it waits for the leader
        # (_build_and_send): the client's own pool does that only with a
        # second thread left to build the next request meanwhile, so a slow
        # leader does not hold up the building of the calls behind it. An
        # executor passed in is the caller's to size (docs/CLIENT.md).
        self._lone_path = not self._own_executor or pool_size >= 2
        # Channels are opened on first use, inside the running loop (grpc.aio
        # binds a channel to the loop it is created in).
        self._channels: tuple[grpc.aio.Channel, grpc.aio.Channel] | None = None
        self._leader: Any = None
        self._helper: Any = None
        # A blocking channel to the leader for a lone request (see
        # _build_and_send), opened on the first one.
        self._blocking_channel: grpc.Channel | None = None
        self._blocking_leader: Any = None
        self._closed = False
        self._config_lock = asyncio.Lock()
        self._flush_lock = asyncio.Lock()
        # Calls waiting to be gathered into one request (each with its own
        # measurements), and the requests under way (two: one prepares while
        # the other is sent).
        self._waiting: list[_Call] = []
        self._gatherer: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(2)
        self._in_flight: set[asyncio.Task[None]] = set()

    def _stubs(self) -> None:
        if self._closed:
            raise UploadError(grpc.StatusCode.CANCELLED, "the client was closed")
        if self._channels is None:
            leader = open_aio_channel(self.task.leader_address, self._tls[0], *self._client_cert)
            helper = open_aio_channel(self.task.helper_address, self._tls[1], *self._client_cert)
            self._channels = (leader, helper)
            self._leader = leader_pb2_grpc.LeaderStub(leader)  # type: ignore[no-untyped-call]
            self._helper = helper_pb2_grpc.HelperStub(helper)  # type: ignore[no-untyped-call]

    def _blocking_stub(self) -> Any:
        if self._blocking_channel is None:
            self._blocking_channel = open_channel(
                self.task.leader_address, self._tls[0], *self._client_cert
            )
            self._blocking_leader = leader_pb2_grpc.LeaderStub(self._blocking_channel)  # type: ignore[no-untyped-call]
        return self._blocking_leader

    async def close(self) -> None:
        """Close the channels, the outbox and the client's own thread pool.
        A call still waiting for the leader fails (UploadError, CANCELLED)."""
        self._closed = True
        if self._channels is not None:
            for channel in self._channels:
                await channel.close()
            self._channels = None
        if self._blocking_channel is not None:
            self._blocking_channel.close()
            self._blocking_channel = None
        await self._off_loop(self._base._close_outbox)
        if self._own_executor:
            self._executor.shutdown(wait=False)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    async def _call_stub(
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
            if self._closed or not policy.should_retry(error, attempt):
                raise self._base.unreachable(error, stub is self._leader, attempt + 1) from None
            wait = policy.delay(attempt, error.retry_after)
            log.info("retrying in %.1f s after %s (attempt %d)", wait, error.code.name, attempt + 1)
            await asyncio.sleep(wait)
            attempt += 1

    async def hpke_config(self, role: int) -> HpkeConfig:
        """The aggregator's HPKE config (`role`: veil.hpke.ROLE_LEADER or
        ROLE_HELPER), cached for `config_lifetime` seconds."""
        known = self._base._cached_config(role)  # memory only: no need to leave the loop
        if known is not None:
            return known
        async with self._config_lock:
            # Another task may have fetched it while this one waited.
            known = await self._off_loop(self._base._known_config, role)
            if known is not None:
                return known
            self._stubs()
            stub = self._leader if role == ROLE_LEADER else self._helper
            reply = await self._call_stub(stub, "GetHpkeConfig", self._base._config_request())
            return await self._off_loop(self._base._remember_config, role, reply)

    def report_time(self) -> int:
        """Now, rounded down to the task's time_precision."""
        return self._base.report_time()

    async def build_report(self, measurement: Any, report_time: int | None = None) -> Report:
        """Shard and seal one measurement. Raises ValueError on an invalid measurement."""
        return (await self.build_reports([measurement], report_time))[0]

    async def build_reports(
        self, measurements: Sequence[Any], report_time: int | None = None
    ) -> list[Report]:
        """Shard and seal many measurements in a worker thread, each with a
        fresh report id. Raises ValueError, naming the report, on an invalid one."""
        leader = await self.hpke_config(ROLE_LEADER)
        helper = await self.hpke_config(ROLE_HELPER)
        return await self._off_loop(
            self._base._prepare, list(measurements), leader, helper, report_time
        )

    async def _send(self, reports: Sequence[Report]) -> UploadResult:
        self._stubs()
        request = upload_request(self.task.task_id, reports)
        reply = await self._call_stub(self._leader, "UploadReports", request)
        return UploadResult(reply.accepted, reply.duplicates)

    async def upload_reports(self, reports: Sequence[Report]) -> UploadResult:
        """Upload prepared reports in batches of `batch_size`; as
        `Client.upload_reports` (with an outbox: stored first, then flushed)."""
        if self._base.outbox is not None:
            await self._off_loop(self._base.outbox.add, self.task.task_id, reports)
            return await self.flush()
        accepted = duplicates = 0
        for chunk in self._base._chunks(reports):
            result = await self._send(chunk)
            accepted += result.accepted
            duplicates += result.duplicates
        return UploadResult(accepted, duplicates)

    async def upload(self, measurement: Any, report_time: int | None = None) -> UploadResult:
        """Shard, seal and upload one measurement.

        Calls from concurrent tasks are gathered: those waiting when the
        client gets to them are sharded together and sent in one request
        (at most `batch_size` measurements each), so one client sustains
        thousands of single uploads a second where one request per call
        would not. Each call keeps its own report and its own errors: an
        invalid measurement raises ValueError in its caller only; a shared
        request the leader refuses is sent again call by call, so that its
        UploadError reaches the calls at fault only, and one that failed
        (the leader unreachable) raises UploadError in each call it carried.
        A call cancelled before its request leaves is not sent. Without an
        outbox a call's result is ``UploadResult(1, 0)``; with one, each call
        gets the result of the flush that carried it.
        """
        return await self._enqueue([measurement], report_time)

    async def upload_batch(
        self, measurements: Iterable[Any], report_time: int | None = None
    ) -> UploadResult:
        """Shard, seal and upload many measurements (one request per `batch_size`).

        A call of fewer than `batch_size` measurements is gathered with
        the concurrent ones as `upload` calls are: an invalid measurement
        raises ValueError (naming it by its place in this call) in this call
        only, and without an outbox the result counts this call's reports
        (``UploadResult(len(measurements), 0)``) once the request carrying
        them is accepted whole; with an outbox, the result of the flush that
        carried them.
        """
        values = list(measurements)
        if not values or len(values) >= self._base.batch_size:
            return await self.upload_reports(await self.build_reports(values, report_time))
        return await self._enqueue(values, report_time)

    async def _enqueue(self, values: list[Any], report_time: int | None) -> UploadResult:
        future: asyncio.Future[UploadResult] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Call(values, report_time, future))
        if self._gatherer is None:
            self._gatherer = asyncio.create_task(self._gather())
        return await future

    async def _gather(self) -> None:
        try:
            while self._waiting:
                await self._slots.acquire()
                await asyncio.sleep(0)  # let the calls of tasks scheduled now join
                taken = size = 0
                for call in self._waiting:
                    if taken and size + len(call.values) > self._base.batch_size:
                        break
                    taken += 1
                    size += len(call.values)
                calls = self._waiting[:taken]
                del self._waiting[:taken]
                task = asyncio.create_task(self._upload_gathered(calls))
                self._in_flight.add(task)
                task.add_done_callback(self._done_in_flight)
        finally:
            self._gatherer = None

    def _done_in_flight(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._slots.release()

    async def _upload_gathered(self, calls: list[_Call]) -> None:
        def fail(futures: Iterable[asyncio.Future[UploadResult]], error: BaseException) -> None:
            for f in futures:
                if not f.done():
                    f.set_exception(error)

        try:
            leader = await self.hpke_config(ROLE_LEADER)
            helper = await self.hpke_config(ROLE_HELPER)
            groups: dict[int | None, list[_Call]] = {}
            for call in calls:
                if not call.future.done():  # not cancelled while it waited
                    groups.setdefault(call.report_time, []).append(call)
            if len(groups) == 1 and self._alone():
                ((t, members),) = groups.items()
                if self._base.outbox is not None:
                    if await self._store_alone(members, leader, helper, t):
                        return
                    prepared = await self._prepare_each(members, leader, helper, t, fail)
                else:
                    try:
                        lone = await self._off_loop(
                            self._build_and_send, self._blocking_stub(), members, leader, helper, t
                        )
                    except ValueError:
                        prepared = await self._prepare_each(members, leader, helper, t, fail)
                    else:
                        if lone.outcome is not None:
                            await self._finish_sent(lone)
                            return
                        prepared = lone.prepared
            else:
                prepared = []
                for t, members in groups.items():
                    prepared += await self._prepare_group(members, leader, helper, t, fail)
            # A call cancelled while it waited or was prepared is not sent:
            # its caller may try again, and would be counted twice.
            prepared = [(call, own) for call, own in prepared if not call.future.done()]
            if not prepared:
                return
            reports = [r for _, own in prepared for r in own]
            try:
                result = await self.upload_reports(reports)
            except UploadError as e:
                await self._refused_whole(prepared, e)
                return
            self._settle(prepared, result, len(reports))
        except BaseException as e:
            fail((call.future for call in calls), e)
            if not isinstance(e, Exception):
                raise

    async def _prepare_group(
        self,
        members: list[_Call],
        leader: HpkeConfig,
        helper: HpkeConfig,
        t: int | None,
        fail: Callable[[Iterable[asyncio.Future[UploadResult]], BaseException], None],
    ) -> list[tuple[_Call, list[Report]]]:
        """The reports of calls of one report time, built in one hand-off."""
        measurements = [v for call in members for v in call.values]
        try:
            built = await self._off_loop(self._base._prepare, measurements, leader, helper, t)
        except ValueError:
            return await self._prepare_each(members, leader, helper, t, fail)
        return _split(members, built)

    async def _prepare_each(
        self,
        members: list[_Call],
        leader: HpkeConfig,
        helper: HpkeConfig,
        t: int | None,
        fail: Callable[[Iterable[asyncio.Future[UploadResult]], BaseException], None],
    ) -> list[tuple[_Call, list[Report]]]:
        """Some measurement is invalid: find its call, and fail only that one."""
        prepared = []
        for call in members:
            try:
                own = await self._off_loop(self._base._prepare, call.values, leader, helper, t)
            except ValueError as e:
                fail([call.future], e)
            else:
                prepared.append((call, own))
        return prepared

    def _alone(self) -> bool:
        """Whether the request about to be built is the only one: no other
        under way, no call waiting for the next, no flush of the outbox (and
        the client's own pool has a thread to spare for it)."""
        return (
            self._lone_path
            and len(self._in_flight) <= 1
            and not self._waiting
            and not self._flush_lock.locked()
        )

    def _build_and_send(
        self,
        stub: Any,
        members: list[_Call],
        leader: HpkeConfig,
        helper: HpkeConfig,
        t: int | None,
    ) -> _Lone:
        """Build a lone request and make its first attempt, both in this
        worker thread, on the blocking channel.

        A caller that sends one small batch and waits for its answer has
        nothing to be gathered with, and pays per call for each time a
        thread waits and is woken: building in a worker, the event loop
        starting the call, grpc.aio's poller thread, the loop woken again.
        Here the worker that built the request sends it and waits for the
        answer, and the loop is woken once, when the call is done.
        Raises ValueError (nothing sent) on an invalid measurement.
        """
        built = self._base._prepare([v for call in members for v in call.values], leader, helper, t)
        # Read from this thread, a call's future is at worst a moment late
        # to show that its caller gave up: as if it gave up once this
        # request left, which it now does.
        prepared = [(c, own) for c, own in _split(members, built) if not c.future.done()]
        reports = [r for _, own in prepared for r in own]
        if not reports or len(list(self._base._chunks(reports))) > 1:
            return _Lone(prepared, None, None)
        request = upload_request(self.task.task_id, reports)
        try:
            reply = stub.UploadReports(request, timeout=self._base.timeout)
        except Exception as e:  # any failure of the call is raised on the loop
            return _Lone(prepared, request, e)
        return _Lone(prepared, request, UploadResult(reply.accepted, reply.duplicates))

    def _build_store_and_flush(
        self,
        stub: Any,
        members: list[_Call],
        leader: HpkeConfig,
        helper: HpkeConfig,
        t: int | None,
    ) -> _Stored:
        """`_build_and_send` with an outbox (the caller holds the flush
        lock): build, store, and flush as `flush` does, each batch's first
        attempt made here; the first that fails is left to the loop.
        Raises ValueError (nothing stored) on an invalid measurement."""
        assert self._base.outbox is not None
        built = self._base._prepare([v for call in members for v in call.values], leader, helper, t)
        prepared = [(c, own) for c, own in _split(members, built) if not c.future.done()]
        if not prepared:
            return _Stored(prepared, None)
        self._base.outbox.add(self.task.task_id, [r for _, own in prepared for r in own])
        plan = self._base._delivery_plan()
        step = advance(plan, None)
        while isinstance(step, list):
            request = upload_request(self.task.task_id, step)
            try:
                reply = stub.UploadReports(request, timeout=self._base.timeout)
            except Exception as e:  # any failure of the call is handled on the loop
                return _Stored(prepared, None, plan, request, e)
            step = advance(plan, UploadResult(reply.accepted, reply.duplicates))
        return _Stored(prepared, step)

    async def _store_alone(
        self, members: list[_Call], leader: HpkeConfig, helper: HpkeConfig, t: int | None
    ) -> bool:
        """A lone request with an outbox, built, stored and flushed (in one
        worker thread as far as its first attempts go), each call settled
        with the flush's result. False, with nothing stored, when a
        measurement is invalid."""
        async with self._flush_lock:
            try:
                stored = await self._off_loop(
                    self._build_store_and_flush, self._blocking_stub(), members, leader, helper, t
                )
            except ValueError:
                return False
            flushed = await self._finish_flush(stored)
        if flushed is not None:
            self._settle(stored.prepared, flushed, 0)
        return True

    async def _finish_flush(self, stored: _Stored) -> UploadResult | None:
        """The flush's result: the worker's, or the flush carried on from
        where its first attempt failed (retried on grpc.aio, as `flush`)."""
        if stored.failure is None:
            return stored.result
        if not isinstance(stored.failure, grpc.RpcError):
            raise stored.failure  # not an answer (the client was closed under the call)
        assert stored.plan is not None
        sent: Sent
        try:
            self._stubs()
            reply = await self._call_stub(
                self._leader, "UploadReports", stored.request, stored.failure
            )
            sent = UploadResult(reply.accepted, reply.duplicates)
        except UploadError as e:
            sent = e
        step = await self._off_loop(advance, stored.plan, sent)
        while isinstance(step, list):
            try:
                sent = await self._send(step)
            except UploadError as e:
                sent = e
            step = await self._off_loop(advance, stored.plan, sent)
        return step

    async def _finish_sent(self, lone: _Lone) -> None:
        """A lone request's answer: its first attempt's (retried from here
        on grpc.aio when it failed and the policy says so)."""
        result = lone.outcome
        if isinstance(result, Exception) and not isinstance(result, grpc.RpcError):
            raise result  # not an answer (the client was closed under the call)
        if isinstance(result, grpc.RpcError):
            self._stubs()
            try:
                reply = await self._call_stub(self._leader, "UploadReports", lone.request, result)
            except UploadError as e:
                await self._refused_whole(lone.prepared, e)
                return
            result = UploadResult(reply.accepted, reply.duplicates)
        assert result is not None
        self._settle(lone.prepared, result, len(lone.request.reports))

    async def _refused_whole(
        self, prepared: list[tuple[_Call, list[Report]]], error: UploadError
    ) -> None:
        if error.retryable or len(prepared) == 1:
            raise error
        # Refused whole (the leader stores nothing of a request it
        # refuses): the cause may be one call's reports (a time out
        # of range, a batch collected), so each call is sent alone
        # and gets its own answer; the same reports, the same ids.
        await self._upload_each(prepared)

    async def _upload_each(self, prepared: list[tuple[_Call, list[Report]]]) -> None:
        """Send each call's reports in a request of its own, in order."""
        for call, own in prepared:
            if call.future.done():
                continue
            try:
                result = await self.upload_reports(own)
            except UploadError as e:
                if not call.future.done():
                    call.future.set_exception(e)
            else:
                self._settle([(call, own)], result, len(own))

    def _settle(
        self, prepared: list[tuple[_Call, list[Report]]], result: UploadResult, sent: int
    ) -> None:
        """Each call's result from its request's: without an outbox and with
        every report of the request stored, its own count; else the
        request's (duplicates, or an outbox's flush, are not told apart by
        call)."""
        whole = self._base.outbox is None and result.accepted == sent
        for call, own in prepared:
            if not call.future.done():
                call.future.set_result(UploadResult(len(own), 0) if whole else result)

    async def flush(self) -> UploadResult:
        """Send what the outbox holds for the task; as `Client.flush`."""
        if self._base.outbox is None:
            raise ValueError("this client has no outbox (pass outbox=PATH)")
        async with self._flush_lock:
            plan = self._base._delivery_plan()
            step = await self._off_loop(advance, plan, None)
            while isinstance(step, list):
                try:
                    sent: Sent = await self._send(step)
                except UploadError as e:
                    sent = e
                step = await self._off_loop(advance, plan, sent)
            return step
