"""Aggregation throughput of the scaled-out leader: 1 and 2 `veil worker` processes on PostgreSQL.

Each run is a fresh deployment (helper, leader upload front end with its
driver off, k workers, all on one throwaway PostgreSQL or --dsn): the workers
start and idle, the client uploads the whole load in one call, and the clock
runs from the start of the upload until no report of the load is left
unaggregated (workers begin on the first reports stored while the rest are
still uploading). Each process's CPU time is read from /proc over the same
span. The table gives the median of --runs runs (and min, max).

With --sqlite, the embedded default instead: one leader process (front end
and driver in one, its CPU counted as the worker's) and one helper process,
each on its own SQLite file.

Then, in one process, the per-report cost of each step (HPKE open, the
leader's and the helper's VDAF work) and of the database writes, to show
where the time goes (docs/SCALING.md).

    python scripts/bench_workers.py --reports 2000 --runs 3

One configuration as JSON (its last line: reports_per_s, cpu_us_per_report by
role, whether every collected sum was exact, and the parameters), e.g. two
workers and three helper processes on one port:

    python scripts/bench_workers.py --workers 2 --helpers 3 --vdaf count \
        --job-size 500 --reports 5000 --runs 1 --json
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

# The throwaway PostgreSQL is test support (tests/support), not part of veil:
# run from a checkout, the script finds it beside scripts/.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.postgres import as_url, postgres_dsn, with_schema
from veil.aggregator.core import job_deltas, share_merge
from veil.aggregator.local import LocalDeployment
from veil.aggregator.postgres import PostgresDatastore
from veil.aggregator.storage import SqliteDatastore
from veil.client import Client, seal_report
from veil.collector import Collector
from veil.hpke import ROLE_HELPER, ROLE_LEADER, generate_keypair, input_share_info, open_
from veil.messages import Report, vdaf_ctx
from veil.task import DpSpec, VdafSpec
from veil.vdaf.batch.prio3 import BatchPrio3, OutShareBatch

TP = 3600
SPEC = VdafSpec("sum", max_measurement=1000)
# --vdaf: the instance, and the measurement of the i-th report.
VDAFS: dict[str, tuple[VdafSpec, Any]] = {
    "count": (VdafSpec("count"), lambda i: i % 2),
    "sum": (SPEC, lambda i: i % 1001),
    "histogram": (VdafSpec("histogram", length=100, chunk_length=10), lambda i: i % 100),
}


def expected(vdaf: str, reports: int) -> Any:
    """The exact aggregate of the first `reports` measurements."""
    spec, value = VDAFS[vdaf]
    if vdaf == "histogram":
        counts = [0] * spec.length
        for i in range(reports):
            counts[value(i)] += 1
        return counts
    return sum(value(i) for i in range(reports))


def cpu_seconds(pid: int | None) -> float:
    """User plus system CPU time of a process so far (Linux /proc)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(
    dsn: str | None,
    workers: int,
    reports: int,
    job_size: int,
    helpers: int = 1,
    vdaf: str = "sum",
    exact: list[bool] | None = None,
) -> tuple[float, dict[str, float]]:
    """Reports aggregated per second with `workers` workers and `helpers` helper
    processes, on a fresh deployment, and the CPU µs per report each process
    spent meanwhile (robust to a busy machine). With `exact` given, the batch is
    then collected and whether it equals the true aggregate appended to it."""
    suffix = secrets.token_hex(4)
    storage = None
    if dsn is not None:
        leader_db = with_schema(dsn, f"bench_leader_{suffix}")
        helper_db = with_schema(dsn, f"bench_helper_{suffix}")
        storage = {"leader": as_url(leader_db), "helper": as_url(helper_db)}
    now = int(time.time())
    t = now - now % TP - TP
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        spec, value = VDAFS[vdaf]
        dep = LocalDeployment.start(
            Path(tmp),
            {"bench": (spec, DpSpec("none"), {"min_batch_size": 1})},
            job_size=job_size,
            driver_interval=0.05,
            storage=storage,
            # SQLite serves one process: the leader's own driver aggregates.
            workers=0 if dsn is None else workers,
            start_workers=False,
            helpers=helpers,
        )
        stack.callback(dep.stop)
        store: SqliteDatastore | PostgresDatastore = (
            SqliteDatastore(Path(tmp) / "leader.db")
            if dsn is None
            else PostgresDatastore(leader_db, pool_size=1)
        )
        stack.callback(store.close)
        files = dep.tasks["bench"]
        client = stack.enter_context(Client(files.client, batch_size=10_000))
        built = [client.build_report(value(i), t) for i in range(reports)]
        for w in dep.workers:
            w.start_worker()
        # Wait until every worker has started and is idling.
        deadline = time.monotonic() + 60
        while not all(w.log.exists() and "started" in w.log.read_text() for w in dep.workers):
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not start")
            time.sleep(0.05)
        time.sleep(0.5)
        helper_procs = getattr(dep, "helpers", [dep.helper])
        procs = {f"helper {i + 1}": h.pid for i, h in enumerate(helper_procs)}
        if dsn is None:
            procs["worker 1 (the leader: front end and driver)"] = dep.leader.pid
        else:
            procs |= {"front end": dep.leader.pid} | {
                f"worker {i + 1}": w.pid for i, w in enumerate(dep.workers)
            }
        began = time.perf_counter()
        cpu_before = {name: cpu_seconds(pid) for name, pid in procs.items()}
        assert client.upload_reports(built).accepted == reports
        while store.has_unaggregated(files.client.task_id, 0, 1 << 62):
            time.sleep(0.02)
        elapsed = time.perf_counter() - began
        cpu = {
            name: (cpu_seconds(pid) - cpu_before[name]) * 1e6 / reports
            for name, pid in procs.items()
        }
        rejected = store.rejections(files.client.task_id)
        if rejected:
            raise RuntimeError(f"reports rejected during the benchmark: {rejected}")
        if exact is not None:
            with Collector(files.collector) as collector:
                r = collector.collect(t, TP, wait=120)
            exact.append(r.report_count == reports and r.estimate == expected(vdaf, reports))
    return reports / elapsed, cpu


