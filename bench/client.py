"""Sustained upload rate of one `AsyncClient` (issue 20).

A local leader and helper run as separate processes (loopback, SQLite, the
leader aggregating as usual); this process runs one `AsyncClient` on one
event loop, with `concurrency` tasks each uploading Count measurements in
calls of `batch` measurements (`upload` for 1, `upload_batch` above) for
`seconds`. Every report is built (sharded and sealed, in the client's
thread pool) and uploaded inside the measured time, so the rate is what an
application embedding the client sustains. ``scripts/bench_async_client.py``
prints the table.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from veil.client import AsyncClient
from veil.local.launcher import LocalDeployment
from veil.task import DpSpec, VdafSpec


@dataclass(frozen=True)
class Mode:
    batch: int  # measurements per call
    concurrency: int  # tasks sharing the one client


@dataclass(frozen=True)
class ModeResult:
    mode: Mode
    reports: int
    seconds: float
    per_s: float
    p50_ms: float  # latency of one call
    p99_ms: float
    client_cpu_us: float  # this process's CPU (all threads) per report


@dataclass(frozen=True)
class CallCost:
    """What one call costs the client whatever it carries (CPU µs, medians):
    an upload of one report built beforehand (`upload_reports`: the
    request, its gRPC round trip on grpc.aio, the answer), and one hand-off
    of work to the client's thread pool and back (where sharding and
    sealing run)."""

    rpc_us: float
    hand_off_us: float

    @property
    def per_call_us(self) -> float:
        return self.rpc_us + self.hand_off_us


DEFAULT_MODES = (Mode(1, 64), Mode(10, 32), Mode(100, 8))


async def _sustain(client: AsyncClient, mode: Mode, seconds: float) -> ModeResult:
    latencies: list[float] = []
    uploaded = 0
    t = client.report_time()
    cpu = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds

    async def worker() -> None:
        nonlocal uploaded
        values = [1] * mode.batch
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            if mode.batch == 1:
                result = await client.upload(1, t)
            else:
                result = await client.upload_batch(values, t)
            latencies.append(time.perf_counter() - began)
            uploaded += result.accepted

    await asyncio.gather(*(worker() for _ in range(mode.concurrency)))
    elapsed = time.perf_counter() - start
    cpu_us = (time.process_time() - cpu) / max(uploaded, 1) * 1e6
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return ModeResult(
        mode, uploaded, elapsed, uploaded / elapsed, cuts[49] * 1e3, cuts[98] * 1e3, cpu_us
    )


async def _call_cost(client: AsyncClient, calls: int = 200, runs: int = 5) -> CallCost:
    loop = asyncio.get_running_loop()
    reports = iter(await client.build_reports([1] * (calls * runs)))
    rpc: list[float] = []
    hand_off: list[float] = []
    for _ in range(runs):
        cpu = time.process_time()
        for _ in range(calls):
            await client.upload_reports([next(reports)])
        rpc.append((time.process_time() - cpu) / calls * 1e6)
        cpu = time.process_time()
        for _ in range(calls):
            await loop.run_in_executor(client._transport.executor, int)
        hand_off.append((time.process_time() - cpu) / calls * 1e6)
    return CallCost(statistics.median(rpc), statistics.median(hand_off))


def run(
    modes: tuple[Mode, ...] = DEFAULT_MODES, seconds: float = 10.0, workers: int | None = None
) -> tuple[list[ModeResult], CallCost]:
    """Start a local leader and helper, run each mode for `seconds`, then
    measure what one call costs the client whatever it carries."""
    with tempfile.TemporaryDirectory(prefix="veil-bench-client-") as tmp:
        tasks = {"count": (VdafSpec("count"), DpSpec("none"), {"min_batch_size": 1})}
        with LocalDeployment.start(Path(tmp), tasks) as dep:

            async def main() -> tuple[list[ModeResult], CallCost]:
                async with AsyncClient(dep.tasks["count"].client, workers=workers) as client:
                    await client.upload(1)  # fetch the HPKE configs, warm the kernels
                    results = [await _sustain(client, m, seconds) for m in modes]
                    return results, await _call_cost(client)

            return asyncio.run(main())


# -- a lone caller's call taken apart (issue 28) ---------------------------------


@dataclass(frozen=True)
class LoneCosts:
    """A lone caller's call of `batch` measurements and its pieces, each as
    CPU µs per call (the whole process: every thread) and wall ms per call,
    medians of `rounds` rounds in which every row runs `calls` calls in
    turn; `parts_us`, the parts of `batch` reports per report (a batched
    shard of that batch and two seals each), and `parts_1000_us`, of a batch
    of 1,000 (the parts the other modes divide by), measured between the
    rounds."""

    batch: int
    calls: int
    rounds: int
    cpu_us: dict[str, float]
    wall_ms: dict[str, float]
    parts_us: float
    parts_1000_us: float


# The rows, in the order they run and print: first (LONE_WHOLE_ROWS of them)
# whole calls of `batch` measurements, built and uploaded, and the building
# alone; then an upload of `batch` reports built beforehand on each way of
# making a gRPC call from asyncio; then what an asyncio caller pays around a
# call whatever the call is.
LONE_ROWS = (
    "AsyncClient.upload_batch",
    "AsyncClient, built then sent on grpc.aio",
    "Client.upload_batch (one thread)",
    "AsyncClient.upload_batch, outbox",
    "AsyncClient, outbox, built then sent",
    "Client.upload_batch, outbox",
    "prepare_reports in a worker",
    "grpc.aio",
    "blocking stub in a worker",
    "blocking stub's future API",
    "blocking stub on the loop (blocks it)",
    "a hand-off to a worker",
    "asyncio.sleep, as long as grpc.aio",
)
LONE_WHOLE_ROWS = 7


_Samples = tuple[dict[str, list[float]], dict[str, list[float]], list[float], list[float]]


class _BuildThenSend(AsyncClient):
    """AsyncClient as it was before a lone request was built and sent in one
    worker thread: built there, then sent from the loop on grpc.aio (with
    an outbox: built, stored, then each step of the flush handed off)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gatherer.lone_path = False


