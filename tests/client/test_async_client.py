"""`AsyncClient` against a real leader and helper: the surface of `Client`,
shared by many tasks of one loop, CPU work in its executor, the same errors;
and `Client` shared by threads."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import grpc
import pytest

from tests.support.deployment import Deployment, free_port, start_deployment
from tests.support.times import past_bucket
from veil.client import AsyncClient, Client, ClientOptions, UploadError, UploadResult
from veil.hpke import ROLE_HELPER, ROLE_LEADER, generate_keypair
from veil.messages.wire import hpke_configs_to_pb
from veil.protocol.v1.leader_pb2 import UploadRequest, UploadResponse
from veil.task import DpSpec, VdafSpec

TP = 3600


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    d = start_deployment(
        tmp_path_factory.mktemp("async"),
        {
            "count": (VdafSpec("count"), DpSpec("none"), {"min_batch_size": 1}),
            "sum": (VdafSpec("sum", max_measurement=10), DpSpec("none"), {"min_batch_size": 1}),
        },
    )
    try:
        yield d
    finally:
        d.stop()


class CountingExecutor(ThreadPoolExecutor):
    """A thread pool that remembers which threads ran its work."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.threads: set[int] = set()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        def run() -> Any:
            self.threads.add(threading.get_ident())
            return fn(*args, **kwargs)

        return super().submit(run)


def test_same_surface_as_the_blocking_client(dep: Deployment) -> None:
    task = dep.tasks["sum"].client
    before = dep.stored_reports("sum")
    executor = CountingExecutor()

    async def run() -> None:
        loop_thread = threading.get_ident()
        async with AsyncClient(task, executor=executor) as client:
            with Client(task) as blocking:
                for role in (ROLE_LEADER, ROLE_HELPER):
                    assert await client.hpke_config(role) == blocking.hpke_config(role)
            assert (await client.upload(3, past_bucket(1))).accepted == 1
            assert (await client.upload_batch([1, 2, 10], past_bucket(1))).accepted == 3
            reports = await client.build_reports([4, 5], past_bucket(1))
            assert all(r.time == past_bucket(1) for r in reports)
            assert (await client.upload_reports(reports)).accepted == 2
            again = await client.upload_reports(reports)  # a resend: acknowledged, not stored
            assert (again.accepted, again.duplicates) == (0, 2)
            assert (await client.build_report(7)).time == client.report_time()
            with pytest.raises(ValueError):
                await client.upload(11)
        # Sharding and sealing ran in the executor, never on the loop's thread.
        assert executor.threads and loop_thread not in executor.threads

    asyncio.run(run())
    executor.shutdown()
    assert dep.stored_reports("sum") == before + 6


def test_one_client_shared_by_many_tasks(dep: Deployment) -> None:
    task = dep.tasks["count"].client
    before = dep.stored_reports("count")

    async def run() -> list[Any]:
        async with AsyncClient(task) as client:
            singles = [client.upload(i % 2, past_bucket(2)) for i in range(40)]
            batches = [client.upload_batch([1] * 5, past_bucket(2)) for _ in range(4)]
            return await asyncio.gather(*singles, *batches)

    results = asyncio.run(run())
    assert sum(r.accepted for r in results) == 60
    assert sum(r.duplicates for r in results) == 0
    assert dep.stored_reports("count") == before + 60


def test_errors_are_the_blocking_clients(dep: Deployment) -> None:
    files = dep.tasks["count"]
    # A task the leader does not know: refused for good, not retried.
    unknown = replace(files.client, task_id=bytes(32))
    closed = f"127.0.0.1:{free_port()}"
    unreachable = replace(files.client, leader_address=closed, helper_address=closed)

    async def run() -> None:
        async with AsyncClient(unknown) as client:
            with pytest.raises(UploadError) as refused:
                await client.upload(1)
        assert refused.value.code == grpc.StatusCode.NOT_FOUND
        assert not refused.value.retryable
        async with AsyncClient(unreachable, retries=1, backoff=0.01) as client:
            with pytest.raises(UploadError) as down:
                await client.upload(1)
        assert down.value.code == grpc.StatusCode.UNAVAILABLE and down.value.retryable

    asyncio.run(run())
    with Client(unknown) as blocking, pytest.raises(UploadError) as refused_too:
        blocking.upload(1)
    assert refused_too.value.code == grpc.StatusCode.NOT_FOUND


