"""SIGKILL of the leader and the helper at random moments of upload,
aggregation and collection: after restarts, each collected batch (mechanism
none) is exactly the sum of the valid reports the leader acknowledged.

A kill site is a phase (upload, aggregation once the uploads are in,
collection) and a server: a run kills at every site at least once. Short
mode kills about 12 times: 6 while 12 batches in two buckets are uploaded
and aggregated, and up to 3 during each bucket's collection (every site,
and a collection resumed after a kill of either server). Long mode
(VEIL_TEST_LONG=1) kills about 100 times over 12 buckets. Kill moments are
drawn with `secrets`, so every run tries other points; the figures of a run
go to $VEIL_RELIABILITY_OUT (see tests/support/reliability.py).
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
CRASHES_DURING_UPLOAD = 70 if LONG else 6
CRASHES_PER_COLLECTION = 3
BUCKETS = 12 if LONG else 2
BATCHES_PER_BUCKET = 20 if LONG else 6
PHASES = ("upload", "aggregation", "collection")
BATCH = 20
# A leader killed while it holds aggregation jobs or a collection hands them
# over after this lease: the restarted leader is another driver, which waits
# it out before it takes them over (a minute with the default lease).
LEASE = 5.0
# Transient while a server restarts; anything else is a failed test.
_TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def _pause(low: float, high: float) -> float:
    """A uniformly random pause in [low, high) seconds, from `secrets`."""
    return low + (high - low) * secrets.randbelow(10_000) / 10_000


class Chaos:
    """Kills a server with SIGKILL and restarts it, counting by phase: the
    server is drawn among those killed least often in the phase, so that a
    few kills of a phase reach every server."""

    def __init__(self, servers: dict[str, ServerProcess]) -> None:
        self.servers = servers
        self.kills: Counter[tuple[str, str]] = Counter()

    def crash(self, phase: str) -> None:
        fewest = min(self.kills[(phase, n)] for n in self.servers)
        name = secrets.choice(sorted(n for n in self.servers if self.kills[(phase, n)] == fewest))
        server = self.servers[name]
        server.stop(signal.SIGKILL)
        self.kills[(phase, name)] += 1
        time.sleep(_pause(0.0, 0.3))
        server.start(timeout=60)

    def total(self, phase: str | None = None) -> int:
        return sum(n for (p, _), n in self.kills.items() if phase is None or p == phase)

    def covered(self, phase: str) -> bool:
        """Every server was killed at least once in `phase`."""
        return all(self.kills[(phase, n)] for n in self.servers)

    def missed(self, phases: Iterable[str]) -> list[tuple[str, str]]:
        """The kill sites (phase, server) of `phases` never hit."""
        return [(p, n) for p in phases for n in sorted(self.servers) if not self.kills[(p, n)]]

    def upload_then_drain(self, upload: Callable[[Callable[[], None]], None], crashes: int) -> None:
        """Run `upload` in a thread while killing servers at random pauses
        (phase "upload"), then while the backlog drains ("aggregation"),
        until `crashes` kills in all and every server killed in each phase.
        `upload` calls the function it is given before its last batch: that
        waits until every server was killed during the uploads."""

        def before_last() -> None:
            deadline = time.monotonic() + 300
            while not self.covered("upload") and time.monotonic() < deadline:
                time.sleep(0.1)

        uploader = threading.Thread(target=upload, args=(before_last,), name="uploader")
        uploader.start()
        try:
            while uploader.is_alive() or self.total() < crashes or not self.covered("aggregation"):
                time.sleep(_pause(0.05, 0.6))
                self.crash("upload" if uploader.is_alive() else "aggregation")
        finally:
            uploader.join(300)

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
        tmp_path,
        {"sum": (spec, DpSpec("none"), {"min_batch_size": 1})},
        job_size=BATCH,
        lease_seconds=LEASE,
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

        def upload(before_last: Callable[[], None]) -> None:
            nonlocal acknowledged
            try:
                for k, i in enumerate(order):
                    if k == len(order) - 1:
                        before_last()
                    acknowledged += _upload_until_acknowledged(
                        client, batches[i], time.monotonic() + 120
                    )
                    time.sleep(_pause(0.1, 0.5))
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        # Kills while uploads arrive and the driver aggregates them, then
        # while the backlog drains, until enough crashes were injected.
        chaos.upload_then_drain(upload, CRASHES_DURING_UPLOAD)
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
        assert chaos.total() >= CRASHES_DURING_UPLOAD
        assert chaos.missed(PHASES) == []
    finally:
        dep.stop()