@dataclass(frozen=True)
class _LoneClients:
    client: AsyncClient
    two_hand_offs: AsyncClient  # as before: built in a worker, sent from the loop
    blocking: Any  # veil.client.Client
    boxed: AsyncClient  # each with an outbox
    boxed_two_hand_offs: AsyncClient
    boxed_blocking: Any


async def _lone_rows(c: _LoneClients, task: Any, batch: int, calls: int, rounds: int) -> _Samples:
    from veil.client.prepare import prepare_reports
    from veil.grpc_util import open_channel
    from veil.hpke import ROLE_HELPER, ROLE_LEADER
    from veil.messages.wire import upload_request
    from veil.protocol.v1 import leader_pb2_grpc

    loop = asyncio.get_running_loop()
    client, blocking = c.client, c.blocking
    executor = client._transport.executor
    for each in (client, c.two_hand_offs, c.boxed, c.boxed_two_hand_offs):
        await each.upload_batch([1] * batch)  # configs fetched, channels open
    blocking.upload_batch([1] * batch)
    c.boxed_blocking.upload_batch([1] * batch)
    leader = await client.hpke_config(ROLE_LEADER)
    helper = await client.hpke_config(ROLE_HELPER)
    t = client.report_time()
    values = [1] * batch
    built = iter(await client.build_reports([1] * (batch * calls * rounds * 6)))
    aio_stub = client._transport.leader
    channel = open_channel(task.leader_address)
    stub = leader_pb2_grpc.LeaderStub(channel)  # type: ignore[no-untyped-call]
    timeout = 30.0

    def request() -> Any:
        return upload_request(task.task_id, [next(built) for _ in range(batch)])

    def in_worker(fn: Callable[[], Any]) -> Any:
        return loop.run_in_executor(executor, fn)

    async def by_future() -> None:
        answer = stub.UploadReports.future(request(), timeout=timeout)
        done = loop.create_future()
        answer.add_done_callback(lambda _: loop.call_soon_threadsafe(done.set_result, None))
        await done
        answer.result()

    async def blocking_in_worker() -> None:
        r = request()
        await in_worker(lambda: stub.UploadReports(r, timeout=timeout))

    async def build_then_aio() -> None:
        await c.two_hand_offs.upload_batch(values, t)

    async def boxed_blocking() -> None:
        c.boxed_blocking.upload_batch(values, t)

    async def prepare_only() -> None:
        await in_worker(
            lambda: prepare_reports(task, values, leader, helper, t, batch=client._base._batch)
        )

    async def blocking_client() -> None:
        blocking.upload_batch(values, t)

    async def blocking_on_loop() -> None:
        stub.UploadReports(request(), timeout=timeout)

    aio_wall = [0.001]
    rows: dict[str, Callable[[], Any]] = {
        "AsyncClient.upload_batch": lambda: client.upload_batch(values, t),
        "AsyncClient, built then sent on grpc.aio": build_then_aio,
        "Client.upload_batch (one thread)": blocking_client,
        "AsyncClient.upload_batch, outbox": lambda: c.boxed.upload_batch(values, t),
        "AsyncClient, outbox, built then sent": lambda: c.boxed_two_hand_offs.upload_batch(
            values, t
        ),
        "Client.upload_batch, outbox": boxed_blocking,
        "prepare_reports in a worker": prepare_only,
        "grpc.aio": lambda: aio_stub.UploadReports(request(), timeout=timeout),
        "blocking stub in a worker": blocking_in_worker,
        "blocking stub's future API": by_future,
        "blocking stub on the loop (blocks it)": blocking_on_loop,
        "a hand-off to a worker": lambda: in_worker(int),
        "asyncio.sleep, as long as grpc.aio": lambda: asyncio.sleep(aio_wall[0]),
    }
    cpu: dict[str, list[float]] = {k: [] for k in LONE_ROWS}
    wall: dict[str, list[float]] = {k: [] for k in LONE_ROWS}
    parts_samples: list[float] = []
    parts_1000: list[float] = []
    parts, parts_of_1000 = _parts("count", batch), _parts("count", 1000)
    try:
        for _ in range(rounds):
            for name in LONE_ROWS:
                start_cpu, start = time.process_time(), time.perf_counter()
                for _ in range(calls):
                    await rows[name]()
                cpu[name].append((time.process_time() - start_cpu) / calls * 1e6)
                wall[name].append((time.perf_counter() - start) / calls * 1e3)
                if name == "grpc.aio":
                    aio_wall[0] = statistics.median(wall[name]) / 1e3
            start_cpu = time.process_time()
            for _ in range(calls):
                parts()
            parts_samples.append((time.process_time() - start_cpu) / calls / batch * 1e6)
            start_cpu = time.process_time()
            parts_of_1000()
            parts_1000.append((time.process_time() - start_cpu) / 1000 * 1e6)
    finally:
        channel.close()
    return cpu, wall, parts_samples, parts_1000


