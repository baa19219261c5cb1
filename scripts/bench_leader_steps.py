"""Where the leader worker's CPU goes: one `veil worker` run in this process, step by step.

A fresh deployment on a throwaway PostgreSQL (or --dsn): the helper and the
upload front end run as processes, the load is uploaded, and then the
worker's own code (the `AggregationWorker` that `veil worker` runs) drives
the aggregation here, with each step it takes timed by the CPU time of the
thread that runs it (`time.thread_time`: the helper's round trip, which
runs in the worker's helper-call thread, counts only what this process
computes, not the wait). The total is this process's CPU time from the first
job to the last (`time.process_time`, all threads, gRPC's own included).

    python scripts/bench_leader_steps.py --vdaf count --job-size 500 --reports 6000

Table for docs/reports/SCALING.md ("Where the leader worker's time goes").
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.postgres import as_url, postgres_dsn, with_schema
from scripts.bench_workers import TP, VDAFS
from veil.aggregator.leader import job as job_module
from veil.aggregator.run.config import load_config
from veil.aggregator.run.worker import AggregationWorker
from veil.aggregator.store.postgres import PostgresDatastore
from veil.client import Client
from veil.local.launcher import LocalDeployment
from veil.task import DpSpec

COST: dict[str, float] = defaultdict(float)


def timed(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.thread_time()
        try:
            return f(*args, **kwargs)
        finally:
            COST[name] += time.thread_time() - t

    return wrapper


def instrument(worker: AggregationWorker) -> None:
    leader = worker.leader
    store = leader.store
    for name, step in (
        ("create_aggregation_job", "DB: make jobs"),
        ("acquire_aggregation_jobs", "DB: lease jobs"),
        ("job_reports", "DB: read the job's reports"),
        ("renew_aggregation_job", "DB: renew the lease"),
        ("finish_aggregation_job", "DB: finish the job (states, aggregate, commit)"),
        ("acquire_collections", "DB: look for collections"),
    ):
        setattr(store, name, timed(step, getattr(store, name)))
    # With open_threads above 1 this counts the calling thread's part of the opens only.
    keys = leader.keys
    keys.open_stored_shares = timed("HPKE open", keys.open_stored_shares)  # type: ignore[method-assign]
    for ctx in leader.table.contexts.values():
        engine: Any = ctx.engine
        engine.verify_init = timed("verify_init (batched)", engine.verify_init)
        engine.verify_next = timed("verify_next (batched)", engine.verify_next)
    job_module.job_deltas = timed("sum the deltas (job_deltas)", job_module.job_deltas)
    helper = leader.peer.api
    # The whole RPC in the calling thread, and within it gRPC's own part
    # (serialising the request, parsing the response): the rest is our
    # Python building the request and reading the answer.
    helper._call = timed("helper RPC: gRPC serialise + parse", helper._call)  # type: ignore[attr-defined]
    helper.aggregate = timed("helper RPC in all", helper.aggregate)  # type: ignore[method-assign]
    jobs = leader.jobs
    jobs.prepare_job = timed("prepare_job in all", jobs.prepare_job)  # type: ignore[method-assign]
    jobs.finish_job = timed("finish_job in all", jobs.finish_job)  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=6000)
    parser.add_argument("--job-size", type=int, default=500)
    parser.add_argument("--vdaf", choices=sorted(VDAFS), default="count")
    parser.add_argument("--dsn", help="an existing PostgreSQL (default: a throwaway one)")
    args = parser.parse_args()
    with ExitStack() as stack:
        dsn = args.dsn or stack.enter_context(postgres_dsn())
        suffix = secrets.token_hex(4)
        leader_db = with_schema(dsn, f"bench_leader_{suffix}")
        helper_db = with_schema(dsn, f"bench_helper_{suffix}")
        now = int(time.time())
        t = now - now % TP - TP
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        spec, value = VDAFS[args.vdaf]
        dep = LocalDeployment.start(
            Path(tmp),
            {"bench": (spec, DpSpec("none"), {"min_batch_size": 1})},
            job_size=args.job_size,
            driver_interval=0.05,
            storage={"leader": as_url(leader_db), "helper": as_url(helper_db)},
            workers=1,
            start_workers=False,
        )
        stack.callback(dep.stop)
        files = dep.tasks["bench"]
        client = stack.enter_context(Client(files.client, batch_size=10_000))
        built = [client.build_report(value(i), t) for i in range(args.reports)]
        assert client.upload_reports(built).accepted == args.reports
        worker = AggregationWorker(load_config(dep.workers[0].config))
        stack.callback(worker._close_store)
        instrument(worker)
        probe = PostgresDatastore(leader_db, pool_size=1)
        stack.callback(probe.close)
        task_id = files.client.task_id
        began = time.process_time()
        while worker.leader.run_once():
            pass
        total = time.process_time() - began
        left = probe.unaggregated_count(task_id, 0, 1 << 62)
        if left or probe.rejections(task_id):
            raise RuntimeError(f"{left} reports left, rejections {probe.rejections(task_id)}")
    us = 1e6 / args.reports
    print(f"{args.reports} reports, {args.vdaf}, jobs of {args.job_size}: CPU µs per report")
    for name, cost in sorted(COST.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<48} {cost * us:>8.1f}")
    print(f"  {'process CPU in all (all threads)':<48} {total * us:>8.1f}")


if __name__ == "__main__":
    main()
