"""`AsyncClient`: the client for asyncio applications, on grpc.aio.

The same surface, retry policy, errors and outbox as `veil.client.Client`,
with coroutines. Sharding and sealing (NumPy field arithmetic and HPKE, a
few hundred microseconds of CPU per report) and the outbox's SQLite writes
(an fsync each) never run on the event loop: they go to a thread pool
(`veil.client.transport`), so a web handler awaiting an upload leaves the
loop free for other requests. Concurrent `upload` calls, and `upload_batch`
calls smaller than a request, are gathered into shared requests
(`veil.client.gather`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor
from typing import Any

from veil.client.base import ClientBase, ClientOptions, Sent, UploadResult, advance
from veil.client.gather import Gatherer
from veil.client.retry import UploadError
from veil.client.transport import AioTransport
from veil.hpke import ROLE_HELPER, ROLE_LEADER, HpkeConfig
from veil.messages import Report
from veil.task import Task


class AsyncClient:
    """Uploads measurements for one task from asyncio code.

    Takes the arguments of `veil.client.Client` (the task, and its
    `ClientOptions` or their keywords), plus `executor`: where sharding,
    sealing and the outbox's writes run. By default the client owns a
    thread pool of `workers` threads (default: the number of CPUs, at most
    4) and shuts it down on `close()`; an executor passed in is left
    running. A process pool does not fit: the work closes over the client's
    task and VDAF.

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
        options: ClientOptions | None = None,
        *,
        executor: Executor | None = None,
        workers: int | None = None,
        **changes: Any,
    ) -> None:
        options = ClientOptions.given(options, changes)
        self._base = ClientBase(task, options)
        self.task = task
        self.vdaf = self._base.vdaf
        self._transport = AioTransport(self._base, options, executor, workers)
        self._config_lock = asyncio.Lock()
        self._flush_lock = asyncio.Lock()
        self._gatherer = Gatherer(
            self._base, self._transport, self.hpke_config, self.upload_reports, self._flush_lock
        )

    async def close(self) -> None:
        """Close the channels, the outbox and the client's own thread pool.
        A call still waiting for the leader fails (UploadError, CANCELLED)."""
        await self._transport.close_channels()
        await self._transport.off_loop(self._base._close_outbox)
        self._transport.close_executor()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def hpke_config(self, role: int) -> HpkeConfig:
        """The aggregator's HPKE config (`role`: veil.hpke.ROLE_LEADER or
        ROLE_HELPER), cached for `config_lifetime` seconds."""
        known = self._base._cached_config(role)  # memory only: no need to leave the loop
        if known is not None:
            return known
        async with self._config_lock:
            # Another task may have fetched it while this one waited.
            known = await self._transport.off_loop(self._base._known_config, role)
            if known is not None:
                return known
            transport = self._transport
            transport.stubs()
            stub = transport.leader if role == ROLE_LEADER else transport.helper
            reply = await transport.call(stub, "GetHpkeConfig", self._base._config_request())
            return await transport.off_loop(self._base._remember_config, role, reply)

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
        return await self._transport.off_loop(
            self._base._prepare, list(measurements), leader, helper, report_time
        )

    async def upload_reports(self, reports: Sequence[Report]) -> UploadResult:
        """Upload prepared reports in batches of `batch_size`; as
        `Client.upload_reports` (with an outbox: stored first, then flushed)."""
        if self._base.outbox is not None:
            await self._transport.off_loop(self._base.outbox.add, self.task.task_id, reports)
            return await self.flush()
        accepted = duplicates = 0
        for chunk in self._base._chunks(reports):
            result = await self._transport.send(chunk)
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
        return await self._gatherer.enqueue([measurement], report_time)

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
        return await self._gatherer.enqueue(values, report_time)

    async def flush(self) -> UploadResult:
        """Send what the outbox holds for the task; as `Client.flush`."""
        if self._base.outbox is None:
            raise ValueError("this client has no outbox (pass outbox=PATH)")
        async with self._flush_lock:
            plan = self._base._delivery_plan()
            step = await self._transport.off_loop(advance, plan, None)
            while isinstance(step, list):
                try:
                    sent: Sent = await self._transport.send(step)
                except UploadError as e:
                    sent = e
                step = await self._transport.off_loop(advance, plan, sent)
            return step