def lone_costs(batch: int = 10, calls: int = 100, rounds: int = 5) -> LoneCosts:
    """Start a local leader and helper and take a lone caller's call of
    `batch` measurements apart (LONE_ROWS), all rows interleaved."""
    from veil.client import Client

    with tempfile.TemporaryDirectory(prefix="veil-bench-lone-") as tmp:
        tasks = {"count": (VdafSpec("count"), DpSpec("none"), {"min_batch_size": 1})}
        with LocalDeployment.start(Path(tmp), tasks) as dep:
            task = dep.tasks["count"].client

            def box(name: str) -> str:
                return str(Path(tmp) / f"{name}.outbox")

            async def main() -> _Samples:
                async with (
                    AsyncClient(task) as client,
                    _BuildThenSend(task) as before,
                    AsyncClient(task, outbox=box("after")) as boxed,
                    _BuildThenSend(task, outbox=box("before")) as boxed_before,
                ):
                    with Client(task) as blocking, Client(task, outbox=box("one")) as one:
                        clients = _LoneClients(client, before, blocking, boxed, boxed_before, one)
                        return await _lone_rows(clients, task, batch, calls, rounds)

            cpu, wall, parts, parts_1000 = asyncio.run(main())
    return LoneCosts(
        batch,
        calls,
        rounds,
        {k: statistics.median(v) for k, v in cpu.items()},
        {k: statistics.median(v) for k, v in wall.items()},
        statistics.median(parts),
        statistics.median(parts_1000),
    )


# -- what building a report costs against its parts (issue 28) ----------------


@dataclass(frozen=True)
class BuildCosts:
    """CPU microseconds per report, medians of interleaved runs in one process."""

    vdaf: str
    reports: int
    seal_us: float  # one HPKE seal (the key loaded once)
    floor_us: float  # the parts: batched shard plus two seals
    prepare_us: float  # prepare_reports (what Client and AsyncClient call)
    request_us: float  # prepare_reports and the upload request's bytes
    outbox_us: float  # prepare_reports and Outbox.add (SQLite, one transaction)


