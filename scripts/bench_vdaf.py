"""Per-report cost of the batched Prio3 path (issue 5).

    python scripts/bench_vdaf.py            # table, full batches, 5 runs
    python scripts/bench_vdaf.py --json     # one JSON object, name -> numbers
    python scripts/bench_vdaf.py --quick    # small batches, under a minute
    python scripts/bench_vdaf.py --memory   # 100,000 Histogram(100) reports, streamed
    python scripts/bench_vdaf.py --untuned  # without veil.tuning (allocator, BLAS threads)

The logic lives in ``veil.benchmarks``; this only parses flags and prints.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing

from veil.benchmarks import cases, peak_rss_mib, run_case, stream_histogram
from veil.tuning import limit_blas_threads, tune_allocator


def _memory_child(reports: int, chunk: int, tune: bool, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    if tune:
        tune_allocator()
        limit_blas_threads(1)
    result, seconds = stream_histogram(reports, chunk)
    queue.put((sum(result), seconds, peak_rss_mib()))


def _memory(reports: int, chunk: int, tune: bool) -> tuple[int, float, float]:
    # A fresh process, so that its peak RSS is this workload's alone.
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_memory_child, args=(reports, chunk, tune, queue))
    proc.start()
    total, seconds, rss = queue.get()
    proc.join()
    return total, seconds, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="small batches (< 60 s)")
    parser.add_argument("--runs", type=int, default=5, help="runs per case (median)")
    parser.add_argument("--only", default="", help="comma-free substring of the case names")
    parser.add_argument("--memory", action="store_true", help="streamed 100k Histogram(100)")
    parser.add_argument(
        "--untuned",
        action="store_true",
        help="skip veil.tuning (allocator thresholds, one BLAS thread)",
    )
    args = parser.parse_args()
    runs = max(5, args.runs)
    tuned = not args.untuned and tune_allocator() and limit_blas_threads(1)

    if args.memory:
        total, seconds, rss = _memory(100_000, 10_000, not args.untuned)
        print(
            f"100000 Prio3Histogram(100,10) reports streamed in chunks of 10000: "
            f"{seconds:.1f} s, {total} counted, peak RSS {rss:.0f} MiB"
            f" ({'untuned' if args.untuned else 'tuned'})"
        )
        return

    rows = []
    for case in cases():
        if args.only and args.only not in case.name:
            continue
        size = case.batch
        if args.quick:
            size = 20 if "10000" in case.name else 500
        rows.append(run_case(case, size, runs=runs))

    if args.json:
        print(
            json.dumps(
                {
                    r.name: {
                        "shard_us": round(r.shard_us, 1),
                        "verify_us": round(r.verify_us, 1),
                        "batch": r.batch,
                    }
                    for r in rows
                }
            )
        )
        return
    print(
        f"{'VDAF':28} {'batch':>7} {'shard us':>11} {'verify us':>11}"
        f" {'(cpu shard':>11} {'verify)':>9}"
        f"   median of {runs}; {'tuned' if tuned else 'untuned'}"
    )
    for r in rows:
        print(
            f"{r.name:28} {r.batch:>7} {r.shard_us:>11.1f} {r.verify_us:>11.1f}"
            f" {r.shard_cpu_us:>11.1f} {r.verify_cpu_us:>9.1f}"
        )
    print(f"peak RSS {peak_rss_mib():.0f} MiB")


if __name__ == "__main__":
    main()
