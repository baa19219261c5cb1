"""Typed errors across the wire: a real helper behind a real gRPC server, the
leader's gRPC client in front of it. The leader re-raises exactly what the
helper raised (its kind travels in the trailing metadata), a call that fails
in gRPC itself is never taken for a refusal by the helper, and the helper's
own database failing is UNAVAILABLE, which callers retry."""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.backends import Backend
from tests.support.in_process import NOW, TP, T, World, verify_init_items
from veil.aggregator.errors import (
    BY_KIND,
    AggregatorError,
    BatchMismatch,
    BudgetExhausted,
    RpcFailed,
    TooLarge,
    Unauthenticated,
    Unavailable,
    from_peer,
)
from veil.aggregator.helper import Helper
from veil.aggregator.leader import Leader
from veil.aggregator.leader.helper_client import GrpcHelperClient
from veil.aggregator.leader.settings import LeaderParts, LeaderSettings
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.run.config import ServerConfig
from veil.aggregator.run.service import HelperService, add_service
from veil.aggregator.run.transport import ConnectionLimits, RpcServer
from veil.aggregator.status import gather, render_text
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.protocol.v1 import helper_pb2
from veil.task import DpSpec, TaskFiles, VdafSpec, new_task


class HelperOverGrpc:
    """A real helper on a loopback port, and the leader's client for it."""

    def __init__(self, tmp: Path, files: TaskFiles, send_limit: int = 4 << 20) -> None:
        self.files = files
        self.db = tmp / "helper.db"
        # A short busy timeout: a write lock held by another process makes
        # the helper's database unavailable within the test's patience.
        self.store = SqliteDatastore(self.db, busy_timeout=0.2)
        self.helper = Helper(
            {files.helper.task_id: files.helper},
            self.store,
            PrivacyEngine(str(tmp / "helper-ledger.db"), [files.helper], allow_exact_release=True),
            clock=lambda: NOW,
        )
        self.server = RpcServer(limits=ConnectionLimits(workers=2))
        add_service(
            self.server,
            HelperService(self.helper),
            helper_pb2.DESCRIPTOR.services_by_name["Helper"],
            None,
        )
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.address = f"127.0.0.1:{port}"
        options = [("grpc.max_send_message_length", send_limit)]
        self.link = GrpcHelperClient(lambda a: grpc.insecure_channel(a, options=options), 10.0)
        # The leader's task names this helper.
        self.task = files.leader.__class__(**{**vars(files.leader), "helper_address": self.address})

    def close(self) -> None:
        self.server.stop(None)
        self.store.close()


def _files(**dp: str) -> TaskFiles:
    spec = DpSpec("geometric", epsilon="1", **dp) if dp else DpSpec("none")
    return new_task(VdafSpec("count"), "127.0.0.1:1", "127.0.0.1:2", dp=spec, min_batch_size=1)


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[HelperOverGrpc]:
    # Each collection spends ε = 1 of a budget of 1/2: the helper refuses every one.
    h = HelperOverGrpc(tmp_path, _files(budget="1/2"))
    yield h
    h.close()


def _aggregate(h: HelperOverGrpc, world: World, n: int) -> tuple[int, bytes]:
    """Aggregate n reports at the helper; its (count, checksum) of the batch."""
    from veil.aggregator.core import batch_summary

    h.link.aggregate(h.task, secrets.token_bytes(16), verify_init_items(world, n))
    _, count, checksum = batch_summary(
        world.vdaf, h.store.batch_aggregates(h.task.task_id, T, T + TP)
    )
    return count, checksum


@pytest.fixture
def world(remote: HelperOverGrpc, tmp_path: Path) -> World:
    # Builds reports sealed to the remote helper's key (World's own helper is unused).
    (tmp_path / "w").mkdir()
    w = World(Backend(tmp_path / "w", None), remote.files)
    w.helper = remote.helper
    return w


def test_every_error_class_has_a_kind_and_says_whether_to_retry() -> None:
    assert BY_KIND[Unavailable.kind] is Unavailable and Unavailable.retryable
    assert BY_KIND["budget_exhausted"] is BudgetExhausted and not BudgetExhausted.retryable
    kinds = [cls.kind for cls in BY_KIND.values()]
    assert len(kinds) == len(set(kinds))
    for cls in BY_KIND.values():
        assert issubclass(cls, AggregatorError)
        assert isinstance(cls.retryable, bool)