def step_costs(dsn: str, n: int, job_size: int) -> dict[str, float]:
    """Microseconds per report of each step, in this one process."""
    vdaf = SPEC.instantiate()
    task_id = secrets.token_bytes(32)
    ctx = vdaf_ctx(task_id)
    verify_key = secrets.token_bytes(vdaf.VERIFY_KEY_SIZE)
    leader_kp, helper_kp = generate_keypair(1), generate_keypair(2)
    items = []
    t0 = time.perf_counter()
    for i in range(n):
        rid = secrets.token_bytes(16)
        public, shares = vdaf.shard(ctx, i % 1001, rid, secrets.token_bytes(vdaf.RAND_SIZE))
        ps = vdaf.encode_public_share(public)
        r = seal_report(
            task_id,
            rid,
            0,
            ps,
            vdaf.encode_input_share(shares[0]),
            vdaf.encode_input_share(shares[1]),
            leader_kp.config,
            helper_kp.config,
        )
        items.append((rid, ps, [r.leader_ct, r.helper_ct]))
    t1 = time.perf_counter()
    opened = [
        [
            open_(kp, cts[j], input_share_info(role, task_id, rid, 0, ps))
            for j, (kp, role) in enumerate(((leader_kp, ROLE_LEADER), (helper_kp, ROLE_HELPER)))
        ]
        for rid, ps, cts in items
    ]
    t2 = time.perf_counter()
    # As the aggregators do it: one job's reports at a time on the batched path.
    batch = BatchPrio3(vdaf)
    first_out: OutShareBatch | None = None  # the leader's first, for the database step
    for start in range(0, n, job_size):
        chunk = items[start : start + job_size]
        ids = [rid for rid, _, _ in chunk]
        publics = [ps for _, ps, _ in chunk]
        inits = [
            batch.verify_init_batch(
                verify_key, ctx, j, ids, publics, [p[j] for p in opened[start : start + job_size]]
            )
            for j in range(2)
        ]
        msgs = batch.verifier_shares_to_message_batch(
            ctx, [list(inits[0].verifier_shares), list(inits[1].verifier_shares)]
        )
        outs = [batch.verify_next_batch(ctx, inits[j].state, msgs.messages) for j in range(2)]
        if first_out is None:
            first_out = outs[0]
    t3 = time.perf_counter()
    # Database: storing the uploads, then finishing jobs (report states and the
    # bucket's aggregate merged under its row lock), as a worker does.
    assert first_out is not None
    store = PostgresDatastore(with_schema(dsn, f"bench_steps_{secrets.token_hex(4)}"), 2)
    try:
        stored = [(0, Report(rid, 0, ps, cts[0], cts[1])) for rid, ps, cts in items]
        t4 = time.perf_counter()
        for i in range(0, n, 1000):
            store.put_reports(task_id, stored[i : i + 1000])
        t5 = time.perf_counter()
        merge = share_merge(vdaf)
        jobs = 0
        while True:
            job_id = secrets.token_bytes(16)
            if not store.create_aggregation_job(task_id, job_id, job_size):
                break
            ids = [r.report_id for r in store.job_reports(task_id, job_id)]
            deltas = job_deltas(batch, first_out, [(0, rid, 0) for rid in ids])
            store.finish_aggregation_job(task_id, job_id, dict.fromkeys(ids), deltas, merge)
            jobs += 1
        t6 = time.perf_counter()
    finally:
        store.close()
    us = 1e6 / n
    return {
        "client shard + 2 HPKE seals": (t1 - t0) * us,
        "HPKE open (per aggregator)": (t2 - t1) * us / 2,
        "VDAF verify (batched), both aggregators": (t3 - t2) * us,
        "DB: store upload": (t5 - t4) * us,
        "DB: make, read and finish jobs": (t6 - t5) * us,
    }


