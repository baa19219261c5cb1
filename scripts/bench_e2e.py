"""End-to-end throughput of a local leader and helper (separate processes, loopback).

Phases, timed separately: the client shards and seals (build), uploads to the
leader with the helper stopped (upload), the helper comes back and the leader
aggregates everything (aggregate; this includes the helper's start-up of
about a second, so use a few thousand reports), the collector collects the batch (collect).

    python scripts/bench_e2e.py --vdaf sum --reports 5000
"""

from __future__ import annotations

import argparse
import json
import signal
import tempfile
import time
from pathlib import Path

from veil.aggregator.local import LocalDeployment
from veil.aggregator.storage import SqliteDatastore
from veil.client import Client
from veil.collector import Collector
from veil.hpke import ROLE_HELPER
from veil.task import DpSpec, VdafSpec

SPECS = {
    "count": (VdafSpec("count"), lambda i: i % 2),
    "sum": (VdafSpec("sum", max_measurement=1000), lambda i: i % 1001),
    "histogram": (VdafSpec("histogram", length=10, chunk_length=3), lambda i: i % 10),
    "sumvec": (
        VdafSpec("sumvec", length=8, max_measurement=15, chunk_length=4),
        lambda i: [(i + k) % 16 for k in range(8)],
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vdaf", choices=sorted(SPECS), default="sum")
    parser.add_argument("--reports", type=int, default=2000)
    parser.add_argument("--mechanism", default="geometric")
    args = parser.parse_args()
    spec, value = SPECS[args.vdaf]
    dp = DpSpec(args.mechanism, epsilon="1" if args.mechanism != "none" else None)
    now = int(time.time())
    t = now - now % 3600 - 3600
    with tempfile.TemporaryDirectory() as tmp:
        dep = LocalDeployment.start(Path(tmp), {"bench": (spec, dp, {})})
        try:
            files = dep.tasks["bench"]
            with Client(files.client) as client:
                client.hpke_config(ROLE_HELPER)
                dep.helper.stop(signal.SIGTERM)
                t0 = time.perf_counter()
                reports = [client.build_report(value(i), t) for i in range(args.reports)]
                t1 = time.perf_counter()
                client.upload_reports(reports)
                t2 = time.perf_counter()
            t3 = time.perf_counter()
            dep.helper.start()
            t3b = time.perf_counter()
            store = SqliteDatastore(Path(tmp) / "leader.db")
            while store.unaggregated_count(files.client.task_id, 0, 2**62):
                time.sleep(0.02)
            t4 = time.perf_counter()
            with Collector(files.collector) as collector:
                result = collector.collect(t, 3600, wait=600)
            t5 = time.perf_counter()
        finally:
            dep.stop()
    n = args.reports
    print(
        json.dumps(
            {
                "vdaf": args.vdaf,
                "reports": n,
                "mechanism": args.mechanism,
                "build_reports_per_s": round(n / (t1 - t0)),
                "upload_reports_per_s": round(n / (t2 - t1)),
                "aggregate_reports_per_s": round(n / (t4 - t3)),
                "helper_start_seconds": round(t3b - t3, 2),
                "aggregate_reports_per_s_after_helper_up": round(n / (t4 - t3b)),
                "collect_seconds": round(t5 - t4, 3),
                "report_count": result.report_count,
            }
        )
    )


if __name__ == "__main__":
    main()
