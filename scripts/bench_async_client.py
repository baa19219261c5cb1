"""Sustained uploads per second of one AsyncClient (one process, one client,
Count) to a local leader and helper; target at least 2,000 reports/s.

    python scripts/bench_async_client.py               # 3 modes, 10 s each
    python scripts/bench_async_client.py --seconds 30 --mode 100x8
    python scripts/bench_async_client.py --json
    python scripts/bench_async_client.py --build count   # building only, against its parts

A mode BxC runs C tasks on the one client, each uploading B measurements per
call (B = 1: `upload`, else `upload_batch`). The logic lives in
``bench.client``. The last column is the client's CPU per report over
the parts of a report (a batched shard and two HPKE seals) measured in the
same process afterwards, and over the parts plus what one call costs
whatever it carries (an upload of one report built beforehand, and a
hand-off to the client's thread pool, measured in the same process) divided by the B measurements
it carries. Concurrent calls of fewer than `batch_size` measurements are
gathered into shared requests, so a mode of many tasks pays the call's
cost once per request, a single task (e.g. 10x1) once per call.

--build measures only the building, with no network: prepare_reports,
then with the upload request's bytes, then with Outbox.add, each as a
ratio to the parts, all runs interleaved.

--lone B takes apart a lone caller's call of B measurements (one task,
awaiting each answer): the whole call as AsyncClient makes it (built and
sent in one worker thread), as it made it before (built in a worker, then
sent from the loop on grpc.aio) and as the blocking Client makes it in one
thread, each without and with an outbox; the building alone; then an
upload of B reports built beforehand on each way of calling gRPC from
asyncio, a bare hand-off to a worker thread, and an asyncio.sleep as long
as the grpc.aio call (what waiting alone costs). CPU of the whole process
per call, medians of --runs interleaved rounds.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

# The measurements (bench/) live beside scripts/, outside the veil package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.client import (
    BUILD_VDAFS,
    DEFAULT_MODES,
    LONE_ROWS,
    LONE_WHOLE_ROWS,
    Mode,
    build_costs,
    lone_costs,
    run,
)
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
    parser.add_argument(
        "--build",
        choices=sorted(BUILD_VDAFS),
        help="measure report building only (no network) for this VDAF",
    )
    parser.add_argument("--runs", type=int, default=7, help="runs for --build, rounds for --lone")
    parser.add_argument(
        "--lone",
        type=int,
        metavar="B",
        help="take a lone caller's call of B measurements apart (each row against the others)",
    )
    parser.add_argument("--calls", type=int, default=100, help="calls a row a round for --lone")
    args = parser.parse_args()
    if args.lone is not None and not 1 <= args.lone <= 1000:
        parser.error("--lone takes a batch of 1 to 1000 measurements")
    if args.calls < 1 or args.runs < 1:
        parser.error("--calls and --runs must be at least 1")
    configure_logging("error")  # the servers log to their own files
    tune_allocator()
    limit_blas_threads(1)
    if args.build:
        _build(args.build, max(5, args.runs), args.json)
        return
    if args.lone is not None:
        _lone(args.lone, args.calls, args.runs, args.json)
        return
    results, call = run(tuple(args.mode), args.seconds, args.workers)
    parts = build_costs("count", runs=5).floor_us
    if args.json:
        extra = {"parts_us": parts, **asdict(call)}
        print(json.dumps([asdict(r) for r in results] + [extra], indent=2))
        return
    print(
        f"{'call':<18} {'tasks':>5} {'reports':>8} {'reports/s':>10} {'p50 ms':>8}"
        f" {'p99 ms':>8} {'client CPU us/report':>21} {'x parts':>8} {'x (parts + call/B)':>19}"
    )
    for r in results:
        name = "upload" if r.mode.batch == 1 else f"upload_batch({r.mode.batch})"
        floor = parts + call.per_call_us / r.mode.batch
        print(
            f"{name:<18} {r.mode.concurrency:>5} {r.reports:>8} {r.per_s:>10,.0f}"
            f" {r.p50_ms:>8.1f} {r.p99_ms:>8.1f} {r.client_cpu_us:>21.0f}"
            f" {r.client_cpu_us / parts:>8.2f} {r.client_cpu_us / floor:>19.2f}"
        )
    print(f"parts of a report (batched shard + two HPKE seals): {parts:.0f} us of CPU")
    print(
        f"one call whatever it carries: {call.per_call_us:.0f} us of CPU (an upload of one"
        f" report built beforehand {call.rpc_us:.0f}, a hand-off to the thread pool"
        f" {call.hand_off_us:.0f})"
    )
    best = max(r.per_s for r in results)
    verdict = "meets" if best >= TARGET else "misses"
    print(f"best {best:,.0f} reports/s: {verdict} the target of {TARGET:,}/s")


def _build(vdaf: str, runs: int, as_json: bool) -> None:
    c = build_costs(vdaf, runs=runs)
    if as_json:
        print(json.dumps(asdict(c), indent=2))
        return
    print(f"{vdaf}, {c.reports} reports a run, CPU us per report, median of {runs} interleaved")
    print(f"{'step':<44} {'us':>8} {'x parts':>8} {'x seal':>7}")
    rows = [
        ("one HPKE seal", c.seal_us),
        ("parts: batched shard + two seals", c.floor_us),
        ("prepare_reports", c.prepare_us),
        ("prepare_reports + upload request bytes", c.request_us),
        ("prepare_reports + Outbox.add", c.outbox_us),
    ]
    for name, us in rows:
        print(f"{name:<44} {us:>8.1f} {us / c.floor_us:>8.2f} {us / c.seal_us:>7.2f}")


def _lone(batch: int, calls: int, rounds: int, as_json: bool) -> None:
    c = lone_costs(batch, calls, rounds)
    if as_json:
        print(json.dumps(asdict(c), indent=2))
        return
    whole = LONE_ROWS[:LONE_WHOLE_ROWS]
    print(
        f"a lone caller, {batch} measurements a call: CPU of the process per call, medians"
        f" of {rounds} rounds of {calls} calls a row"
    )
    print(
        f"{'':<40} {'us/call':>8} {'us/report':>10} {'x parts(B)':>11} {'x parts(1000)':>14}"
        f" {'wall ms':>8}"
    )
    for name in LONE_ROWS:
        if name == LONE_ROWS[LONE_WHOLE_ROWS]:
            print(f"an upload of {batch} reports built beforehand, or a piece of a call:")
        us = c.cpu_us[name]
        ratios = (
            f" {us / batch / c.parts_us:>11.2f} {us / batch / c.parts_1000_us:>14.2f}"
            if name in whole
            else f" {'':>11} {'':>14}"
        )
        print(f"{name:<40} {us:>8.0f} {us / batch:>10.1f}{ratios} {c.wall_ms[name]:>8.2f}")
    print(
        f"parts per report (batched shard + two HPKE seals): {c.parts_us:.0f} us in batches"
        f" of {batch}, {c.parts_1000_us:.0f} us in batches of 1,000"
    )


if __name__ == "__main__":
    main()