def by_role(cpu: dict[str, float]) -> dict[str, float | None]:
    """CPU µs per report of each role, added over its processes (what the
    organisation running it spends per report); None for a role no process
    of its own plays (on SQLite the leader process is front end and worker,
    counted as the worker)."""
    roles = {"helper": "helper", "worker": "worker", "front end": "upload"}
    out: dict[str, float | None] = dict.fromkeys(roles.values())
    for name, us in cpu.items():
        role = next(r for p, r in roles.items() if name.startswith(p))
        out[role] = (out[role] or 0.0) + us
    return {k: None if v is None else round(v, 1) for k, v in out.items()}


def json_run(args: argparse.Namespace, dsn: str | None) -> dict[str, Any]:
    exact: list[bool] = []
    results = [
        one_run(dsn, args.workers[0], args.reports, args.job_size, args.helpers, args.vdaf, exact)
        for _ in range(args.runs)
    ]
    cpu = {name: statistics.median(c[name] for _, c in results) for name in results[0][1]}
    # By role per run, then the median: which of several helper processes
    # takes the work changes from run to run, so per-process medians do not
    # add up to a role's total.
    roles = [by_role(c) for _, c in results]
    return {
        "reports_per_s": round(statistics.median(r for r, _ in results), 1),
        "cpu_us_per_report": {
            k: None if roles[0][k] is None else statistics.median(r[k] or 0.0 for r in roles)
            for k in roles[0]
        },
        "cpu_us_per_process": {k: round(v, 1) for k, v in cpu.items()},
        "exact": all(exact),
        "workers": args.workers[0],
        "helpers": args.helpers,
        "vdaf": args.vdaf,
        "job_size": args.job_size,
        "reports": args.reports,
        "runs": args.runs,
        "storage": "sqlite" if dsn is None else "postgresql",
        "cpus": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--job-size", type=int, default=100)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dsn", help="an existing PostgreSQL (default: a throwaway one)")
    parser.add_argument(
        "--sqlite",
        action="store_true",
        help="the embedded default: one leader and one helper process on SQLite (--json only)",
    )
    parser.add_argument(
        "--helpers", type=int, default=1, help="helper processes on one port (--json only)"
    )
    parser.add_argument("--vdaf", choices=sorted(VDAFS), default="sum", help="(--json only)")
    parser.add_argument(
        "--json", action="store_true", help="one configuration; a JSON object on the last line"
    )
    args = parser.parse_args()
    if args.sqlite:
        if not args.json or args.helpers != 1 or args.dsn:
            parser.error("--sqlite runs one leader and one helper process: with --json only")
        args.workers = [1]
        print(json.dumps(json_run(args, None)))
        return
    if args.json and len(args.workers) != 1:
        parser.error("--json measures one configuration: give one --workers value")
    if args.helpers < 1 or any(w < 1 for w in args.workers):
        parser.error("--workers and --helpers must be at least 1")

    with ExitStack() as stack:
        dsn = args.dsn or stack.enter_context(postgres_dsn())
        if args.json:
            print(json.dumps(json_run(args, dsn)))
            return
        print(
            f"{args.reports} reports of Prio3Sum(max 1000) per run, jobs of {args.job_size},"
            f" {os.cpu_count()} CPUs, helper and leader front end on the same machine"
        )
        print(f"{'workers':>7} | {'median reports/s':>16} | {'min':>6} | {'max':>6} | runs")
        cpu_by_k = {}
        for k in args.workers:
            results = [one_run(dsn, k, args.reports, args.job_size) for _ in range(args.runs)]
            rates = [r for r, _ in results]
            cpu_by_k[k] = {
                name: statistics.median(c[name] for _, c in results) for name in results[0][1]
            }
            print(
                f"{k:>7} | {statistics.median(rates):>16.0f} | {min(rates):>6.0f} |"
                f" {max(rates):>6.0f} | {', '.join(f'{r:.0f}' for r in rates)}"
            )
        print("\nCPU µs per report while aggregating (median over runs):")
        for k, cpu in cpu_by_k.items():
            print(f"  {k} worker(s): " + ", ".join(f"{n} {v:.0f}" for n, v in cpu.items()))
        print("\nper-report cost of each step, one process (µs/report):")
        for name, cost in step_costs(dsn, min(args.reports, 1000), args.job_size).items():
            print(f"  {name:<32} {cost:>8.0f}")


if __name__ == "__main__":
    main()
