"""Crashes with differential privacy on (issue 21): real leader and helper
processes, tasks with geometric noise, SIGKILL at random moments and at the
moment the report found to lose a batch. Every batch is collected, with its
exact report count, and each aggregator's ledger holds exactly one spend per
collection.

A chaos run kills at every site (upload, aggregation, collection; leader
and helper) at least once: about 12 times in short mode (6 while two
buckets' reports are uploaded and aggregated, up to 3 during each bucket's
collection, with its budget, noise and store), about 100 in long mode
(VEIL_TEST_LONG=1, 10 buckets); its figures go to $VEIL_RELIABILITY_OUT.
"""

from __future__ import annotations

import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.postgres import as_url, with_schema
from tests.reliability.test_crashes import PHASES, Chaos, _pause, _upload_until_acknowledged
from tests.support.deployment import Deployment
from tests.support.modes import LONG
from tests.support.reliability import TP, bucket, query, record
from tests.support.wait import wait_until
from veil.client import Report
from veil.collector import CollectionError, CollectionResult, Collector
from veil.hpke import ROLE_HELPER, ROLE_LEADER
from veil.local.launcher import LocalDeployment
from veil.task import DpSpec, VdafSpec

pytestmark = [pytest.mark.slow, pytest.mark.fault]

NOISY = DpSpec("geometric", epsilon="1")
SPEC = VdafSpec("sum", max_measurement=100)
CRASHES_DURING_UPLOAD = 80 if LONG else 6
CRASHES_PER_COLLECTION = 5 if LONG else 3
BUCKETS = 10 if LONG else 2
BATCHES_PER_BUCKET = 6 if LONG else 3
BATCH = 20
# A leader killed while it holds a job hands it over after this.
LEASE = 2.0
# The noise bound every estimate must fall within (per batch: a false
# failure once in a million collections).
CONFIDENCE = 0.999999


def _collect(dep: Deployment, name: str, t: int, job: bytes) -> CollectionResult:
    """Collect until finished, resuming the same collection job after errors
    that say so (the leader restarting)."""
    with Collector(dep.tasks[name].collector) as collector:
        while True:
            try:
                return collector.collect(
                    t, TP, wait=300, collection_job_id=job, confidence=CONFIDENCE
                )
            except CollectionError as e:
                if not e.retryable:
                    raise
                time.sleep(0.2)