def test_options_as_one_value_or_as_keywords(dep: Deployment) -> None:
    files = dep.tasks["count"]
    closed = f"127.0.0.1:{free_port()}"
    unreachable = replace(files.client, leader_address=closed, helper_address=closed)
    options = ClientOptions(retries=2, backoff=0.01)
    assert ClientOptions.given(None, {"retries": 2, "backoff": 0.01}) == options
    assert ClientOptions.given(options, {"retries": 0}) == replace(options, retries=0)
    # Both clients make the attempts the options say, given as a value or as
    # keywords over one.
    with Client(unreachable, options) as client, pytest.raises(UploadError) as three:
        client.upload(1)
    assert "(3 attempts)" in str(three.value)

    async def run() -> UploadError:
        async with AsyncClient(unreachable, options, retries=0) as client:
            with pytest.raises(UploadError) as one:
                await client.upload(1)
        return one.value

    assert "(1 attempts)" in str(asyncio.run(run()))
    # A setting that is not one, and one out of range, are refused by both.
    for make in (Client, AsyncClient):
        with pytest.raises(TypeError, match="retrys"):
            make(files.client, retrys=1)
        with pytest.raises(ValueError, match="batch_size"):
            make(files.client, ClientOptions(batch_size=0))


def test_blocking_client_shared_by_threads(dep: Deployment) -> None:
    """`Client` is documented thread-safe: threads sharing one upload every report once."""
    task = dep.tasks["count"].client
    before = dep.stored_reports("count")
    with Client(task) as client, ThreadPoolExecutor(max_workers=8) as pool:
        jobs = [pool.submit(client.upload, 1, past_bucket(3)) for _ in range(40)]
        jobs += [pool.submit(client.upload_batch, [0, 1, 1], past_bucket(3)) for _ in range(8)]
        results = [j.result() for j in jobs]
    assert sum(r.accepted for r in results) == 64
    assert dep.stored_reports("count") == before + 64


def test_gathered_single_uploads_keep_their_own_errors(dep: Deployment) -> None:
    """Concurrent `upload` calls ride shared requests; an invalid measurement
    fails its own call only, and every valid one is stored once."""
    task = dep.tasks["sum"].client
    before = dep.stored_reports("sum")

    async def run() -> list[Any]:
        async with AsyncClient(task, batch_size=16) as client:
            values = [i % 11 for i in range(60)]
            values[7] = values[42] = 11  # above max_measurement
            return await asyncio.gather(
                *(client.upload(v, past_bucket(4)) for v in values), return_exceptions=True
            )

    results = asyncio.run(run())
    errors = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
    assert errors == [7, 42] and all(isinstance(results[i], ValueError) for i in errors)
    assert all(r == UploadResult(1, 0) for r in results if not isinstance(r, BaseException))
    assert dep.stored_reports("sum") == before + 58


class SubmissionCounter(ThreadPoolExecutor):
    """A thread pool that counts the work handed to it."""

    def __init__(self, workers: int = 2) -> None:
        super().__init__(max_workers=workers)
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def test_small_batches_are_gathered_and_keep_their_own_errors(dep: Deployment) -> None:
    """Concurrent `upload_batch` calls smaller than a request share requests
    (fewer shardings than calls); an invalid measurement fails its own call,
    named by its place in that call, and every other report is stored once."""
    task = dep.tasks["sum"].client
    before = dep.stored_reports("sum")
    executor = SubmissionCounter()

    async def run() -> list[Any]:
        async with AsyncClient(task, batch_size=16, executor=executor) as client:
            for role in (ROLE_LEADER, ROLE_HELPER):
                await client.hpke_config(role)
            executor.submitted = 0
            calls = [[(3 * i + j) % 11 for j in range(3)] for i in range(20)]
            calls[5][1] = 11  # above max_measurement
            return await asyncio.gather(
                *(client.upload_batch(c, past_bucket(6)) for c in calls), return_exceptions=True
            )

    results = asyncio.run(run())
    executor.shutdown()
    assert isinstance(results[5], ValueError) and "measurement 1:" in str(results[5])
    assert all(r == UploadResult(3, 0) for i, r in enumerate(results) if i != 5)
    assert dep.stored_reports("sum") == before + 57
    # 60 measurements in requests of at most 16: four or five shardings, and
    # the failed one's group again call by call; one per call would be 20.
    assert executor.submitted < 15


