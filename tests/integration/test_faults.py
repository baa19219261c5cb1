"""Crashes and restarts of real servers: nothing lost, nothing counted twice."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.deployment import Deployment, start_deployment
from tests.support.times import past_bucket
from veil.hpke import ROLE_HELPER
from veil.task import DpSpec, VdafSpec

pytestmark = [pytest.mark.slow, pytest.mark.fault]

TP = 3600
# The tests share a deployment (below) and one clock reading for their
# buckets: an hour turning during the module cannot give two tests one bucket.
_NOW = int(time.time())


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """One leader and helper for the module: each test has time buckets of
    its own (or its own collection job) and leaves both servers running."""
    tmp_path = tmp_path_factory.mktemp("faults")
    tasks: dict[str, tuple[VdafSpec, DpSpec, dict[str, Any]]] = {
        "sum": (VdafSpec("sum", max_measurement=100), DpSpec("none"), {"min_batch_size": 1}),
        "noisy": (
            VdafSpec("sum", max_measurement=100),
            DpSpec("geometric", epsilon="1"),
            {"min_batch_size": 1},
        ),
    }
    # A leader killed while it holds jobs hands them over after the lease: the
    # restarted leader is another driver, which waits it out (a minute with
    # the default lease).
    d = start_deployment(tmp_path, tasks, job_size=25, lease_seconds=5.0)
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def dep(deployment: Deployment) -> Deployment:
    """The module's deployment with both servers up: a test that failed
    half-way may have left one stopped."""
    for server in (deployment.leader, deployment.helper):
        if server.proc is None or server.proc.poll() is not None:
            server.stop()
            server.start()
    return deployment


def _values(n: int) -> list[int]:
    return [i % 101 for i in range(n)]


def test_helper_down_then_restarted(dep: Deployment) -> None:
    client = dep.client("sum")
    client.hpke_config(ROLE_HELPER)  # clients cache the helper's key
    dep.helper.stop(signal.SIGKILL)
    t = past_bucket(2, now=_NOW)
    values = _values(40)
    assert client.upload_batch(values, report_time=t).accepted == 40
    time.sleep(1.0)  # the leader's driver fails to reach the helper and keeps the jobs
    dep.helper.start()
    with dep.collector("sum") as c:
        r = c.collect(t, TP, wait=60)
    assert (r.report_count, r.estimate) == (40, sum(values))


def test_helper_killed_during_aggregation(dep: Deployment) -> None:
    t = past_bucket(3, now=_NOW)
    values = _values(300)
    client = dep.client("sum")
    reports = [client.build_report(v, t) for v in values]
    # Kill the helper while the leader is aggregating what is being uploaded.
    for i in range(0, 300, 20):
        assert client.upload_reports(reports[i : i + 20]).accepted == 20
        if i == 100:
            time.sleep(0.15)
            dep.helper.stop(signal.SIGKILL)
    time.sleep(0.5)
    dep.helper.start()
    with dep.collector("sum") as c:
        r = c.collect(t, TP, wait=120)
    assert (r.report_count, r.estimate) == (300, sum(values))


def test_leader_killed_during_aggregation(dep: Deployment) -> None:
    t = past_bucket(4, now=_NOW)
    values = _values(1000)
    assert dep.client("sum").upload_batch(values, report_time=t).accepted == 1000
    time.sleep(0.1)  # the driver is now inside its first jobs
    dep.leader.stop(signal.SIGKILL)
    dep.leader.start()
    with dep.collector("sum") as c:
        r = c.collect(t, TP, wait=120)
    assert (r.report_count, r.estimate) == (1000, sum(values))


def test_acknowledged_upload_survives_kill_9(dep: Deployment) -> None:
    client = dep.client("sum")
    client.hpke_config(ROLE_HELPER)
    dep.helper.stop(signal.SIGKILL)  # nothing gets aggregated meanwhile
    t = past_bucket(5, now=_NOW)
    assert client.upload_batch([3, 4], report_time=t).accepted == 2
    dep.leader.stop(signal.SIGKILL)
    dep.leader.start()
    dep.helper.start()
    with dep.collector("sum") as c:
        r = c.collect(t, TP, wait=60)
    assert (r.report_count, r.estimate) == (2, 7)


def test_noised_share_served_again_after_leader_crash(dep: Deployment) -> None:
    # A collection retried after a leader crash gets the stored noised shares:
    # the same result, and the budget is charged once.
    t = past_bucket(2, now=_NOW)
    dep.client("noisy").upload_batch(_values(10), report_time=t)
    job_id = bytes(range(16))
    with dep.collector("noisy") as c:
        first = c.collect(t, TP, wait=60, collection_job_id=job_id)
    dep.leader.stop(signal.SIGKILL)
    dep.leader.start()
    with dep.collector("noisy") as c:
        again = c.collect(t, TP, wait=60, collection_job_id=job_id)
    assert again.noisy_aggregate == first.noisy_aggregate
    assert again.report_count == first.report_count == 10


def test_sigterm_is_graceful(dep: Deployment) -> None:
    t = past_bucket(6, now=_NOW)
    dep.client("sum").upload_batch([1, 2, 3], report_time=t)
    assert dep.leader.stop(signal.SIGTERM) == 0
    assert dep.helper.stop(signal.SIGTERM) == 0
    dep.helper.start()
    dep.leader.start()
    with dep.collector("sum") as c:
        r = c.collect(t, TP, wait=60)
    assert (r.report_count, r.estimate) == (3, 6)


def test_client_retries_until_the_leader_is_back(dep: Deployment) -> None:
    client = dep.client("sum", backoff=0.2, retries=8)
    t = past_bucket(7, now=_NOW)
    reports = [client.build_report(v, t) for v in (5, 6)]
    dep.leader.stop(signal.SIGKILL)
    import threading

    restart = threading.Timer(1.0, dep.leader.start)
    restart.start()
    try:
        assert client.upload_reports(reports).accepted == 2
    finally:
        restart.join()
    # A retry after an ambiguous failure resends the same report ids: no double count.
    assert client.upload_reports(reports).duplicates == 2
    with dep.collector("sum") as c:
        r = c.collect(t, TP, wait=60)
    assert (r.report_count, r.estimate) == (2, 11)


def test_sigterm_during_uploads_loses_nothing(dep: Deployment) -> None:
    import threading

    client = dep.client("sum", backoff=0.2, retries=10)
    t = past_bucket(8, now=_NOW)
    batches = [
        [client.build_report(v % 101, t) for v in range(i * 10, i * 10 + 10)] for i in range(20)
    ]
    acknowledged = 0

    def upload() -> None:
        nonlocal acknowledged
        for reports in batches:
            result = client.upload_reports(reports)
            acknowledged += result.accepted + result.duplicates
            time.sleep(0.05)

    uploader = threading.Thread(target=upload)
    uploader.start()
    time.sleep(0.3)
    assert dep.leader.stop(signal.SIGTERM) == 0
    dep.leader.start()
    uploader.join(60)
    assert acknowledged == 200
    with dep.collector("sum") as c:
        r = c.collect(t, TP, wait=60)
    assert (r.report_count, r.estimate) == (200, sum(v % 101 for v in range(200)))
