"""Retry-safe DP release: a crash at any point of a collection, at either
aggregator, is followed by a retry that finishes the collection with the
budget charged once at each aggregator, and never with a second noise draw
for a share that may have left (each backend: SQLite and PostgreSQL).

A crash is the real step done and then an exception out of the process's
logic; the "restarted" aggregator is a new Leader or Helper on the same
database and ledger, as a new process would be.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.in_process import NOW, TP, InProcessHelper, T, World
from veil.aggregator.helper import Helper
from veil.aggregator.leader import Leader
from veil.aggregator.leader.settings import LeaderParts, LeaderSettings
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.store.records import CollectionRecord
from veil.task import DpSpec, VdafSpec, new_task


class Crash(BaseException):
    """The process dies here: not an Exception, which the leader's driver
    would take for a fault of one collection and retry after its backoff."""


def crash_after(obj: Any, name: str) -> None:
    """Make obj.name do its work, then crash (once)."""
    real: Callable[..., Any] = getattr(obj, name)

    def crashing(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        setattr(obj, name, real)
        raise Crash(name)

    setattr(obj, name, crashing)


class Deployment:
    """Leader and helper on one backend, started again after each crash."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        # One ε = 1 collection is the whole budget: a second charge is refused.
        self.files = new_task(
            VdafSpec("sum", max_measurement=10),
            "127.0.0.1:1",
            "127.0.0.1:2",
            dp=DpSpec("geometric", epsilon="1"),
            min_batch_size=2,
        )
        self.world = World(backend, self.files)
        self.start()

    def start(self) -> None:
        files, b = self.files, self.backend
        self.helper_privacy = PrivacyEngine(b.ledger("helper"), [files.helper])
        self.helper = Helper(
            {files.helper.task_id: files.helper},
            b.store("helper"),
            self.helper_privacy,
            clock=lambda: NOW,
        )
        self.link = InProcessHelper(self.helper)
        self.leader_privacy = PrivacyEngine(b.ledger("leader"), [files.leader])
        self.leader = Leader(
            {files.leader.task_id: files.leader},
            LeaderParts(b.store("leader"), self.link, self.leader_privacy, clock=lambda: NOW),
            # A restarted leader takes up its own leases.
            LeaderSettings(job_size=4, worker_id="the-leader"),
        )
        # Each engine draws its noise in a thread: a collection driven before
        # a vector is ready is only retried later, which drive() does not wait for.
        for engine in (self.helper_privacy, self.leader_privacy):
            assert engine.pool.wait_ready(60), "no noise drawn within 60 s"

    def drive(self) -> None:
        while self.leader.run_once():
            pass

    def collection(self, job: bytes) -> CollectionRecord:
        files = self.files
        return self.leader.get_collection(
            files.client.task_id, files.collector.collector_token, job
        )


LEADER_POINTS = {
    # After the helper's answer, before the leader's spend.
    "helper answered": lambda d: crash_after(d.link, "aggregate_share"),
    "leader spent": lambda d: crash_after(d.leader_privacy.ledger, "spend"),
    "leader drew noise": lambda d: crash_after(d.leader_privacy.pool, "take"),
    "leader stored": lambda d: crash_after(d.leader.store, "update_collection"),
}
HELPER_POINTS = {
    "helper checked budget": lambda d: crash_after(d.helper_privacy, "check"),
    # The case of the report: the helper's spend recorded, its share not stored.
    "helper spent": lambda d: crash_after(d.helper_privacy.ledger, "spend"),
    "helper drew noise": lambda d: crash_after(d.helper_privacy.pool, "take"),
    # Stored, but the answer never reached the leader.
    "helper stored": lambda d: crash_after(d.helper.store, "commit_helper_collection"),
}


@pytest.mark.parametrize("point", [*HELPER_POINTS, *LEADER_POINTS])
def test_a_crash_at_each_point_of_the_release_is_retried_with_one_charge(
    backend: Backend, point: str
) -> None:
    d = Deployment(backend)
    files = d.files
    task_id = files.client.task_id
    d.leader.upload(task_id, [d.world.report(v) for v in (1, 2, 3, 4, 5)])
    job = secrets.token_bytes(16)
    d.leader.create_collection(task_id, files.collector.collector_token, job, T, TP)
    {**HELPER_POINTS, **LEADER_POINTS}[point](d)
    with pytest.raises(Crash):
        d.drive()
    stored_helper = d.helper.store.get_collection(task_id, job)
    stored_leader = d.leader.store.get_collection(task_id, job)
    d.start()  # both processes again, on the same databases and ledgers
    d.drive()
    done = d.collection(job)
    assert (done.state, done.report_count) == ("finished", 5), done.error_message
    # A share that was stored (and so may have been sent) is the one served.
    if stored_helper is not None:
        assert done.helper_ct == stored_helper.helper_ct
    if stored_leader is not None and stored_leader.leader_ct is not None:
        assert done.leader_ct == stored_leader.leader_ct
    for privacy in (d.helper_privacy, d.leader_privacy):
        status = privacy.ledger.task_status(files.client.id_text)
        assert (status.spent, status.collections) == (1, 1)


def test_a_retry_after_the_helper_spent_is_not_refused_for_its_own_spend(
    backend: Backend,
) -> None:
    """The report's case, at the helper directly: check, spend, crash; the
    same collection job asked again is answered, charged once."""
    d = Deployment(backend)
    task = d.files.helper
    leader_task = d.files.leader
    d.leader.upload(task.task_id, [d.world.report(v) for v in (1, 2)])
    d.drive()  # aggregated at both; no collection yet
    from veil.aggregator.core import batch_summary

    _, count, checksum = batch_summary(
        d.world.vdaf, d.helper.store.batch_aggregates(task.task_id, T, T + TP)
    )
    job = secrets.token_bytes(16)
    crash_after(d.helper_privacy.ledger, "spend")
    with pytest.raises(Crash):
        d.helper.aggregate_share(
            task.task_id, leader_task.aggregator_token, job, T, TP, count, checksum
        )
    d.start()
    ct = d.helper.aggregate_share(
        task.task_id, leader_task.aggregator_token, job, T, TP, count, checksum
    )
    assert ct == d.helper.store.get_collection(task.task_id, job).helper_ct  # type: ignore[union-attr]
    status = d.helper_privacy.ledger.task_status(task.id_text)
    assert (status.spent, status.collections) == (1, 1)