def test_a_refused_call_does_not_fail_the_calls_it_was_gathered_with(dep: Deployment) -> None:
    """The leader refuses a request whole for one report's time (days ahead):
    only the call that brought it fails, the others are sent again alone
    and stored once."""
    task = dep.tasks["count"].client
    before = dep.stored_reports("count")
    ahead = past_bucket(-240)

    async def run() -> list[Any]:
        async with AsyncClient(task, batch_size=16) as client:
            times = [past_bucket(7)] * 6
            times[2] = ahead
            return await asyncio.gather(
                *(client.upload_batch([1, 0, 1], t) for t in times),
                client.upload(1, ahead),
                client.upload(1, past_bucket(7)),
                return_exceptions=True,
            )

    results = asyncio.run(run())
    assert [i for i, r in enumerate(results) if isinstance(r, BaseException)] == [2, 6]
    for i in (2, 6):
        error = results[i]
        assert isinstance(error, UploadError) and error.code == grpc.StatusCode.OUT_OF_RANGE
    assert [r for i, r in enumerate(results) if i not in (2, 6)] == [UploadResult(3, 0)] * 5 + [
        UploadResult(1, 0)
    ]
    assert dep.stored_reports("count") == before + 16


def test_a_call_cancelled_before_its_request_is_not_sent(dep: Deployment) -> None:
    """A caller that gave up (cancelled while its call waited to be gathered)
    has nothing stored: trying again would count it twice."""
    task = dep.tasks["count"].client
    before = dep.stored_reports("count")

    async def run() -> UploadResult:
        async with AsyncClient(task, batch_size=16) as client:
            dropped = asyncio.create_task(client.upload_batch([1, 1, 1, 1], past_bucket(8)))
            kept = asyncio.create_task(client.upload_batch([1, 0], past_bucket(8)))
            await asyncio.sleep(0)  # both calls wait to be gathered
            dropped.cancel()
            with pytest.raises(asyncio.CancelledError):
                await dropped
            return await kept

    assert asyncio.run(run()) == UploadResult(2, 0)
    assert dep.stored_reports("count") == before + 2


def test_inside_a_web_applications_event_loop(dep: Deployment) -> None:
    """A Starlette app under uvicorn opens one AsyncClient in its lifespan and
    awaits uploads in its handlers, many requests at once."""
    import contextlib
    import urllib.request
    from collections.abc import AsyncIterator

    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    task = dep.tasks["count"].client
    before = dep.stored_reports("count")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with AsyncClient(task) as client:
            app.state.client = client
            yield

    async def answer(request: Request) -> JSONResponse:
        value = int(await request.body())
        result = await request.app.state.client.upload(value, past_bucket(5))
        return JSONResponse({"accepted": result.accepted})

    app = Starlette(routes=[Route("/answer", answer, methods=["POST"])], lifespan=lifespan)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)

        def post(value: int) -> Any:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/answer", data=str(value).encode(), method="POST"
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.read()

        with ThreadPoolExecutor(max_workers=16) as pool:
            bodies = list(pool.map(post, [i % 2 for i in range(48)]))
    finally:
        server.should_exit = True
        thread.join(30)
    assert all(b == b'{"accepted":1}' for b in bodies)
    assert dep.stored_reports("count") == before + 48


# --- a lone caller: built and sent in one worker thread ---------------------------


class HostileLeader:
    """A leader (and helper) on loopback that serves HPKE configs and answers
    uploads as `mode` says: "store" (accepts them), "silent" (never answers
    while the test runs), "garbage" (bytes that are no UploadResponse),
    "flaky" (UNAVAILABLE once, then accepts)."""

    def __init__(self) -> None:
        self.mode = "store"
        self.uploads: list[int] = []  # reports per UploadReports call received
        self.release = threading.Event()
        configs = hpke_configs_to_pb([generate_keypair(1).config]).SerializeToString()

        def config(request: bytes, context: grpc.ServicerContext) -> bytes:
            return configs

        def upload(request: bytes, context: grpc.ServicerContext) -> bytes:
            n = len(UploadRequest.FromString(request).reports)
            self.uploads.append(n)
            if self.mode == "silent":
                self.release.wait(30)
                context.abort(grpc.StatusCode.UNAVAILABLE, "gone")
            if self.mode == "garbage":
                return b"\x07\xff\xff"
            if self.mode == "flaky" and len(self.uploads) == 1:
                context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
            return UploadResponse(accepted=n).SerializeToString()

        def handler(service: str, methods: dict[str, Any]) -> grpc.GenericRpcHandler:
            return grpc.method_handlers_generic_handler(
                service, {k: grpc.unary_unary_rpc_method_handler(v) for k, v in methods.items()}
            )

        self.server = grpc.server(ThreadPoolExecutor(max_workers=4))
        leader = {"GetHpkeConfig": config, "UploadReports": upload}
        self.server.add_generic_rpc_handlers(
            (
                handler("veil.protocol.v1.Leader", leader),
                handler("veil.protocol.v1.Helper", {"GetHpkeConfig": config}),
            )
        )
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def stop(self) -> None:
        self.release.set()
        self.server.stop(None)


