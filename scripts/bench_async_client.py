"""Sustained uploads per second of one AsyncClient (one process, one client,
Count) to a local leader and helper; target at least 2,000 reports/s.

    python scripts/bench_async_client.py               # 3 modes, 10 s each
    python scripts/bench_async_client.py --seconds 30 --mode 100x8
    python scripts/bench_async_client.py --json

A mode BxC runs C tasks on the one client, each uploading B measurements per
call (B = 1: `upload`, else `upload_batch`). The logic lives in
``veil.bench_client``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from veil.bench_client import DEFAULT_MODES, Mode, run
from veil.logs import configure_logging
from veil.tuning import limit_blas_threads, tune_allocator

TARGET = 2000


def mode(text: str) -> Mode:
    try:
        batch, concurrency = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a mode is BATCHxTASKS, e.g. 100x8: {text!r}") from None
    if batch < 1 or concurrency < 1:
        raise argparse.ArgumentTypeError("batch and tasks must be at least 1")
    return Mode(batch, concurrency)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", type=mode, nargs="+", default=list(DEFAULT_MODES))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, help="client threads (default: CPUs, at most 4)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    configure_logging("error")  # the servers log to their own files
    tune_allocator()
    limit_blas_threads(1)
    results = run(tuple(args.mode), args.seconds, args.workers)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
        return
    print(
        f"{'call':<18} {'tasks':>5} {'reports':>8} {'reports/s':>10} {'p50 ms':>8}"
        f" {'p99 ms':>8} {'client CPU us/report':>21}"
    )
    for r in results:
        call = "upload" if r.mode.batch == 1 else f"upload_batch({r.mode.batch})"
        print(
            f"{call:<18} {r.mode.concurrency:>5} {r.reports:>8} {r.per_s:>10,.0f}"
            f" {r.p50_ms:>8.1f} {r.p99_ms:>8.1f} {r.client_cpu_us:>21.0f}"
        )
    best = max(r.per_s for r in results)
    verdict = "meets" if best >= TARGET else "misses"
    print(f"best {best:,.0f} reports/s: {verdict} the target of {TARGET:,}/s")


if __name__ == "__main__":
    main()
