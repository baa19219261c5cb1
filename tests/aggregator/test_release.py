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
from veil.aggregator.maintenance import collect_garbage
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.store.records import CollectionRecord
from veil.client import prepare_reports
from veil.collector import text_agg_param
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

    def __init__(self, backend: Backend, vdaf: VdafSpec | None = None) -> None:
        self.backend = backend
        # One ε = 1 collection is the whole budget: a second charge is refused.
        self.files = new_task(
            vdaf or VdafSpec("sum", max_measurement=10),
            "127.0.0.1:1",
            "127.0.0.1:2",
            dp=DpSpec("geometric", epsilon="1"),
            min_batch_size=2,
        )
        # A Prio3 task's reports and VDAF (World's); a Poplar1 task needs neither.
        self._world = None if self.files.client.vdaf.is_prefix else World(backend, self.files)
        self.start()

    @property
    def world(self) -> World:
        assert self._world is not None
        return self._world

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


# The same points for a Poplar1 level: the helper's store of its release is
# collect_prefix_query, the leader's finish_prefix_collection.
PREFIX_LEADER_POINTS = {
    **LEADER_POINTS,
    "leader stored": lambda d: crash_after(d.leader.store, "finish_prefix_collection"),
}
PREFIX_HELPER_POINTS = {
    **HELPER_POINTS,
    "helper stored": lambda d: crash_after(d.helper.store, "collect_prefix_query"),
}


@pytest.mark.parametrize("point", [*PREFIX_HELPER_POINTS, *PREFIX_LEADER_POINTS])
def test_a_crash_in_a_text_levels_release_is_finished_from_the_first_release(
    backend: Backend, point: str
) -> None:
    """A Poplar1 level: the leader dies at each point of the release, the
    helper's among them (after it released, before the leader stored its
    own). The restarted leader finishes the level with the helper's stored
    share (never a fresh draw), each ledger charged once, and no report of
    the batch deleted meanwhile by garbage collection."""
    d = Deployment(backend, VdafSpec("poplar1", bits=16))
    files = d.files
    task = files.leader
    task_id = task.task_id
    reports = prepare_reports(
        files.client,
        [b"ab", b"ab", b"ac", b"ab", b"cd"],
        d.leader.current_config,
        d.helper.current_config,
        T,
    )
    d.leader.upload(task_id, reports)
    job = secrets.token_bytes(16)
    encoded = task.vdaf.instantiate_poplar1().encode_agg_param(text_agg_param([b"a", b"c"]))
    d.leader.create_collection(task_id, files.collector.collector_token, job, T, TP, encoded)
    {**PREFIX_HELPER_POINTS, **PREFIX_LEADER_POINTS}[point](d)
    with pytest.raises(Crash):
        d.drive()
    stored_helper = d.helper.store.get_collection(task_id, job)
    stored_leader = d.leader.store.get_collection(task_id, job)
    # Upkeep runs while the leader is down: the batch's reports stay.
    for store in (d.leader.store, d.helper.store):
        collect_garbage(store, [task], NOW)
    assert len(d.leader.store.batch_reports(task_id, T, T + TP)) == 5
    d.start()
    d.drive()
    done = d.collection(job)
    assert (done.state, done.report_count) == ("finished", 5), done.error_message
    if stored_helper is not None:
        assert done.helper_ct == stored_helper.helper_ct
    if stored_leader is not None and stored_leader.leader_ct is not None:
        assert done.leader_ct == stored_leader.leader_ct
    charge = task.dp.charge(task.vdaf)
    for privacy in (d.helper_privacy, d.leader_privacy):
        status = privacy.ledger.task_status(files.client.id_text)
        assert (status.spent, status.collections) == (charge, 1)
    # The next level follows as if nothing had happened.
    assert len(d.leader.store.batch_reports(task_id, T, T + TP)) == 5
    job2 = secrets.token_bytes(16)
    encoded2 = task.vdaf.instantiate_poplar1().encode_agg_param(text_agg_param([b"ab"]))
    d.leader.create_collection(task_id, files.collector.collector_token, job2, T, TP, encoded2)
    d.drive()
    assert d.collection(job2).state == "finished", d.collection(job2).error_message
