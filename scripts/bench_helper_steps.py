"""Where the helper's CPU goes: its gRPC method run in this process, without the network.

The helper's logic (`Helper`, on SQLite or a throwaway PostgreSQL) behind
the servicer the server registers (`HelperService`), fed the request bytes
a leader sends (the leader's own `aggregation_job_request`, over items
built as the leader builds them: bench.helper_jobs): each job is parsed,
aggregated, answered and serialised as in the server's worker thread, and
timed by this process's CPU clock (the threads opening shares included)
and the wall clock. What the server adds on top (gRPC's transport, the
event loop, the hand-over to the worker thread) is not in these figures;
`bench_workers.py` measures the whole process.

Rounds alternate between measuring one HPKE open (the floor:
`cryptography`'s single-shot open, and veil's own beside it) and running the
jobs, so the ratios printed are to floors measured at the same time.

    python scripts/bench_helper_steps.py --vdaf count --job-size 500 --reports 6000

`--threads 1 2` runs the jobs with each `open_threads` in every round, in
turn, and prints the CPU and the wall time of each: how much of a second
core one helper process uses.

With --profile FILE, cProfile's statistics of the jobs of the last round.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import secrets
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.helper_jobs import CallContext, honest_items
from bench.postgres import postgres_dsn, with_schema
from scripts.bench_workers import VDAFS, hpke_open_floors
from veil.aggregator.helper import Helper
from veil.aggregator.leader.helper_client import aggregation_job_request
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.run.service import HelperService
from veil.aggregator.store.postgres import PostgresDatastore, PostgresLedgerStore
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.protocol.v1 import helper_pb2
from veil.task import DpSpec, new_task

TP = 3600


def requests(vdaf: str, reports: int, job_size: int, helper: Helper, files: Any) -> list[bytes]:
    """The serialised AggregationJobRequest of each job, as a leader sends it."""
    _, value = VDAFS[vdaf]
    now = int(time.time())
    t = now - now % TP - TP
    measurements = [value(i) for i in range(reports)]
    out = []
    for start in range(0, reports, job_size):
        items = honest_items(
            files.leader, measurements[start : start + job_size], helper.current_config, t
        )
        request = aggregation_job_request(files.leader.task_id, secrets.token_bytes(16), items)
        out.append(request.SerializeToString())
    return out


def one_round(
    dsn: str | None,
    vdaf: str,
    reports: int,
    job_size: int,
    profile: cProfile.Profile | None,
    threads: int = 1,
) -> tuple[float, float]:
    """CPU and wall µs per report of the helper's method over `reports` fresh
    reports, its shares opened over `threads` threads."""
    spec, _ = VDAFS[vdaf]
    files = new_task(spec, "127.0.0.1:1", "127.0.0.1:2", min_batch_size=1, dp=DpSpec("none"))
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        if dsn is None:
            store: Any = SqliteDatastore(Path(tmp) / "helper.db")
            ledger: Any = str(Path(tmp) / "ledger.db")
        else:
            conninfo = with_schema(dsn, f"bench_helper_{secrets.token_hex(4)}")
            store = PostgresDatastore(conninfo, pool_size=2)
            ledger = PostgresLedgerStore(conninfo)
        stack.callback(store.close)
        helper = Helper(
            {files.helper.task_id: files.helper},
            store,
            PrivacyEngine(ledger, [files.helper], allow_exact_release=True),
            open_threads=threads,
        )
        stack.callback(helper.opener.close)
        service = HelperService(helper)
        context = CallContext(files.leader.aggregator_token)
        jobs = requests(vdaf, reports, job_size, helper, files)
        parse = helper_pb2.AggregationJobRequest.FromString
        serialize = helper_pb2.AggregationJobResponse.SerializeToString
        if profile is not None:
            profile.enable()
        began, wall = time.process_time(), time.perf_counter()
        for raw in jobs:
            response = service.Aggregate(parse(raw), context)
            serialize(response)
        spent, wall = time.process_time() - began, time.perf_counter() - wall
        if profile is not None:
            profile.disable()
        assert all(r.WhichOneof("result") == "verifier_message" for r in response.verify_resps)
    return spent * 1e6 / reports, wall * 1e6 / reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vdaf", choices=sorted(VDAFS), default="count")
    parser.add_argument("--reports", type=int, default=6000)
    parser.add_argument("--job-size", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--postgres", action="store_true", help="a throwaway PostgreSQL store")
    parser.add_argument("--dsn", help="an existing PostgreSQL (implies --postgres)")
    parser.add_argument("--profile", type=Path, help="write cProfile statistics here")
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[1],
        help="open_threads of the helper: each value in every round, in turn (default 1)",
    )
    args = parser.parse_args()
    with ExitStack() as stack:
        dsn = args.dsn
        if dsn is None and args.postgres:
            dsn = stack.enter_context(postgres_dsn())
        floors: list[tuple[float, float]] = []
        costs: dict[int, list[tuple[float, float]]] = {k: [] for k in args.threads}
        profile = cProfile.Profile() if args.profile else None
        for i in range(args.rounds):
            floors.append(hpke_open_floors())
            last = i == args.rounds - 1
            line = f"  round {i + 1}: open {floors[-1][0]:.1f} µs (veil's {floors[-1][1]:.1f})"
            for k in args.threads:
                costs[k].append(
                    one_round(
                        dsn,
                        args.vdaf,
                        args.reports,
                        args.job_size,
                        profile if last and k == args.threads[-1] else None,
                        k,
                    )
                )
                cpu, wall = costs[k][-1]
                line += f"; {k} thread(s): CPU {cpu:.1f} µs, wall {wall:.1f} µs"
            print(line, flush=True)
        if profile is not None:
            profile.dump_stats(args.profile)
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    floor = statistics.median(f for f, _ in floors)
    veil_floor = statistics.median(v for _, v in floors)
    print(
        f"\n{args.vdaf}, jobs of {args.job_size}, {'PostgreSQL' if dsn else 'SQLite'},"
        f" {args.reports} reports a round, load average {os.getloadavg()[0]:.1f}; medians of"
        f" {args.rounds} rounds; HPKE open {floor:.1f} µs (cryptography's single shot),"
        f" {veil_floor:.1f} µs (veil.hpke.open_)"
    )
    print(
        "| open_threads | CPU µs per report | x cryptography's open | x veil's open"
        " | wall µs per report | CPU / wall |"
    )
    print("|---|---|---|---|---|---|")
    for k, rows in costs.items():
        cpu = statistics.median(c for c, _ in rows)
        wall = statistics.median(w for _, w in rows)
        x = statistics.median(c / f for (c, _), (f, _) in zip(rows, floors, strict=True))
        xv = statistics.median(c / v for (c, _), (_, v) in zip(rows, floors, strict=True))
        busy = statistics.median(c / w for c, w in rows)
        print(f"| {k} | {cpu:.1f} | {x:.2f} | {xv:.2f} | {wall:.1f} | {busy:.2f} |")


if __name__ == "__main__":
    main()
