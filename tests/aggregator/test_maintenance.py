"""Report expiry, garbage collection and key rotation on the real leader and
helper logic in one process, with a clock the test moves, on each storage
backend (SQLite, and a real PostgreSQL)."""

from __future__ import annotations

import secrets
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from tests.support.backends import Backend
from tests.support.in_process import InProcessHelper
from veil.aggregator.errors import BatchCollected, InvalidMessage, ReportTimeRejected
from veil.aggregator.helper import Helper
from veil.aggregator.leader import Leader
from veil.aggregator.leader.settings import LeaderParts, LeaderSettings
from veil.aggregator.maintenance import (
    KeyPolicy,
    advance_keys,
    collect_garbage,
    rotate,
)
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.records import KEY_ACTIVE, KEY_EXPIRED, KEY_PENDING
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.client import prepare_report
from veil.hpke import HpkeConfig
from veil.messages import Report
from veil.task import DpSpec, TaskFiles, VdafSpec, new_task

START = 1_800_000_000
TP = 600
EXPIRY = 3600


class Clock:
    def __init__(self) -> None:
        self.now = float(START)

    def __call__(self) -> float:
        return self.now


class World:
    def __init__(self, backend: Backend, expiry: int | None = EXPIRY) -> None:
        self.files: TaskFiles = new_task(
            VdafSpec("sum", max_measurement=10),
            "127.0.0.1:1",
            "127.0.0.1:2",
            time_precision=TP,
            min_batch_size=1,
            dp=DpSpec("none"),
            report_expiry_age=expiry,
        )
        self.task_id = self.files.client.task_id
        self.clock = Clock()
        self.helper_store = backend.store("helper")
        self.leader_store = backend.store("leader")
        self.helper = Helper(
            {self.task_id: self.files.helper},
            self.helper_store,
            PrivacyEngine(backend.ledger("helper"), [self.files.helper], allow_exact_release=True),
            clock=self.clock,
        )
        self.leader = Leader(
            {self.task_id: self.files.leader},
            LeaderParts(
                self.leader_store,
                InProcessHelper(self.helper),
                PrivacyEngine(
                    backend.ledger("leader"), [self.files.leader], allow_exact_release=True
                ),
                clock=self.clock,
            ),
            LeaderSettings(job_size=50),
        )

    def report(
        self,
        value: int,
        t: int | None = None,
        leader_config: HpkeConfig | None = None,
    ) -> Report:
        if t is None:
            t = int(self.clock.now)
        return prepare_report(
            self.files.client,
            value,
            leader_config or self.leader.current_config,
            self.helper.current_config,
            t,
        )

    def drive(self) -> None:
        while self.leader.run_once():
            pass

    def gc(self) -> None:
        for store in (self.leader_store, self.helper_store):
            collect_garbage(store, [self.files.leader], self.clock.now)

    def aggregated(self) -> int:
        return sum(
            a.report_count for a in self.leader_store.batch_aggregates(self.task_id, 0, 2**62)
        )


@pytest.fixture
def world(backend: Backend) -> World:
    return World(backend)


def test_expired_reports_refused_at_upload_and_dropped_by_helper(world: World) -> None:
    old_time = START - START % TP - EXPIRY - TP
    with pytest.raises(ReportTimeRejected, match="expired"):
        world.leader.upload(world.task_id, [world.report(1), world.report(1, t=old_time)])
    assert world.leader_store.report_counts(world.task_id, TP) == {}  # nothing written
    # A report uploaded just in time but aggregated after it expired is
    # dropped by the helper (its replay record may be gone) and counted as such.
    edge = START - START % TP - EXPIRY
    world.leader.upload(world.task_id, [world.report(1, t=edge)])
    world.clock.now += TP
    world.drive()
    assert world.aggregated() == 0
    assert world.leader_store.rejections(world.task_id) == {"report_dropped": 1}


def test_replays_after_gc_are_refused(world: World) -> None:
    early = [world.report(v % 10) for v in range(20)]
    world.leader.upload(world.task_id, early)
    world.drive()
    # Collect the current bucket: its reports go at the next GC, before they expire.
    token = world.files.collector.collector_token
    bucket = START - START % TP
    world.clock.now += TP
    world.leader.create_collection(world.task_id, token, secrets.token_bytes(16), bucket, TP)
    world.drive()
    world.gc()
    assert world.leader_store.report_counts(world.task_id, TP) == {}
    assert world.helper_store.seen_reports(world.task_id, [r.report_id for r in early]) == set()
    with pytest.raises(BatchCollected):
        world.leader.upload(world.task_id, early[:1])

    # Reports of an uncollected bucket go once they expire; a replay then is too old.
    late = [world.report(1) for _ in range(5)]
    world.leader.upload(world.task_id, late)
    world.drive()
    world.clock.now += EXPIRY + 2 * TP
    world.gc()
    assert world.leader_store.report_counts(world.task_id, TP) == {}
    with pytest.raises(ReportTimeRejected, match="expired"):
        world.leader.upload(world.task_id, late[:1])
    # And the helper, asked directly by a leader that kept them, drops them.
    world.leader_store.put_reports(world.task_id, [(r.time - r.time % TP, r) for r in late])
    world.drive()
    assert world.leader_store.rejections(world.task_id)["report_dropped"] == 5


