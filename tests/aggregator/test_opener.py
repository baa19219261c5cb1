"""A job's HPKE opens over threads (veil.aggregator.opener): the pool itself,
the `open_threads` setting, and the helper's and the leader's jobs, whose
outcomes must be what opening one report at a time gave."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import pytest

from tests.support.backends import Backend
from tests.support.in_process import NOW, World, verify_init_items
from veil.aggregator.core import VerifyInitItem
from veil.aggregator.leader import Leader
from veil.aggregator.leader.settings import LeaderParts, LeaderSettings
from veil.aggregator.opener import (
    AUTO_OPEN_THREADS,
    MAX_OPEN_THREADS,
    MIN_CHUNK,
    OpenPool,
    cores_available,
    threads_for,
)
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.run.config import ConfigError, load_config
from veil.hpke import seal
from veil.metrics import Metrics
from veil.task import DpSpec, VdafSpec, new_task

X = TypeVar("X")
Y = TypeVar("Y")


class ThreadsSeen(OpenPool):
    """An OpenPool that records which threads ran its function."""

    def __init__(self, threads: int) -> None:
        super().__init__(threads)
        self.seen: set[int] = set()

    def map(self, fn: Callable[[X], Y], items: Sequence[X]) -> list[Y]:
        def recorded(x: X) -> Y:
            self.seen.add(threading.get_ident())
            return fn(x)

        return super().map(recorded, items)


# --- the pool ------------------------------------------------------------------


def test_chunks_run_at_once_and_come_back_in_order() -> None:
    pool = OpenPool(3)
    items = list(range(100))
    size = 34  # 100 items in three chunks
    # The first item of each chunk waits for the other two chunks to start:
    # the call can only return if the three run at the same time.
    started = threading.Barrier(3)

    def double(x: int) -> int:
        if x % size == 0:
            started.wait(timeout=30)
        return 2 * x

    try:
        assert pool.map(double, items) == [2 * x for x in items]
        assert pool.map(double, items) == [2 * x for x in items]  # the same threads again
    finally:
        pool.close()


def test_small_jobs_and_one_thread_stay_in_the_calling_thread() -> None:
    caller = threading.get_ident()
    few = ThreadsSeen(4)
    assert few.map(str, range(2 * MIN_CHUNK - 1)) == [str(x) for x in range(2 * MIN_CHUNK - 1)]
    assert few.seen == {caller}
    serial = ThreadsSeen(1)
    assert serial.map(str, range(1000)) == [str(x) for x in range(1000)]
    assert serial.seen == {caller}
    assert ThreadsSeen(2).map(str, []) == []


def test_an_error_reaches_the_caller_once_every_chunk_has_ended() -> None:
    pool = OpenPool(2)
    ended = threading.Event()

    def fail_first(x: int) -> int:
        if x == 0:
            raise RuntimeError("a bug in the function")
        if x == 2 * MIN_CHUNK - 1:  # the pool's chunk, last item
            time.sleep(0.2)
            ended.set()
        return x

    with pytest.raises(RuntimeError, match="a bug"):
        pool.map(fail_first, range(2 * MIN_CHUNK))
    assert ended.is_set()
    # An error in the pool's chunk reaches the caller too.
    with pytest.raises(RuntimeError, match="a bug"):
        pool.map(fail_first, [1] * MIN_CHUNK + [0] * MIN_CHUNK)
    pool.close()


def test_a_closed_pool_starts_again() -> None:
    pool = ThreadsSeen(2)
    pool.close()  # never started: nothing to stop
    assert pool.map(str, range(100)) == [str(x) for x in range(100)]
    pool.close()
    assert pool.map(str, range(100)) == [str(x) for x in range(100)]
    pool.close()
    assert len(pool.seen) >= 2


def test_thread_counts() -> None:
    assert threads_for(0) == min(cores_available(), AUTO_OPEN_THREADS)
    assert threads_for(1) == 1
    assert threads_for(MAX_OPEN_THREADS) == MAX_OPEN_THREADS
    for bad in (-1, MAX_OPEN_THREADS + 1):
        with pytest.raises(ValueError, match="open_threads"):
            threads_for(bad)
    for bad in (0, -3, MAX_OPEN_THREADS + 1):
        with pytest.raises(ValueError, match="threads"):
            OpenPool(bad)


# --- the setting -----------------------------------------------------------------


def _config(tmp_path: Path, lines: str) -> Path:
    path = tmp_path / "helper.toml"
    path.write_text(f'listen = "127.0.0.1:1"\nstorage = "h.db"\n{lines}\n')
    return path


def test_open_threads_is_read(tmp_path: Path) -> None:
    assert load_config(_config(tmp_path, "")).open_threads == 0
    assert load_config(_config(tmp_path, "open_threads = 1")).open_threads == 1
    assert load_config(_config(tmp_path, "open_threads = 3")).open_threads == 3


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("open_threads = -1", "must not be negative"),
        ("open_threads = 65", "at most 64"),
        ("open_threads = 100000000000", "at most 64"),
        ("open_threads = 1.5", "open_threads"),
        ("open_threads = true", "open_threads"),
        ('open_threads = "2"', "open_threads"),
        ('open_threads = "auto"', "open_threads"),
        ("[open_threads]\nhelper = 2", "open_threads"),
        ("open_thread = 2", "unknown setting 'open_thread'"),
    ],
)
def test_malformed_open_threads_is_refused(tmp_path: Path, setting: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as refused:
        load_config(_config(tmp_path, setting))
    assert "helper.toml:" in str(refused.value)


# --- jobs ------------------------------------------------------------------------


@pytest.fixture
def world(backend: Backend) -> World:
    files = new_task(
        VdafSpec("count"), "127.0.0.1:1", "127.0.0.1:2", min_batch_size=2, dp=DpSpec("none")
    )
    return World(backend, files)


def _hostile_job(world: World) -> tuple[list[VerifyInitItem], list[str | None]]:
    """A job of 60 reports (59 to open: three chunks) with every refusal that
    depends on the order of the job's reports, and each report's answer."""
    items = verify_init_items(world, 52)
    helper_config = items[0].encrypted_input_share.config_id
    tampered = items[5]._replace(
        encrypted_input_share=replace(items[5].encrypted_input_share, payload=b"\x00" * 20),
    )
    job = [
        *items[:5],
        tampered,  # does not open: its id is recorded all the same
        *items[6:20],
        items[3],  # its id was accepted earlier in this job
        items[5]._replace(report_id=b"short"),  # malformed, even though a replay
        tampered,  # again: replayed, not opened a second time
        *items[20:52],
        items[0]._replace(  # a config id the helper does not have
            report_id=secrets.token_bytes(16),
            encrypted_input_share=replace(
                items[0].encrypted_input_share, config_id=(helper_config + 1) % 256
            ),
        ),
        items[51],  # the last one repeated: in another chunk than the first
        items[7],
        items[30],
        items[30]._replace(time=items[30].time + 10**9),  # a replay too early: replayed first
    ]
    expected: list[str | None] = [None] * 5 + ["hpke_decrypt_error"] + [None] * 14
    expected += ["report_replayed", "invalid_message", "report_replayed"] + [None] * 32
    expected += ["hpke_unknown_config_id"] + ["report_replayed"] * 4
    assert len(job) == len(expected) == 60
    return job, expected


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_helper_job_over_threads_answers_as_one_report_at_a_time(
    world: World, threads: int
) -> None:
    task = world.files.leader  # its aggregator token is the one the helper checks
    helper = world.helper
    helper.keys.opener = pool = ThreadsSeen(threads)
    helper.metrics = helper.keys.metrics = helper.jobs.metrics = metrics = Metrics("helper")
    job, expected = _hostile_job(world)
    results = helper.aggregate(task.task_id, task.aggregator_token, secrets.token_bytes(16), job)
    assert [r.reject for r in results] == expected
    assert [r.report_id for r in results] == [it.report_id for it in job]
    # The calling thread opens the first chunk, the pool's threads the others.
    assert (len(pool.seen) > 1) == (threads > 1)
    # Each report's open is counted once, as its answer says: the repeated
    # reports' shares (opened before the job knew they repeat) are not.
    assert _opens(metrics) == {"ok": 51, "hpke_decrypt_error": 1, "hpke_unknown_config_id": 1}
    aggs = world.helper_store.batch_aggregates(task.task_id, 0, 2**62)
    assert sum(a.report_count for a in aggs) == 51
    # Every id was recorded as seen but the malformed one's.
    again = helper.aggregate(task.task_id, task.aggregator_token, secrets.token_bytes(16), job)
    assert [r.reject for r in again] == [
        "invalid_message" if r == "invalid_message" else "report_replayed" for r in expected
    ]
    pool.close()


@pytest.mark.parametrize("threads", [1, 2])
def test_a_leader_job_over_threads_opens_as_one_report_at_a_time(
    backend: Backend, world: World, threads: int
) -> None:
    task_id = world.files.client.task_id
    metrics = Metrics("leader")
    leader = Leader(
        {task_id: world.files.leader},
        LeaderParts(
            world.leader_store,
            world.link,
            PrivacyEngine(backend.ledger("leader"), [world.files.leader], allow_exact_release=True),
            clock=lambda: NOW,
            metrics=metrics,
        ),
        LeaderSettings(job_size=64, open_threads=threads),
    )
    assert leader.opener.threads == threads
    leader.keys.opener = pool = ThreadsSeen(threads)
    reports = [world.report(v % 2) for v in range(40)]
    for i in (3, 33):  # the leader's share of these does not open
        ct = reports[i].leader_ct
        flipped = bytes([ct.payload[0] ^ 1]) + ct.payload[1:]
        reports[i] = replace(reports[i], leader_ct=replace(ct, payload=flipped))
    leader.upload(task_id, reports)
    while leader.run_once():
        pass
    assert (len(pool.seen) > 1) == (threads > 1)
    assert world.leader_store.rejections(task_id) == {"hpke_decrypt_error": 2}
    aggs = world.leader_store.batch_aggregates(task_id, 0, 2**62)
    assert sum(a.report_count for a in aggs) == 38
    assert _opens(metrics) == {"ok": 38, "hpke_decrypt_error": 2}
    pool.close()


def test_stored_ciphertexts_open_as_their_ciphertexts(world: World) -> None:
    # The leader's job opens its shares from their stored form
    # (Ciphertext.to_bytes) in place: each outcome must be what the
    # Ciphertext itself gives, refusals included.
    leader = world.leader
    config = leader.current_config
    info = b"the context"
    good = seal(config, info, b"share")
    cases = [
        (good, info),
        (good, b"another context"),
        (replace(good, payload=bytes([good.payload[0] ^ 1]) + good.payload[1:]), info),
        (replace(good, config_id=(config.config_id + 1) % 256), info),
        (replace(good, enc=good.enc[:-1]), info),  # an encapsulated key one byte short
        (replace(good, enc=bytes(32)), info),  # a low-order key
        (replace(good, payload=b""), info),
    ]
    expected = [
        b"share",
        "hpke_decrypt_error",
        "hpke_decrypt_error",
        "hpke_unknown_config_id",
        "hpke_decrypt_error",
        "hpke_decrypt_error",
        "hpke_decrypt_error",
    ]

    def outcomes(opened: Sequence[object]) -> list[object]:
        return [getattr(o, "value", o) for o in opened]

    assert outcomes(leader.keys.open_shares(cases)) == expected
    stored = [(ct.to_bytes(), i) for ct, i in cases]
    assert outcomes(leader.keys.open_stored_shares(stored)) == expected
    # Shorter than a config id and a key, or empty (upload stores neither).
    assert outcomes(
        leader.keys.open_stored_shares([(good.to_bytes()[:20], info), (b"", info)])
    ) == [
        "hpke_decrypt_error",
        "hpke_unknown_config_id",
    ]


def _opens(metrics: Metrics) -> dict[str, float]:
    """The HPKE outcome counter's values by outcome."""
    return {
        s.labels["outcome"]: s.value
        for family in metrics.hpke_opens.collect()
        for s in family.samples
        if s.name.endswith("_total")
    }


def test_the_servers_open_with_the_configured_threads(tmp_path: Path) -> None:
    from veil.aggregator.run.server import AggregatorServer
    from veil.aggregator.run.worker import AggregationWorker

    path = tmp_path / "helper.toml"
    path.write_text('listen = "127.0.0.1:0"\nstorage = "h.db"\nopen_threads = 3\n')
    server = AggregatorServer("helper", load_config(path))
    try:
        assert server.logic.opener.threads == 3
    finally:
        server.stop()
    path = tmp_path / "leader.toml"
    path.write_text('listen = "127.0.0.1:0"\nstorage = "l.db"\nopen_threads = 5\n')
    worker = AggregationWorker(load_config(path))
    try:
        assert worker.leader.opener.threads == 5
    finally:
        worker.close()