def _spends(rows: list[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for (collection_id,) in rows:
        out[collection_id] = out.get(collection_id, 0) + 1
    return out


def test_sigkill_with_dp_collects_every_batch_and_charges_once(tmp_path: Path) -> None:
    local = LocalDeployment.start(
        tmp_path,
        {"noisy": (SPEC, NOISY, {"min_batch_size": 1, "time_precision": TP})},
        job_size=BATCH,
        lease_seconds=LEASE,
    )
    dep = Deployment(local)
    try:
        chaos = Chaos({"leader": dep.leader, "helper": dep.helper})
        client = dep.client("noisy", backoff=0.1, retries=3, timeout=10)
        client.hpke_config(ROLE_LEADER)
        client.hpke_config(ROLE_HELPER)
        expected: dict[int, tuple[int, int]] = {}
        batches: list[list[Report]] = []
        for h in range(2, 2 + BUCKETS):
            t = bucket(h)
            values = [secrets.randbelow(101) for _ in range(BATCH * BATCHES_PER_BUCKET)]
            reports = client.build_reports(values, report_time=t)
            batches += [reports[i : i + BATCH] for i in range(0, len(reports), BATCH)]
            expected[t] = (len(values), sum(values))
        errors: list[BaseException] = []

        def upload(before_last: Callable[[], None]) -> None:
            try:
                order = sorted(range(len(batches)), key=lambda _: secrets.randbelow(1 << 30))
                for k, i in enumerate(order):
                    if k == len(order) - 1:
                        before_last()
                    _upload_until_acknowledged(client, batches[i], time.monotonic() + 120)
                    time.sleep(_pause(0.05, 0.3))
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        chaos.upload_then_drain(upload, CRASHES_DURING_UPLOAD)
        assert not errors, errors

        jobs = {t: secrets.token_bytes(16) for t in expected}
        results: dict[int, CollectionResult] = {}

        def collect(t: int) -> None:
            try:
                results[t] = _collect(dep, "noisy", t, jobs[t])
            except BaseException as e:
                errors.append(e)

        # One batch at a time, killed while its collection (and with it both
        # releases: budget, noise, store) is under way.
        chaos.during_each_collection(expected, collect, CRASHES_PER_COLLECTION, gap=0.3)
        assert not errors, errors

        got = {t: r.report_count for t, r in results.items()}
        within = {t: r.lower <= expected[t][1] <= r.upper for t, r in results.items()}
        ledgers = {
            role: _spends(query(tmp_path / f"{role}.db", "SELECT collection_id FROM dp_spends"))
            for role in ("leader", "helper")
        }
        charged_once = all(
            ledgers[role] == {job.hex(): 1 for job in jobs.values()} for role in ledgers
        )
        record(
            "dp_crashes",
            crashes=chaos.total(),
            by_phase_and_server={f"{p}/{s}": n for (p, s), n in sorted(chaos.kills.items())},
            batches=len(expected),
            collected=len(results),
            counts_exact=got == {t: c for t, (c, _) in expected.items()},
            sums_within_bounds=all(within.values()),
            each_ledger_charged_once_per_collection=charged_once,
        )
        assert got == {t: c for t, (c, _) in expected.items()}
        assert all(within.values()), within
        assert charged_once, ledgers
        assert chaos.total() >= CRASHES_DURING_UPLOAD
        assert chaos.missed(PHASES) == []
    finally:
        dep.stop()


@pytest.fixture
def pg_dep(tmp_path: Path, postgres_server: str) -> Iterator[tuple[Deployment, str, str]]:
    suffix = secrets.token_hex(4)
    leader_db = with_schema(postgres_server, f"leader_{suffix}")
    helper_db = with_schema(postgres_server, f"helper_{suffix}")
    local = LocalDeployment.start(
        tmp_path,
        {"noisy": (SPEC, NOISY, {"min_batch_size": 1, "time_precision": TP})},
        job_size=BATCH,
        storage={"leader": as_url(leader_db), "helper": as_url(helper_db)},
        lease_seconds=LEASE,
    )
    d = Deployment(local)
    try:
        yield d, leader_db, helper_db
    finally:
        d.stop()


@pytest.mark.postgres
def test_helper_killed_between_its_spend_and_its_store(
    pg_dep: tuple[Deployment, str, str],
) -> None:
    """The report's case: ε = 1, a budget of one collection; the helper is
    SIGKILLed after its spend is recorded and before its noised share is
    stored (held there by a row lock another session holds). Before: the
    leader's retry was refused ("spends 1 but only 0 remains") and the
    batch was lost for good. Now the collection finishes, charged once."""
    dep, leader_db, helper_db = pg_dep
    task_id = dep.tasks["noisy"].client.task_id
    t = bucket(2)
    values = [secrets.randbelow(101) for _ in range(30)]
    with dep.client("noisy") as client:
        assert client.upload_batch(values, report_time=t).accepted == 30

    def helper_count() -> int:
        with psycopg.connect(helper_db) as conn:
            row = conn.execute(
                "SELECT COALESCE(SUM(report_count), 0) FROM batch_aggregates WHERE task_id = %s",
                (task_id,),
            ).fetchone()
            return int(row[0]) if row else 0

    wait_until(lambda: helper_count() == 30, "the helper to aggregate the reports")
    job = secrets.token_bytes(16)

    def spent() -> list[str]:
        with psycopg.connect(helper_db) as conn:
            return [r[0] for r in conn.execute("SELECT collection_id FROM dp_spends").fetchall()]

    lock = psycopg.connect(helper_db)
    results: list[CollectionResult] = []
    errors: list[BaseException] = []
    try:
        # The helper's store of its share closes the batch's buckets: holding
        # their rows stops it there, after its spend.
        lock.execute(
            "SELECT bucket FROM batch_aggregates WHERE task_id = %s FOR UPDATE", (task_id,)
        )

        def collect() -> None:
            try:
                results.append(_collect(dep, "noisy", t, job))
            except BaseException as e:
                errors.append(e)

        collecting = threading.Thread(target=collect)
        collecting.start()
        wait_until(lambda: spent() == [job.hex()], "the helper's spend")
        dep.helper.stop(signal.SIGKILL)
    finally:
        lock.rollback()
        lock.close()
    dep.helper.start(timeout=60)
    collecting.join(300)
    assert not errors, errors
    (r,) = results
    assert r.report_count == 30 and r.lower <= sum(values) <= r.upper
    assert spent() == [job.hex()]
    with psycopg.connect(leader_db) as conn:
        leader_spends = [row[0] for row in conn.execute("SELECT collection_id FROM dp_spends")]
    assert leader_spends == [job.hex()]
    record("dp_aimed", fault="helper SIGKILL between spend and store", finished=True)