@pytest.fixture
def hostile(dep: Deployment) -> Iterator[tuple[HostileLeader, Any]]:
    leader = HostileLeader()
    task = replace(dep.tasks["count"].client, leader_address=leader.address)
    task = replace(task, helper_address=leader.address)
    try:
        yield leader, task
    finally:
        leader.stop()


def test_a_lone_caller_waits_off_the_loop(hostile: tuple[HostileLeader, Any]) -> None:
    """A lone call's request waits for a leader that never answers in a
    worker thread: the loop keeps running, and the deadline ends the call
    with DEADLINE_EXCEEDED."""
    leader, task = hostile
    leader.mode = "silent"
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    async def run() -> tuple[UploadError, float]:
        async with AsyncClient(task, timeout=1.0, retries=0) as client:
            await client.hpke_config(ROLE_LEADER)
            await client.hpke_config(ROLE_HELPER)
            ticking = asyncio.create_task(ticker())
            began = time.monotonic()
            with pytest.raises(UploadError) as failed:
                await client.upload_batch([1] * 10)
            took = time.monotonic() - began
            ticking.cancel()
            return failed.value, took

    error, took = asyncio.run(run())
    assert error.code == grpc.StatusCode.DEADLINE_EXCEEDED and error.retryable
    assert leader.uploads == [10]
    assert 0.9 <= took < 20
    assert ticks >= 10  # about a hundred on an idle machine: the loop never stalled


def test_a_lone_caller_refuses_a_garbage_answer(hostile: tuple[HostileLeader, Any]) -> None:
    """An answer that is no UploadResponse fails the call at once (not
    retried), whether the lone call's worker thread or grpc.aio read it."""
    leader, task = hostile
    leader.mode = "garbage"

    async def run() -> list[UploadError]:
        errors = []
        async with AsyncClient(task, timeout=10, retries=3, backoff=0.01) as client:
            with pytest.raises(UploadError) as lone:
                await client.upload_batch([1, 0, 1])
            errors.append(lone.value)
            reports = await client.build_reports([1, 1])
            with pytest.raises(UploadError) as on_aio:
                await client.upload_reports(reports)
            errors.append(on_aio.value)
        return errors

    errors = asyncio.run(run())
    assert all(e.code == grpc.StatusCode.INTERNAL and not e.retryable for e in errors)
    assert leader.uploads == [3, 2]


def test_a_lone_callers_retry_goes_out_unchanged(hostile: tuple[HostileLeader, Any]) -> None:
    """The first attempt fails in the worker thread; the retry (on grpc.aio)
    sends the same request and the caller gets its count."""
    leader, task = hostile
    leader.mode = "flaky"

    async def run() -> list[UploadResult]:
        async with AsyncClient(task, retries=2, backoff=0.01) as client:
            return [await client.upload_batch([1] * 4), await client.upload_batch([0] * 2)]

    assert asyncio.run(run()) == [UploadResult(4, 0), UploadResult(2, 0)]
    assert leader.uploads == [4, 4, 2]


def test_a_lone_call_cancelled_while_built_is_not_sent(
    hostile: tuple[HostileLeader, Any],
) -> None:
    """A lone caller that gives up while its reports are being built has
    nothing sent, though building and sending happen in one worker thread."""
    leader, task = hostile
    executor = SubmissionCounter(workers=1)
    gate = threading.Event()

    async def run() -> UploadResult:
        async with AsyncClient(task, executor=executor) as client:
            await client.hpke_config(ROLE_LEADER)
            await client.hpke_config(ROLE_HELPER)
            executor.submit(gate.wait, 30)  # the one worker is busy: the build waits
            dropped = asyncio.create_task(client.upload_batch([1, 1, 1]))
            while executor.submitted < 2:  # until the call is handed off
                await asyncio.sleep(0.001)
            dropped.cancel()
            with pytest.raises(asyncio.CancelledError):
                await dropped
            gate.set()
            await asyncio.get_running_loop().run_in_executor(executor, int)  # the build is done
            return await client.upload_batch([0, 1])

    assert asyncio.run(run()) == UploadResult(2, 0)
    executor.shutdown()
    assert leader.uploads == [2]