def test_the_helpers_refusal_arrives_as_what_it_raised(
    remote: HelperOverGrpc, world: World
) -> None:
    count, checksum = _aggregate(remote, world, 3)
    with pytest.raises(BatchMismatch):
        remote.link.aggregate_share(
            remote.task, secrets.token_bytes(16), T, TP, count + 1, checksum
        )
    # The leader knows that it is the budget (RESOURCE_EXHAUSTED, as a message
    # too large for gRPC would be).
    with pytest.raises(BudgetExhausted):
        remote.link.aggregate_share(remote.task, secrets.token_bytes(16), T, TP, count, checksum)
    bad = remote.task.__class__(**{**vars(remote.task), "aggregator_token": "wrong"})
    with pytest.raises(Unauthenticated):
        remote.link.aggregate(bad, secrets.token_bytes(16), [])


def test_a_message_too_large_for_grpc_is_not_a_refusal_by_the_helper(
    tmp_path: Path,
) -> None:
    h = HelperOverGrpc(tmp_path, _files(), send_limit=2048)
    try:
        (tmp_path / "w").mkdir()
        w = World(Backend(tmp_path / "w", None), h.files)
        w.helper = h.helper
        with pytest.raises(AggregatorError) as e:
            h.link.aggregate(h.task, secrets.token_bytes(16), verify_init_items(w, 20))
        # gRPC refused to send it: the helper refused nothing, and it is not
        # about the privacy budget (it arrived as BudgetExhausted before).
        assert type(e.value) is TooLarge, repr(e.value)
        assert "refused" not in str(e.value)
    finally:
        h.close()


