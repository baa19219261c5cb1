"""SIGKILL of the leader and the helper at random moments of upload,
aggregation and collection: after restarts, each collected batch (mechanism
none) is exactly the sum of the valid reports the leader acknowledged.

One run injects at least 20 crashes in short mode (about 100 in long mode).
Kill moments are drawn with `secrets`, so every run tries other points; the
figures of a run go to $VEIL_RELIABILITY_OUT (see tests/support/reliability.py).
"""

from __future__ import annotations

import secrets
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.deployment import start_deployment
from tests.support.modes import LONG
from tests.support.reliability import TP, bucket, query, record
from tests.support.reports import forged_report
from veil.client import Client, Report, UploadError
from veil.collector import CollectionError, Collector
from veil.hpke import ROLE_HELPER, ROLE_LEADER
from veil.local.launcher import ServerProcess
from veil.task import DpSpec, VdafSpec

pytestmark = [pytest.mark.slow, pytest.mark.fault]

# Crashes while uploads arrive and are aggregated; the collection phase adds more.
CRASHES_DURING_UPLOAD = 70 if LONG else 20
CRASHES_PER_COLLECTION = 3
BUCKETS = 12 if LONG else 6
BATCHES_PER_BUCKET = 20 if LONG else 8
BATCH = 20
# Transient while a server restarts; anything else is a failed test.
_TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def _pause(low: float, high: float) -> float:
    """A uniformly random pause in [low, high) seconds, from `secrets`."""
    return low + (high - low) * secrets.randbelow(10_000) / 10_000


class Chaos:
    """Kills a random server with SIGKILL and restarts it, counting by phase."""

    def __init__(self, servers: dict[str, ServerProcess]) -> None:
        self.servers = servers
        self.kills: Counter[tuple[str, str]] = Counter()

    def crash(self, phase: str) -> None:
        name = secrets.choice(sorted(self.servers))
        server = self.servers[name]
        server.stop(signal.SIGKILL)
        self.kills[(phase, name)] += 1
        time.sleep(_pause(0.0, 0.3))
        server.start(timeout=60)

    def total(self, phase: str | None = None) -> int:
        return sum(n for (p, _), n in self.kills.items() if phase is None or p == phase)

    def during_each_collection(
        self, buckets: Iterable[int], collect: Callable[[int], None], crashes: int, gap: float
    ) -> None:
        """One bucket at a time: start `collect(bucket)` in a thread, then kill
        a server while it is under way (up to `crashes` times: at once, then at
        random pauses below `gap` seconds), and wait for it. The first kill
        does not wait: on an idle machine a collection can finish within the
        pause, and a run would then kill nothing during collections."""
        for t in buckets:
            collecting = threading.Thread(target=collect, args=(t,), name="collector")
            collecting.start()
            try:
                for attempt in range(crashes):
                    time.sleep(_pause(0.0, gap) if attempt else 0.0)
                    if not collecting.is_alive():
                        break
                    self.crash("collection")
            finally:
                collecting.join(600)


def _upload_until_acknowledged(client: Client, reports: list[Report], deadline: float) -> int:
    """Send one batch until the leader answers (a retry resends the same ids)."""
    while True:
        try:
            result = client.upload_reports(reports)
            return result.accepted + result.duplicates
        except UploadError as e:
            if e.code not in _TRANSIENT or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_sigkill_everywhere_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    spec = VdafSpec("sum", max_measurement=100)
    dep = start_deployment(
        tmp_path, {"sum": (spec, DpSpec("none"), {"min_batch_size": 1})}, job_size=BATCH
    )
    try:
        chaos = Chaos({"leader": dep.leader, "helper": dep.helper})
        client = dep.client("sum", backoff=0.1, retries=3, timeout=10)
        client.hpke_config(ROLE_LEADER)
        client.hpke_config(ROLE_HELPER)
        hours = [2 + i for i in range(BUCKETS)]
        # Per bucket: batches of honest reports with one forged report each
        # (valid-looking, fails the joint proof check): only honest ones count.
        expected: dict[int, tuple[int, int]] = {}
        batches: list[list[Report]] = []
        invalid = 0
        for h in hours:
            t = bucket(h)
            count = total = 0
            for _ in range(BATCHES_PER_BUCKET):
                values = [secrets.randbelow(101) for _ in range(BATCH - 1)]
                batch = [client.build_report(v, t) for v in values]
                batch.insert(secrets.randbelow(BATCH), forged_report(client, 50, t))
                invalid += 1
                batches.append(batch)
                count += len(values)
                total += sum(values)
            expected[t] = (count, total)
        # Interleave buckets so every batch of aggregation jobs spans several.
        order = list(range(len(batches)))
        for i in range(len(order) - 1, 0, -1):
            j = secrets.randbelow(i + 1)
            order[i], order[j] = order[j], order[i]

        acknowledged = 0
        errors: list[BaseException] = []

        def upload() -> None:
            nonlocal acknowledged
            try:
                for i in order:
                    acknowledged += _upload_until_acknowledged(
                        client, batches[i], time.monotonic() + 120
                    )
                    time.sleep(_pause(0.1, 0.5))
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        uploader = threading.Thread(target=upload, name="uploader")
        uploader.start()
        try:
            # Kills while uploads arrive and the driver aggregates them, then
            # while the backlog drains, until enough crashes were injected.
            while uploader.is_alive() or chaos.total() < CRASHES_DURING_UPLOAD:
                time.sleep(_pause(0.05, 0.6))
                chaos.crash("upload" if uploader.is_alive() else "aggregation")
        finally:
            uploader.join(300)
        assert not errors, errors
        assert acknowledged == len(batches) * BATCH

        results: dict[int, Any] = {}
        job_ids = {t: secrets.token_bytes(16) for t in expected}

        def collect(t: int) -> None:
            try:
                with Collector(dep.tasks["sum"].collector) as collector:
                    while t not in results:
                        try:
                            results[t] = collector.collect(
                                t, TP, wait=180, collection_job_id=job_ids[t]
                            )
                        except CollectionError as e:
                            # The same job id resumes the same collection.
                            if e.code not in _TRANSIENT:
                                raise
                            time.sleep(0.2)
            except BaseException as e:
                errors.append(e)

        chaos.during_each_collection(expected, collect, CRASHES_PER_COLLECTION, gap=0.15)
        assert not errors, errors
        got = {t: (r.report_count, r.estimate) for t, r in results.items()}
        # Rejected exactly once each: the leader records every forged report.
        leader_rejected = query(
            dep.local.root / "leader.db",
            "SELECT COALESCE(SUM(count), 0) FROM rejections WHERE task_id = ?",
            dep.tasks["sum"].client.task_id,
        )[0][0]
        record(
            "crashes",
            crashes=chaos.total(),
            by_phase_and_server={f"{p}/{s}": n for (p, s), n in sorted(chaos.kills.items())},
            reports_acknowledged=acknowledged,
            valid=sum(c for c, _ in expected.values()),
            invalid=invalid,
            rejected_by_leader=leader_rejected,
            batches=len(expected),
            all_sums_exact=got == expected,
        )
        assert got == expected
        assert leader_rejected == invalid
        assert chaos.total() >= 20
        assert chaos.total("collection") >= 1
    finally:
        dep.stop()
