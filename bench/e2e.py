"""End-to-end throughput of a local leader and helper (issue 5, item 3).

Both aggregators run as separate processes on loopback with SQLite, as in
``veil demo``. One run: the client prepares (shards and seals) the reports
beforehand; then the clock starts, the reports are uploaded in batches
while the leader aggregates with the helper, and the clock stops when the
last report is aggregated ("uploaded and aggregated" throughput). Then a
collection request is timed until the collector holds the result.
``scripts/bench_e2e.py`` prints the table.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from veil.aggregator.store.sqlite import SqliteDatastore
from veil.client import Client
from veil.collector import Collector
from veil.local.launcher import LocalDeployment
from veil.messages import Report
from veil.task import DpSpec, VdafSpec

UPLOAD_BATCH = 1000


@dataclass(frozen=True)
class E2ECase:
    name: str
    spec: VdafSpec
    value: Callable[[int], Any]


def e2e_cases() -> dict[str, E2ECase]:
    return {
        "count": E2ECase("Prio3Count", VdafSpec("count"), lambda i: i % 2),
        "histogram": E2ECase(
            "Prio3Histogram(100,10)",
            VdafSpec("histogram", length=100, chunk_length=10),
            lambda i: i % 100,
        ),
        "sum": E2ECase("Prio3Sum(255)", VdafSpec("sum", max_measurement=255), lambda i: i % 256),
    }


@dataclass(frozen=True)
class E2ERun:
    build_us: float  # client: shard and seal, per report
    upload_aggregate_per_s: float  # reports uploaded and aggregated per second
    collect_s: float  # collection request -> result
    leader_rss_mib: float
    helper_rss_mib: float


def _peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run_once(case: E2ECase, reports: int, mechanism: str = "geometric") -> E2ERun:
    dp = DpSpec(mechanism, epsilon="1" if mechanism != "none" else None)
    now = int(time.time())
    t = now - now % 3600
    with tempfile.TemporaryDirectory(prefix="veil-bench-") as tmp:
        dep = LocalDeployment.start(Path(tmp), {"bench": (case.spec, dp, {"min_batch_size": 1})})
        try:
            files = dep.tasks["bench"]
            with Client(files.client) as client:
                began = time.perf_counter()
                prepared: list[Report] = []
                for i in range(0, reports, UPLOAD_BATCH):
                    values = [case.value(j) for j in range(i, min(reports, i + UPLOAD_BATCH))]
                    prepared += client.build_reports(values, t)
                build = time.perf_counter() - began
                store = SqliteDatastore(Path(tmp) / "leader.db")
                try:
                    start = time.perf_counter()
                    for i in range(0, reports, UPLOAD_BATCH):
                        client.upload_reports(prepared[i : i + UPLOAD_BATCH])
                    while store.has_unaggregated(files.client.task_id, t, t + 3600):
                        time.sleep(0.01)
                    pipeline = time.perf_counter() - start
                finally:
                    store.close()
            with Collector(files.collector) as collector:
                began = time.perf_counter()
                result = collector.collect(t, 3600, wait=600, poll_interval=0.01)
                collect = time.perf_counter() - began
            if result.report_count != reports:
                raise RuntimeError(f"collected {result.report_count} of {reports} reports")
            assert dep.leader.proc is not None and dep.helper.proc is not None
            leader_rss = _peak_rss_mib(dep.leader.proc.pid)
            helper_rss = _peak_rss_mib(dep.helper.proc.pid)
        finally:
            dep.stop()
    return E2ERun(build / reports * 1e6, reports / pipeline, collect, leader_rss, helper_rss)


def median_run(runs: list[E2ERun]) -> E2ERun:
    return E2ERun(
        statistics.median(r.build_us for r in runs),
        statistics.median(r.upload_aggregate_per_s for r in runs),
        statistics.median(r.collect_s for r in runs),
        max(r.leader_rss_mib for r in runs),
        max(r.helper_rss_mib for r in runs),
    )