def test_closing_the_client_ends_a_call_that_waits(hostile: tuple[HostileLeader, Any]) -> None:
    """A call waiting for a leader that does not answer fails with CANCELLED
    when the client is closed, rather than waiting out its deadline and
    retries on channels opened again."""
    leader, task = hostile
    leader.mode = "silent"

    async def run() -> tuple[BaseException | UploadResult, float]:
        client = AsyncClient(task, timeout=60, retries=3, backoff=0.01)
        waiting = asyncio.create_task(client.upload_batch([1, 0]))
        deadline = time.monotonic() + 30
        while not leader.uploads:  # the request reached the leader
            assert time.monotonic() < deadline, "the upload never arrived"
            await asyncio.sleep(0.01)
        began = time.monotonic()
        await client.close()
        outcome = (await asyncio.wait_for(asyncio.gather(waiting, return_exceptions=True), 20))[0]
        return outcome, time.monotonic() - began

    outcome, took = asyncio.run(run())
    assert isinstance(outcome, UploadError) and outcome.code == grpc.StatusCode.CANCELLED
    assert "closed" in str(outcome) and took < 10
    assert leader.uploads == [2]


def test_a_lone_caller_with_an_outbox(hostile: tuple[HostileLeader, Any], tmp_path: Any) -> None:
    """With an outbox, a lone call is built, stored and flushed in one worker
    thread: a first attempt that fails there is retried on grpc.aio and the
    flush goes on; a leader that does not answer leaves the reports pending
    in the outbox, and a later flush delivers them."""
    leader, task = hostile
    box = tmp_path / "lone.outbox"

    async def run() -> list[UploadResult]:
        results = []
        async with AsyncClient(task, outbox=box, retries=2, backoff=0.01) as client:
            results.append(await client.upload_batch([1, 1]))
            leader.mode = "flaky"
            leader.uploads.clear()
            results.append(await client.upload_batch([1] * 4))
        leader.mode = "silent"
        async with AsyncClient(task, outbox=box, timeout=0.5, retries=0) as client:
            results.append(await client.upload_batch([0] * 3))
            leader.mode = "store"
            results.append(await client.flush())
        return results

    stored, flaky, silent, later = asyncio.run(run())
    assert (stored.accepted, stored.pending, stored.error) == (2, 0, None)
    assert (flaky.accepted, flaky.pending, flaky.error) == (4, 0, None)
    assert (silent.accepted, silent.pending) == (0, 3) and "DEADLINE_EXCEEDED" in str(silent.error)
    assert (later.accepted, later.pending) == (3, 0)
    assert leader.uploads == [4, 4, 3, 3]


def test_a_one_thread_pool_sends_on_the_loop(hostile: tuple[HostileLeader, Any]) -> None:
    """With a pool of its own of one thread, the client does not hold that
    thread for a lone call's wait: while the leader does not answer a first
    call, a second call is still built (its request reaches the leader)."""
    leader, task = hostile
    leader.mode = "silent"

    async def run() -> list[int]:
        async with AsyncClient(task, workers=1, timeout=20, retries=0) as client:
            await client.hpke_config(ROLE_LEADER)
            await client.hpke_config(ROLE_HELPER)
            first = asyncio.create_task(client.upload_batch([1, 1]))
            deadline = time.monotonic() + 15
            while not leader.uploads:
                assert time.monotonic() < deadline, "the first upload never arrived"
                await asyncio.sleep(0.01)
            second = asyncio.create_task(client.upload_batch([0, 0, 0]))
            while len(leader.uploads) < 2:
                assert time.monotonic() < deadline, "the second call was not built"
                await asyncio.sleep(0.01)
            seen = list(leader.uploads)
            leader.release.set()  # the silent leader now fails both calls
            await asyncio.gather(first, second, return_exceptions=True)
            return seen

    assert asyncio.run(run()) == [2, 3]
