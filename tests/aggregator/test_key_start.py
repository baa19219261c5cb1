"""One active HPKE key at start-up, across processes (issue 21, item 3), and
a worker that meets a key it does not know re-reads the keys before it
rejects anything."""

from __future__ import annotations

import threading

from tests.support.backends import Backend
from tests.support.in_process import T, World
from veil.aggregator.maintenance import KeyPolicy, ensure_active_key, rotate
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.records import KEY_ACTIVE
from veil.task import DpSpec, VdafSpec, new_task

ROUNDS = 10
PROCESSES = 3


def test_processes_starting_together_on_a_new_database_make_one_key(backend: Backend) -> None:
    """An upload front end and two workers start at once on a fresh database,
    each with its own connection (as separate processes would have): one key,
    which every one of them then reads (before: 2 or 3 active keys)."""
    for round_ in range(ROUNDS):
        # A fresh database for each round.
        fresh = Backend(backend.tmp / f"round{round_}", backend.dsn)
        fresh.tmp.mkdir()
        stores: list[Datastore] = [fresh.store("leader") for _ in range(PROCESSES)]
        start = threading.Barrier(PROCESSES)
        errors: list[BaseException] = []

        def boot(store: Datastore, start: threading.Barrier, errors: list[BaseException]) -> None:
            try:
                start.wait()
                ensure_active_key(store, 1.0)
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=boot, args=(s, start, errors)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        try:
            assert errors == []
            keys = stores[0].hpke_keys()
            assert [k.state for k in keys] == [KEY_ACTIVE], f"round {round_}: {keys}"
            assert all(s.hpke_keys() == keys for s in stores)
        finally:
            fresh.close()


def test_a_worker_reads_a_key_added_after_it_started(backend: Backend) -> None:
    """A worker started before another process added (and activated) a new
    key aggregates reports sealed to that key, instead of rejecting them as
    hpke_unknown_config_id because it read the keys less than a second ago."""
    files = new_task(
        VdafSpec("count"),
        "127.0.0.1:1",
        "127.0.0.1:2",
        dp=DpSpec("none"),
        min_batch_size=1,
    )
    world = World(backend, files)
    worker = world.leader  # has read the keys just now
    # Another process rotates the leader's key at once (`veil keys rotate --now`).
    other = backend.store("leader")
    rotate(other, 2.0, KeyPolicy(), immediately=True)
    front_end = World(backend, files)  # started after the rotation: seals to the new key
    assert front_end.leader.current_config != worker.current_config
    reports = [front_end.report(1) for _ in range(3)]
    assert reports[0].leader_ct.config_id not in worker.keys.keypairs
    front_end.leader.upload(files.client.task_id, reports)
    while worker.run_once():
        pass
    assert world.leader_store.rejections(files.client.task_id) == {}
    aggs = world.leader_store.batch_aggregates(files.client.task_id, T, T + 3600)
    assert sum(a.report_count for a in aggs) == 3