def test_the_helpers_database_failing_is_unavailable(remote: HelperOverGrpc, world: World) -> None:
    items = verify_init_items(world, 2)
    other = sqlite3.connect(remote.db, timeout=5, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
    try:
        with pytest.raises(Unavailable) as e:
            remote.link.aggregate(remote.task, secrets.token_bytes(16), items)
        assert "database is unavailable" in str(e.value)
    finally:
        other.execute("ROLLBACK")
        other.close()
    # The same job again, now that the database is back: accepted.
    answer = remote.link.aggregate(remote.task, secrets.token_bytes(16), items)
    assert all(r.verifier_message is not None for r in answer.results)
    # The helper's clock travels with its answer, to the millisecond.
    assert answer.helper_time == NOW


def test_a_peer_that_does_not_say_what_it_raised() -> None:
    assert type(from_peer("UNAVAILABLE", "down", None, "the helper")) is Unavailable
    assert type(from_peer("DEADLINE_EXCEEDED", "slow", None, "the helper")) is Unavailable
    assert type(from_peer("RESOURCE_EXHAUSTED", "big", None, "the helper")) is TooLarge
    assert type(from_peer("ABORTED", "?", None, "the helper")) is RpcFailed
    assert type(from_peer("INTERNAL", "x", "no_such_kind", "the helper")) is RpcFailed
    assert type(from_peer("RESOURCE_EXHAUSTED", "x", "budget_exhausted", "h")) is BudgetExhausted


def _leader(world: World, remote: HelperOverGrpc, **kwargs: Any) -> Leader:
    """A leader on the world's database (its HPKE key) calling the remote helper."""
    return Leader(
        {remote.task.task_id: remote.task},
        LeaderParts(
            world.leader_store,
            remote.link,
            PrivacyEngine(
                str(world.leader_store.path),  # type: ignore[attr-defined]
                [remote.task],
                allow_exact_release=True,
            ),
            clock=lambda: NOW,
        ),
        LeaderSettings(retry_seconds=0.0, **kwargs),  # retried at the next pass
    )


def test_a_collection_waits_out_the_helpers_database_and_says_why(tmp_path: Path) -> None:
    """Issue 21, item 2: the helper's database locked during a collection. The
    collection stays pending, shown as retrying with the reason, and finishes
    once the database is back, charged once at each aggregator (before: the
    helper answered INTERNAL, the collection failed for good and its batch
    stayed closed)."""
    h = HelperOverGrpc(tmp_path, _files(budget="1"))
    try:
        (tmp_path / "w").mkdir()
        world = World(Backend(tmp_path / "w", None), h.files)
        world.helper = h.helper
        files = h.files
        leader = _leader(world, h)
        task_id = files.client.task_id
        leader.upload(task_id, [world.report(v % 2) for v in range(3)])
        while leader.run_once():
            pass
        job = secrets.token_bytes(16)
        token = files.collector.collector_token
        other = sqlite3.connect(h.db, timeout=5, isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        try:
            leader.create_collection(task_id, token, job, T, TP)
            leader.run_once()
            waiting = leader.get_collection(task_id, token, job)
            assert waiting.state == "pending"
            assert waiting.error_message.startswith("retrying:")
            assert "database is unavailable" in waiting.error_message
            path = Path(world.leader_store.path)  # type: ignore[attr-defined]
            shown = gather(
                "leader",
                ServerConfig("127.0.0.1:1", path, [h.task]),
                world.leader_store,
                leader.privacy.ledger,
            )
            (c,) = shown["tasks"][0]["collections"]
            assert c["state"] == "retrying" and "database is unavailable" in c["error"]
            assert "retrying" in render_text(shown)
            leader.run_once()  # still locked: still waiting, nothing lost
            assert leader.get_collection(task_id, token, job).state == "pending"
        finally:
            other.execute("ROLLBACK")
            other.close()
        leader.run_once()
        done = leader.get_collection(task_id, token, job)
        assert (done.state, done.report_count) == ("finished", 3)
        for ledger in (leader.privacy.ledger, h.helper.privacy.ledger):
            status = ledger.task_status(files.client.id_text)
            assert (status.spent, status.collections) == (1, 1)
    finally:
        h.close()


def test_a_refusal_by_the_helper_leaves_the_batch_collectable(
    remote: HelperOverGrpc, world: World
) -> None:
    """Issue 13, item 5: a count or checksum mismatch (ABORTED) said "retry"
    but closed the batch for good. The leader now asks the helper before it
    spends or draws anything: a refusal leaves nothing released, the batch
    is reopened, and the message says so."""
    leader = _leader(world, remote)
    task = remote.task
    leader.upload(task.task_id, [world.report(1) for _ in range(3)])
    while leader.run_once():
        pass
    # The helper aggregated a report the leader does not know of.
    remote.link.aggregate(task, secrets.token_bytes(16), verify_init_items(world, 1))
    token = remote.files.collector.collector_token
    job = secrets.token_bytes(16)
    # Within the leader's budget of 1/2 nothing is spendable: check at the
    # helper only (the leader's check comes at creation).
    leader.privacy.check = lambda *a, **k: None  # type: ignore[method-assign]
    leader.create_collection(task.task_id, token, job, T, TP)
    leader.run_once()
    done = leader.get_collection(task.task_id, token, job)
    assert done.state == "failed" and done.error_code == 10  # ABORTED
    assert "collected again" in done.error_message
    aggs = world.leader_store.batch_aggregates(task.task_id, T, T + TP)
    assert all(a.collected_by is None for a in aggs)
    assert leader.privacy.ledger.task_status(task.id_text).collections == 0


def test_a_job_that_grpc_cannot_send_is_settled_alone(tmp_path: Path) -> None:
    """Issues 13 and 17: a job too large for gRPC is neither a helper refusal
    nor a budget error; its reports are rejected as job_failed with the
    reason recorded, the pass goes on, and the task's other jobs and its
    collection proceed (before: BudgetExhausted escaped every pass)."""
    h = HelperOverGrpc(tmp_path, _files(), send_limit=6000)
    try:
        (tmp_path / "w").mkdir()
        w = World(Backend(tmp_path / "w", None), h.files)
        w.helper = h.helper
        leader = _leader(w, h, job_size=40)
        task_id = h.files.client.task_id
        # One job of 40 reports (too large to send), then jobs of 2 that fit.
        leader.upload(task_id, [w.report(1) for _ in range(40)])
        assert leader.store.create_aggregation_job(task_id, secrets.token_bytes(16), 40) == 40
        leader.job_sizes[task_id] = 2
        leader.upload(task_id, [w.report(1) for _ in range(4)])
        while leader.run_once():
            pass
        assert leader.store.rejections(task_id) == {"job_failed": 40}
        errors = leader.store.aggregation_job_errors(task_id)
        ((state, _, why),) = errors.values()
        assert state == "failed" and why.startswith("TooLarge: ") and "refused" not in why
        token = h.files.collector.collector_token
        job = secrets.token_bytes(16)
        leader.create_collection(task_id, token, job, T, TP)
        while leader.run_once():
            pass
        done = leader.get_collection(task_id, token, job)
        assert (done.state, done.report_count) == ("finished", 4)
    finally:
        h.close()