def _read_only(store: Datastore) -> sqlite3.Connection:
    """A connection of its own to the store's SQLite file, as another process
    would open it: it sees what the store committed (the WAL included)."""
    assert isinstance(store, SqliteDatastore)
    return sqlite3.connect(f"file:{store.path}?mode=ro", uri=True)


def _rows(store: Datastore) -> int:
    tables = ("reports", "aggregation_jobs", "batch_aggregates", "helper_reports", "helper_jobs")
    with closing(_read_only(store)) as db:
        return sum(int(db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in tables)


def _pages(store: Datastore) -> int:
    """The database's size in bytes as SQLite sees it (WAL included, whatever
    has or has not been checkpointed into the file yet)."""
    with closing(_read_only(store)) as db:
        return int(db.execute("PRAGMA page_count").fetchone()[0]) * int(
            db.execute("PRAGMA page_size").fetchone()[0]
        )


def _steady_stream(world: World, rounds: int, per_round: int) -> list[tuple[int, int]]:
    """(rows, bytes) of both databases after each round of uploads, aggregation
    and GC, the clock moving one time bucket per round."""
    sizes = []
    for _ in range(rounds):
        world.leader.upload(world.task_id, [world.report(1) for _ in range(per_round)])
        world.drive()
        world.gc()
        world.clock.now += TP
        stores = (world.leader_store, world.helper_store)
        sizes.append((sum(map(_rows, stores)), sum(map(_pages, stores))))
    return sizes


def test_database_stops_growing_under_a_steady_stream(tmp_path: Path) -> None:
    # SQLite only: it reads SQLite's own page counts (the contract tests cover
    # reclaim_space on both backends).
    sqlite = Backend(tmp_path, None)
    world = World(sqlite)
    rounds, per_round = 16, 40
    sizes = _steady_stream(world, rounds, per_round)
    assert world.aggregated() <= rounds * per_round
    # Reports live EXPIRY (plus skew) and then go: the row count levels off
    # after EXPIRY / TP rounds, and so does the file, whose freed pages are reused.
    settled = EXPIRY // TP + 3
    rows = [r for r, _ in sizes]
    assert max(rows[settled:]) <= rows[settled - 1]
    on_disk = [b for _, b in sizes]
    assert max(on_disk[settled:]) <= on_disk[settled - 1] * 1.1

    # The same stream without expiry keeps everything (and so would grow forever).
    (tmp_path / "no-expiry").mkdir()
    other = Backend(tmp_path / "no-expiry", None)
    try:
        keeper = World(other, expiry=None)
        kept = [r for r, _ in _steady_stream(keeper, rounds, per_round)]
        assert kept[-1] > 1.5 * kept[settled - 1]
    finally:
        other.close()
        sqlite.close()


def test_rotation_keeps_old_key_for_grace_then_deletes(world: World) -> None:
    store, leader = world.leader_store, world.leader
    old = leader.current_config
    cached = world.report(1)  # sealed by a client holding the old config
    policy = KeyPolicy(pending_seconds=60, grace_seconds=600)
    new = rotate(store, world.clock.now, policy, immediately=False)
    assert new.state == KEY_PENDING
    leader.refresh_keys()
    assert leader.current_config == old  # pending keys are not advertised
    world.clock.now += 30
    assert advance_keys(store, world.clock.now, policy) == []
    world.clock.now += 30
    assert advance_keys(store, world.clock.now, policy) == [f"activated key {new.config_id}"]
    leader.refresh_keys()
    assert leader.current_config == new.keypair.config
    states = {k.config_id: k.state for k in store.hpke_keys()}
    assert states == {old.config_id: KEY_EXPIRED, new.config_id: KEY_ACTIVE}

    # Within the grace period the old key still opens reports.
    leader.upload(world.task_id, [cached, world.report(2)])
    world.drive()
    assert world.aggregated() == 2

    world.clock.now += 600
    assert advance_keys(store, world.clock.now, policy) == [f"deleted expired key {old.config_id}"]
    leader.refresh_keys()
    stale = world.report(1, leader_config=old)
    with pytest.raises(InvalidMessage, match="unknown leader HPKE config id"):
        leader.upload(world.task_id, [stale])
