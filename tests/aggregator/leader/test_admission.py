"""Admission control (issue 26): the leader's backlog is bounded, uploads
above it are refused as retryable with advice on when to come back, nothing
of a refused upload is stored, and the stock clients honour the advice.

The logic runs on each storage backend (SQLite, a real PostgreSQL); the
wire and the clients against a real gRPC server on loopback."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest

from tests.support.backends import Backend
from tests.support.in_process import NOW, InProcessHelper, T
from veil.aggregator.errors import Overloaded
from veil.aggregator.helper import Helper
from veil.aggregator.leader import Leader
from veil.aggregator.leader.admission import AdmissionLimits, Backlog
from veil.aggregator.leader.settings import LeaderParts, LeaderSettings
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.run.config import ConfigError, load_config
from veil.aggregator.run.service import HelperService, LeaderService, add_service
from veil.aggregator.run.transport import CallContext, ConnectionLimits, RpcServer, UnaryMethod
from veil.client import AsyncClient, Client, RetryPolicy, UploadError, prepare_reports
from veil.grpc_util import ERROR_KIND_KEY, RETRY_AFTER_KEY, RETRYABLE_KEY, RpcRefused
from veil.messages import Report
from veil.messages.wire import upload_request
from veil.protocol.v1 import helper_pb2, leader_pb2, leader_pb2_grpc
from veil.task import DpSpec, TaskFiles, VdafSpec, new_task


class Leaders:
    """A leader (and an in-process helper) on one backend, with its task(s)."""

    def __init__(self, backend: Backend, limits: AdmissionLimits, tasks: int = 1) -> None:
        self.files = [
            new_task(
                VdafSpec("count"), "127.0.0.1:1", "127.0.0.1:2", min_batch_size=1, dp=DpSpec("none")
            )
            for _ in range(tasks)
        ]
        self.store = backend.store("leader")
        helper = Helper(
            {f.helper.task_id: f.helper for f in self.files},
            backend.store("helper"),
            PrivacyEngine(
                backend.ledger("helper"), [f.helper for f in self.files], allow_exact_release=True
            ),
            clock=lambda: NOW,
        )
        self.helper = helper
        self.leader = Leader(
            {f.leader.task_id: f.leader for f in self.files},
            LeaderParts(
                self.store,
                InProcessHelper(helper),
                PrivacyEngine(
                    backend.ledger("leader"),
                    [f.leader for f in self.files],
                    allow_exact_release=True,
                ),
                clock=lambda: NOW,
            ),
            LeaderSettings(job_size=50, admission=limits),
        )

    def reports(self, n: int, task: int = 0) -> list[Report]:
        return prepare_reports(
            self.files[task].client,
            [1] * n,
            self.leader.current_config,
            self.helper.current_config,
            T,
        )

    def stored(self, task: int = 0) -> int:
        counts = self.store.report_counts(self.files[task].client.task_id, 3600)
        return sum(n for states in counts.values() for n in states.values())

    def upload(self, n: int, task: int = 0) -> tuple[int, int]:
        return self.leader.upload(self.files[task].client.task_id, self.reports(n, task))

    def aggregate(self) -> None:
        while self.leader.run_once():
            pass


LIMITS = AdmissionLimits(
    max_pending_reports=0, max_pending_per_task=10, retry_after_seconds=3, recount_seconds=0
)


def test_uploads_above_the_backlog_are_refused_and_nothing_is_stored(backend: Backend) -> None:
    w = Leaders(backend, LIMITS)
    assert w.upload(6) == (6, 0)
    # Below the limit an upload is taken whatever its size: the backlog
    # exceeds the limit by at most one request.
    assert w.upload(6) == (6, 0)
    for n in (1, 30):
        with pytest.raises(Overloaded) as refused:
            w.upload(n)
        e = refused.value
        assert (e.status, e.retryable, e.kind, e.retry_after) == (
            "UNAVAILABLE",
            True,
            "overloaded",
            3,
        )
        # Neither the count nor the limit is told to the client.
        assert "12" not in str(e) and "10" not in str(e)
    assert w.stored() == 12
    # Once the driver has aggregated them, uploads are taken again.
    w.aggregate()
    assert w.upload(9) == (9, 0)
    assert w.stored() == 21


def test_the_total_spans_the_tasks(backend: Backend) -> None:
    w = Leaders(
        backend,
        AdmissionLimits(max_pending_reports=8, max_pending_per_task=0, recount_seconds=0),
        2,
    )
    assert w.upload(8, task=0) == (8, 0)
    with pytest.raises(Overloaded):
        w.upload(1, task=1)
    assert w.stored(1) == 0
    w.aggregate()
    assert w.upload(1, task=1) == (1, 0)


def test_zero_means_no_limit(backend: Backend) -> None:
    w = Leaders(
        backend, AdmissionLimits(max_pending_reports=0, max_pending_per_task=0, recount_seconds=0)
    )
    for _ in range(3):
        assert w.upload(40) == (40, 0)


def test_refused_and_failed_uploads_free_their_reservation(backend: Backend) -> None:
    w = Leaders(backend, LIMITS)
    # An upload refused for its content reserves nothing for long.
    with pytest.raises(Exception, match="no report"):
        w.leader.upload(w.files[0].client.task_id, [])
    assert w.leader.backlog.pending(w.files[0].client.task_id) == 0
    assert w.upload(5) == (5, 0)
    # A resend of stored reports is acknowledged and adds nothing.
    reports = w.reports(2)
    w.leader.upload(w.files[0].client.task_id, reports)
    assert w.leader.upload(w.files[0].client.task_id, reports) == (0, 2)
    assert w.leader.backlog.pending(w.files[0].client.task_id) == 7


def test_the_estimate_never_undercounts_under_concurrent_uploads(backend: Backend) -> None:
    limits = AdmissionLimits(max_pending_reports=0, max_pending_per_task=200, recount_seconds=0)
    w = Leaders(backend, limits)
    task_id = w.files[0].client.task_id
    batches = [w.reports(7) for _ in range(48)]
    outcomes: list[str] = []

    def send(reports: list[Report]) -> None:
        try:
            w.leader.upload(task_id, reports)
            outcomes.append("stored")
        except Overloaded:
            outcomes.append("refused")

    with futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(send, batches))
    stored = w.stored()
    assert stored == 7 * outcomes.count("stored")
    assert "refused" in outcomes
    # Admitted only below the limit: at most one request beyond it. The
    # estimate errs towards refusing (a request stored while the backlog was
    # counted may be counted twice until the next count), never the other way.
    assert stored < 200 + 7
    assert w.leader.backlog.pending(task_id) >= stored


def test_the_backlog_is_counted_at_most_every_period(backend: Backend) -> None:
    # A second estimate of the leader's backlog, as another upload front end
    # on the same database keeps it; its clock is the test's.
    w = Leaders(backend, AdmissionLimits(max_pending_reports=0, max_pending_per_task=0))
    task_id = w.files[0].client.task_id
    now = [0.0]
    counts: list[Mapping[bytes, int]] = []

    def count() -> Mapping[bytes, int]:
        # Counting takes 0.1 s by this clock: the period stretches to 2 s.
        now[0] += 0.1
        counts.append(w.leader.writer.count_backlog())
        return counts[-1]

    limits = AdmissionLimits(max_pending_reports=0, max_pending_per_task=25, recount_seconds=1)
    other = Backlog(limits, count, clock=lambda: now[0])

    def admit(n: int) -> None:
        other.reserve(task_id, n)
        stored = w.upload(n)[0] if n else 0
        other.settle(task_id, n, stored)

    admit(0)
    assert len(counts) == 1 and other.pending(task_id) == 0
    w.upload(10)  # through the leader: not seen by the other until it counts
    now[0] += 1.5
    admit(5)  # within the stretched period: not counted, its own 5 added
    assert len(counts) == 1 and other.pending(task_id) == 5
    now[0] += 1.0
    admit(0)
    # Counted again: the leader's 10 seen, its own 5 no longer added twice.
    assert len(counts) == 2 and other.pending(task_id) == 15
    w.upload(10)
    now[0] += 2.5
    with pytest.raises(Overloaded):
        other.reserve(task_id, 1)
    assert len(counts) == 3 and other.pending(task_id) == 25


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError):
        AdmissionLimits(max_pending_reports=-1)
    with pytest.raises(ValueError):
        AdmissionLimits(retry_after_seconds=-1)


# --- configuration ---------------------------------------------------------


def _config(tmp_path: Path, admission: str) -> Path:
    path = tmp_path / "leader.toml"
    path.write_text(f'listen = "127.0.0.1:1"\nstorage = "leader.db"\n{admission}')
    return path


def test_admission_settings(tmp_path: Path) -> None:
    assert load_config(_config(tmp_path, "")).admission == AdmissionLimits()
    config = load_config(
        _config(
            tmp_path,
            "[admission]\nmax_pending_reports = 0\nmax_pending_per_task = 7\n"
            "retry_after_seconds = 0.25\nrecount_seconds = 2\n",
        )
    )
    assert config.admission == AdmissionLimits(0, 7, 0.25, 2.0)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("max_pending_reports = -1", "max_pending_reports"),
        ("max_pending_per_task = 1.5", "max_pending_per_task"),
        ("max_pending_per_task = true", "max_pending_per_task"),
        ('retry_after_seconds = "2"', "retry_after_seconds"),
        ("retry_after_seconds = 3601", "at most 3600"),
        ("retry_after_seconds = nan", "retry_after_seconds"),
        ("recount_seconds = -0.5", "recount_seconds"),
        ("max_backlog = 5", "unknown setting 'max_backlog'"),
    ],
)
def test_malformed_admission_settings_are_refused(
    tmp_path: Path, setting: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as refused:
        load_config(_config(tmp_path, f"[admission]\n{setting}\n"))
    assert "leader.toml:" in str(refused.value)


# --- on the wire, and the stock clients ----------------------------------------


@dataclass
class Served:
    leaders: Leaders
    files: TaskFiles
    address: str


@pytest.fixture
def served(backend: Backend) -> Iterator[Served]:
    limits = AdmissionLimits(
        max_pending_reports=0, max_pending_per_task=5, retry_after_seconds=0.3, recount_seconds=0
    )
    w = Leaders(backend, limits)
    servers, addresses = [], []
    for service, servicer in (
        ("Leader", LeaderService(w.leader)),
        ("Helper", HelperService(w.helper)),
    ):
        server = RpcServer(limits=ConnectionLimits(workers=4))
        port = server.add_insecure_port("127.0.0.1:0")
        pb = leader_pb2 if service == "Leader" else helper_pb2
        add_service(server, servicer, pb.DESCRIPTOR.services_by_name[service], None)
        server.start()
        servers.append(server)
        addresses.append(f"127.0.0.1:{port}")
    # The client's task names these servers (the leader drives its helper in process).
    f = w.files[0]
    client_task = replace(f.client, leader_address=addresses[0], helper_address=addresses[1])
    try:
        yield Served(w, TaskFiles(f.leader, f.helper, f.collector, client_task), addresses[0])
    finally:
        for server in servers:
            server.stop(None)


def _fill(s: Served) -> None:
    assert s.leaders.upload(5) == (5, 0)


def test_a_refusal_on_the_wire_is_retryable_with_advice(served: Served) -> None:
    _fill(served)
    stub = leader_pb2_grpc.LeaderStub(grpc.insecure_channel(served.address))  # type: ignore[no-untyped-call]
    with pytest.raises(grpc.RpcError) as refused:
        stub.UploadReports(
            upload_request(served.files.client.task_id, served.leaders.reports(1)), timeout=10
        )
    e = refused.value
    assert e.code() == grpc.StatusCode.UNAVAILABLE
    trailers = dict(e.trailing_metadata())
    assert trailers[ERROR_KIND_KEY] == "overloaded"
    assert trailers[RETRYABLE_KEY] == "1"
    assert trailers[RETRY_AFTER_KEY] == "300"
    assert served.leaders.stored() == 5


def test_the_client_waits_as_advised_then_gives_the_advice_back(served: Served) -> None:
    _fill(served)
    with Client(served.files.client, retries=2, backoff=0.01) as client:
        began = time.monotonic()
        with pytest.raises(UploadError) as refused:
            client.upload_batch([1, 0], T)
        # Two waits, each at least the advised 0.3 s (the backoff alone: 0.03 s).
        assert time.monotonic() - began >= 0.6
        e = refused.value
        assert (e.code, e.kind, e.retryable, e.retry_after) == (
            grpc.StatusCode.UNAVAILABLE,
            "overloaded",
            True,
            0.3,
        )
        assert served.leaders.stored() == 5
        # Advice longer than max_delay is not waited out: handed back at once.
        with Client(served.files.client, retries=5, max_delay=0.1) as impatient:
            began = time.monotonic()
            with pytest.raises(UploadError) as refused:
                impatient.upload_batch([1], T)
            assert time.monotonic() - began < 0.3
            assert refused.value.retry_after == 0.3
        # Room again: the same client's upload is taken.
        served.leaders.aggregate()
        assert client.upload_batch([1, 0], T).accepted == 2


def test_an_outbox_keeps_refused_reports_with_the_advice(served: Served, tmp_path: Path) -> None:
    _fill(served)
    outbox = str(tmp_path / "reports.outbox")
    with Client(served.files.client, outbox=outbox, retries=0) as client:
        result = client.upload_batch([1, 0, 1], T)
        assert (result.accepted, result.pending, result.retry_after) == (0, 3, 0.3)
        assert result.error is not None and "UNAVAILABLE" in result.error
        assert served.leaders.stored() == 5
        served.leaders.aggregate()
        result = client.flush()
        assert (result.accepted, result.pending, result.retry_after) == (3, 0, None)
    assert served.leaders.stored() == 8


def test_the_async_client_waits_as_advised(served: Served) -> None:
    _fill(served)

    async def main() -> None:
        async with AsyncClient(served.files.client, retries=1, backoff=0.01) as client:
            began = time.monotonic()
            with pytest.raises(UploadError) as refused:
                await client.upload_batch([1], T)
            assert time.monotonic() - began >= 0.3
            assert refused.value.kind == "overloaded"

    asyncio.run(main())


def test_advised_waits_are_jittered_upwards() -> None:
    policy = RetryPolicy(retries=5, backoff=0.1, max_delay=30)
    waits = [policy.delay(0, advised=2.0) for _ in range(200)]
    assert all(2.0 <= w < 3.0 for w in waits)
    assert max(waits) - min(waits) > 0.2  # spread, not all at once
    # The exponential backoff still applies when it is the longer.
    assert all(policy.delay(8, advised=0.5) >= 0.5 * min(0.1 * 2**8, 30) for _ in range(50))
    advised = UploadError(grpc.StatusCode.UNAVAILABLE, "busy", "overloaded", True, 31.0)
    assert not policy.should_retry(advised, 0)


# --- the advice as a client reads it: hostile trailers --------------------------


@pytest.fixture(scope="module")
def trailer_server() -> Iterator[str]:
    """A gRPC server whose one method refuses with the trailer value it is sent."""

    def refuse(request: bytes, context: grpc.ServicerContext) -> bytes:
        value = request.decode()
        context.set_trailing_metadata(((RETRYABLE_KEY, "1"), (RETRY_AFTER_KEY, value)))
        context.abort(grpc.StatusCode.UNAVAILABLE, "busy")
        raise AssertionError("unreachable")

    handler = grpc.method_handlers_generic_handler(
        "test.Trailers", {"Refuse": grpc.unary_unary_rpc_method_handler(refuse)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1500", 1.5),
        ("0", 0.0),
        ("3600000", 3600.0),
        ("3600001", None),
        ("99999999999999999999", None),
        ("-5", None),
        ("1e3", None),
        ("1.5", None),
        (" 15", None),
        ("", None),
        ("abc", None),
    ],
)
def test_the_advice_is_read_strictly(
    trailer_server: str, value: str, seconds: float | None
) -> None:
    with grpc.insecure_channel(trailer_server) as channel:
        call = channel.unary_unary("/test.Trailers/Refuse")
        with pytest.raises(grpc.RpcError) as refused:
            call(value.encode(), timeout=10)
    error = RpcRefused.from_rpc(refused.value)
    assert error.retryable and error.retry_after == seconds


# --- requests held in memory: bounded however many clients send ------------------


def test_calls_beyond_the_queue_are_refused_unserved() -> None:
    """With one worker and a queue of one, a third call whose request has
    arrived is refused at once (UNAVAILABLE, busy, retryable), its request
    dropped, while the first two are served once the worker is free."""
    release = threading.Event()
    running = threading.Event()
    served: list[bytes] = []

    def hold(request: bytes, context: CallContext) -> bytes:
        running.set()
        assert release.wait(30)
        served.append(request)
        return request

    unread: list[str] = []
    server = RpcServer(
        limits=ConnectionLimits(workers=1, max_queued_calls=1), on_unread=unread.append
    )
    server.add_unary_service("test.Hold", {"Hold": UnaryMethod(hold)})
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/test.Hold/Hold")
            first = call.future(b"first", timeout=30)
            assert running.wait(30)
            second = call.future(b"second", timeout=30)
            deadline = time.monotonic() + 30
            while server.received < 2:
                assert time.monotonic() < deadline, "the second call never arrived"
                time.sleep(0.01)
            with pytest.raises(grpc.RpcError) as refused:
                call(b"third", timeout=30)
            error = RpcRefused.from_rpc(refused.value)
            assert (error.code, error.kind, error.retryable) == (
                grpc.StatusCode.UNAVAILABLE,
                "busy",
                True,
            )
            assert unread == ["busy"]
            release.set()
            assert (first.result(), second.result()) == (b"first", b"second")
            # Room again: the next call is served.
            assert call(b"fourth", timeout=30) == b"fourth"
        assert served == [b"first", b"second", b"fourth"]
    finally:
        release.set()
        server.stop(None)