BUILD_VDAFS: dict[str, tuple[VdafSpec, Callable[[int], int]]] = {
    "count": (VdafSpec("count"), lambda i: i % 2),
    "sum": (VdafSpec("sum", max_measurement=255), lambda i: i % 256),
    "histogram": (VdafSpec("histogram", length=100, chunk_length=10), lambda i: i % 100),
}


def _parts(vdaf: str, reports: int) -> Callable[[], None]:
    """The parts of `reports` reports (a batched shard and two HPKE seals
    each, keys loaded once), as a function to time."""
    import secrets

    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

    from veil.hpke import _SUITE, generate_keypair
    from veil.messages import REPORT_ID_SIZE, vdaf_ctx
    from veil.vdaf.batch.prio3 import BatchPrio3

    spec, value = BUILD_VDAFS[vdaf]
    batch = BatchPrio3(spec.instantiate())
    measurements = [value(i) for i in range(reports)]
    ctx = vdaf_ctx(secrets.token_bytes(32))
    leader_pk, helper_pk = (
        X25519PublicKey.from_public_bytes(generate_keypair(i).config.public_key) for i in (1, 2)
    )
    info = bytes(64)  # the size of a Count report's context

    def parts() -> None:
        ids = [secrets.token_bytes(REPORT_ID_SIZE) for _ in range(reports)]
        rands = [secrets.token_bytes(batch.vdaf.RAND_SIZE) for _ in range(reports)]
        sharded = batch.shard_batch(ctx, measurements, ids, rands)
        for a, b in zip(*sharded.input_shares, strict=True):
            _SUITE.encrypt(a, leader_pk, info=info)
            _SUITE.encrypt(b, helper_pk, info=info)

    parts()  # compile and warm
    return parts


def build_costs(vdaf: str = "count", reports: int = 1000, runs: int = 5) -> BuildCosts:
    """Report building against its floor, each run measuring every step in turn."""
    import os
    import secrets

    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

    from veil.client.outbox import Outbox
    from veil.client.prepare import prepare_reports
    from veil.hpke import _SUITE, generate_keypair
    from veil.messages.wire import upload_request
    from veil.task import Task
    from veil.vdaf.batch.prio3 import BatchPrio3

    spec, value = BUILD_VDAFS[vdaf]
    leader, helper = generate_keypair(1), generate_keypair(2)
    task = Task(
        task_id=secrets.token_bytes(32),
        vdaf=spec,
        leader_address="127.0.0.1:1",
        helper_address="127.0.0.1:2",
        min_batch_size=1,
        dp=DpSpec("none"),
        collector_hpke_config=generate_keypair(3).config,
    )
    batch = BatchPrio3(spec.instantiate())
    measurements = [value(i) for i in range(reports)]
    leader_pk = X25519PublicKey.from_public_bytes(leader.config.public_key)
    info = bytes(64)  # the size of a Count report's context
    prepare_reports(task, measurements[:10], leader.config, helper.config, 0, batch=batch)

    parts = _parts(vdaf, reports)

    def seals() -> None:
        for _ in range(reports):
            _SUITE.encrypt(b"x" * 40, leader_pk, info=info)

    def prepare() -> list[Any]:
        return prepare_reports(task, measurements, leader.config, helper.config, 0, batch=batch)

    def request() -> None:
        upload_request(task.task_id, prepare()).SerializeToString()

    samples: dict[str, list[float]] = {k: [] for k in ("seal", "floor", "prep", "req", "box")}
    with tempfile.TemporaryDirectory(prefix="veil-bench-build-") as tmp:
        for run_index in range(runs):
            outbox = Outbox(os.path.join(tmp, f"outbox-{run_index}.db"))

            def stored() -> None:
                outbox.add(task.task_id, prepare())  # noqa: B023 (called right here)

            for key, step in (
                ("seal", seals),
                ("floor", parts),
                ("prep", prepare),
                ("req", request),
                ("box", stored),
            ):
                start = time.process_time()
                step()
                samples[key].append((time.process_time() - start) / reports * 1e6)
            outbox.close()
    med = {k: statistics.median(v) for k, v in samples.items()}
    return BuildCosts(vdaf, reports, med["seal"], med["floor"], med["prep"], med["req"], med["box"])
