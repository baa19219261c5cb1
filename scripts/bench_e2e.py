"""End-to-end throughput of a local leader and helper (separate processes,
loopback, SQLite): reports uploaded and aggregated per second, collection
time, peak RSS of each server. Median of --runs runs.

    python scripts/bench_e2e.py          # count and histogram, 10,000 reports, 5 runs
    python scripts/bench_e2e.py --vdaf count --reports 100000 --runs 1   # the 100,000-report batch
    python scripts/bench_e2e.py --json

The logic lives in ``bench.e2e``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

# The measurements (bench/) live beside scripts/, outside the veil package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.e2e import e2e_cases, median_run, run_once
from veil.logs import configure_logging
from veil.tuning import limit_blas_threads, tune_allocator


def main() -> None:
    cases = e2e_cases()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vdaf", choices=sorted(cases), nargs="+", default=["count", "histogram"])
    parser.add_argument("--reports", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mechanism", default="geometric")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    configure_logging("error")  # the servers log to their own files
    tune_allocator()
    limit_blas_threads(1)
    rows = {}
    for key in args.vdaf:
        case = cases[key]
        rows[case.name] = median_run(
            [run_once(case, args.reports, args.mechanism) for _ in range(args.runs)]
        )
    if args.json:
        print(json.dumps({name: asdict(r) for name, r in rows.items()}, indent=2))
        return
    print(
        f"{'VDAF':24s} {'reports':>8s} {'client us':>10s} {'upload+agg /s':>14s}"
        f" {'collect s':>10s} {'leader MiB':>11s} {'helper MiB':>11s}   (median of {args.runs})"
    )
    for name, r in rows.items():
        print(
            f"{name:24s} {args.reports:8d} {r.build_us:10.0f} {r.upload_aggregate_per_s:14.0f}"
            f" {r.collect_s:10.2f} {r.leader_rss_mib:11.0f} {r.helper_rss_mib:11.0f}"
        )


if __name__ == "__main__":
    main()
