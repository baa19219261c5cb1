"""Concurrent calls of an `AsyncClient` gathered into shared requests.

Each call's sharding and its request have a fixed cost (about a millisecond
of CPU), which `upload` calls of one measurement, or `upload_batch` calls of
ten, would otherwise pay each: the calls waiting when the gatherer gets to
them are sharded together, in one hand-off to a worker thread, and sent in
one request, two requests under way at once (one prepared while the other
is sent). Each call keeps its own report and its own errors: an invalid
measurement fails its own call, and a shared request the leader refuses
whole is sent again call by call.

A request with nothing to gather (a lone caller awaiting each answer) is
built and sent by one worker thread on the blocking channel (with an
outbox: built, stored and flushed), so that the loop is woken once a call
(`Gatherer._build_and_send`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from veil.client.base import ClientBase, Sent, UploadResult, advance
from veil.client.retry import UploadError
from veil.client.transport import AioTransport
from veil.hpke import ROLE_HELPER, ROLE_LEADER, HpkeConfig
from veil.messages import Report
from veil.messages.wire import upload_request


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


class Gatherer:
    """The calls of one AsyncClient waiting to be gathered, and the requests
    that carry them. `hpke_config` and `upload_reports` are the client's
    (a config by role; reports stored and flushed with an outbox, else sent
    in batches); `flush_lock` is held by a flush of the outbox."""

    def __init__(
        self,
        base: ClientBase,
        transport: AioTransport,
        hpke_config: Callable[[int], Awaitable[HpkeConfig]],
        upload_reports: Callable[[Sequence[Report]], Awaitable[UploadResult]],
        flush_lock: asyncio.Lock,
    ) -> None:
        self._base = base
        self._transport = transport
        self._hpke_config = hpke_config
        self._upload_reports = upload_reports
        self._flush_lock = flush_lock
        self.lone_path = transport.lone_path
        # Calls waiting to be gathered into one request (each with its own
        # measurements), and the requests under way (two: one prepares while
        # the other is sent).
        self._waiting: list[_Call] = []
        self._running: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(2)
        self._in_flight: set[asyncio.Task[None]] = set()

    async def enqueue(self, values: list[Any], report_time: int | None) -> UploadResult:
        """The result of the request that carries `values` (a call's measurements)."""
        future: asyncio.Future[UploadResult] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Call(values, report_time, future))
        if self._running is None:
            self._running = asyncio.create_task(self._gather())
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
            self._running = None

    def _done_in_flight(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._slots.release()

    async def _upload_gathered(self, calls: list[_Call]) -> None:
        def fail(futures: Iterable[asyncio.Future[UploadResult]], error: BaseException) -> None:
            for f in futures:
                if not f.done():
                    f.set_exception(error)

        try:
            leader = await self._hpke_config(ROLE_LEADER)
            helper = await self._hpke_config(ROLE_HELPER)
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
                        lone = await self._transport.off_loop(
                            self._build_and_send,
                            self._transport.blocking_stub(),
                            members,
                            leader,
                            helper,
                            t,
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
                result = await self._upload_reports(reports)
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
            built = await self._transport.off_loop(
                self._base._prepare, measurements, leader, helper, t
            )
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
                own = await self._transport.off_loop(
                    self._base._prepare, call.values, leader, helper, t
                )
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
            self.lone_path
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
        request = upload_request(self._base.task.task_id, reports)
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
        self._base.outbox.add(self._base.task.task_id, [r for _, own in prepared for r in own])
        plan = self._base._delivery_plan()
        step = advance(plan, None)
        while isinstance(step, list):
            request = upload_request(self._base.task.task_id, step)
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
                stored = await self._transport.off_loop(
                    self._build_store_and_flush,
                    self._transport.blocking_stub(),
                    members,
                    leader,
                    helper,
                    t,
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
            sent = await self._transport.resend(stored.request, stored.failure)
        except UploadError as e:
            sent = e
        step = await self._transport.off_loop(advance, stored.plan, sent)
        while isinstance(step, list):
            try:
                sent = await self._transport.send(step)
            except UploadError as e:
                sent = e
            step = await self._transport.off_loop(advance, stored.plan, sent)
        return step

    async def _finish_sent(self, lone: _Lone) -> None:
        """A lone request's answer: its first attempt's (retried from here
        on grpc.aio when it failed and the policy says so)."""
        result = lone.outcome
        if isinstance(result, Exception) and not isinstance(result, grpc.RpcError):
            raise result  # not an answer (the client was closed under the call)
        if isinstance(result, grpc.RpcError):
            self._transport.stubs()
            try:
                result = await self._transport.resend(lone.request, result)
            except UploadError as e:
                await self._refused_whole(lone.prepared, e)
                return
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
                result = await self._upload_reports(own)
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
