"""Helper jobs committing into one time bucket at once, with the bucket's
aggregate in one row (--shards 1, as before shard rows) or in shard rows.

Each configuration is a fresh schema on one throwaway PostgreSQL (or --dsn).
T threads, each with its own connection from the store's pool (as T helper
processes would have), commit --jobs helper jobs in all, of --job-size
reports each, every one into the same bucket; the clock runs from the first
commit to the last. The table gives jobs committed per second (median of
--runs), how many transactions PostgreSQL could not serialise and veil ran
again, and the mean time of one commit.

With `--durable` the server waits for the disk at each commit, as a
production database does (fsync on): then a row lock is held for the length
of a disk flush, which is where one hot row costs most.

    python scripts/bench_shards.py --threads 1 4 8 --jobs 400 --job-size 10 --durable
"""

from __future__ import annotations

import argparse
import logging
import secrets
import statistics
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

# The throwaway PostgreSQL is the benchmarks' (bench/), not part of veil:
# run from a checkout, the script finds it beside scripts/.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.postgres import postgres_dsn, with_schema
from veil.aggregator.core import share_merge
from veil.aggregator.store import records
from veil.aggregator.store.postgres import PostgresDatastore
from veil.aggregator.store.records import BatchAggregate, HelperJob
from veil.vdaf import Prio3Count
from veil.vdaf.engine import engine_for

TASK = b"b" * 32
BUCKET = 3600
VDAF = Prio3Count(2)
MERGE = share_merge(engine_for(VDAF))


class Retries(logging.Handler):
    """Counts the transactions veil's PostgreSQL store ran again."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("retrying a transaction"):
            self.count += 1


def job(job_size: int) -> HelperJob:
    ids = [secrets.token_bytes(16) for _ in range(job_size)]
    checksum = bytes(32)
    for i in ids:
        checksum = bytes(x ^ y for x, y in zip(checksum, i.rjust(32, b"\0"), strict=True))
    delta = BatchAggregate(BUCKET, VDAF.encode_agg_share([job_size]), job_size, checksum)
    return HelperJob(
        TASK, secrets.token_bytes(16), b"h" * 32, b"r", [(i, BUCKET) for i in ids], [], [delta]
    )


def one_run(
    dsn: str, shards: int, threads: int, jobs: int, job_size: int
) -> tuple[float, int, float]:
    """(jobs/s, transactions run again, mean ms per commit) of one configuration."""
    store = PostgresDatastore(with_schema(dsn, "s_" + secrets.token_hex(6)), pool_size=threads)
    store.commit_helper_job(job(job_size), MERGE)  # the bucket's lock row, made once
    work = [[job(job_size) for _ in range(jobs // threads)] for _ in range(threads)]
    retries = Retries()
    log = logging.getLogger("veil.aggregator.store.postgres")
    log.addHandler(retries)
    log.setLevel(logging.DEBUG)
    saved, records.AGGREGATE_SHARDS = records.AGGREGATE_SHARDS, shards
    latencies: list[float] = []
    lock = threading.Lock()

    def commit(mine: list[HelperJob]) -> None:
        for j in mine:
            t0 = time.perf_counter()
            store.commit_helper_job(j, MERGE)
            with lock:
                latencies.append(time.perf_counter() - t0)

    try:
        pool = [threading.Thread(target=commit, args=(mine,)) for mine in work]
        start = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        elapsed = time.perf_counter() - start
    finally:
        records.AGGREGATE_SHARDS = saved
        log.removeHandler(retries)
    (total,) = records.fold_shards(store.batch_aggregates(TASK, BUCKET, BUCKET + 1), MERGE)
    done = threads * (jobs // threads)
    assert total.report_count == (done + 1) * job_size, "a job's reports were lost or doubled"
    store.close()
    return done / elapsed, retries.count, 1000 * statistics.mean(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--jobs", type=int, default=400, help="jobs per configuration")
    parser.add_argument("--job-size", type=int, default=10)
    parser.add_argument(
        "--shards",
        type=int,
        nargs="+",
        default=[1, records.AGGREGATE_SHARDS],
        help="shard rows per bucket to compare (1: one row, as before shards)",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--durable", action="store_true", help="fsync on at each commit")
    parser.add_argument("--dsn", help="an existing PostgreSQL (default: a throwaway one)")
    args = parser.parse_args()
    if args.jobs < max(args.threads) or min(args.threads + args.shards) < 1:
        parser.error("--threads and --shards must be at least 1, --jobs at least the most threads")
    with ExitStack() as stack:
        dsn = args.dsn or stack.enter_context(postgres_dsn(durable=args.durable))
        print(
            f"{args.jobs} helper jobs of {args.job_size} reports into one bucket,"
            f" fsync {'on' if args.durable else 'off'}, median of {args.runs} runs"
        )
        print(
            f"{'threads':>7} | {'shards':>6} | {'jobs/s':>7} | {'run again':>9} | {'ms/commit':>9}"
        )
        for threads in args.threads:
            for shards in args.shards:
                runs = [
                    one_run(dsn, shards, threads, args.jobs, args.job_size)
                    for _ in range(args.runs)
                ]
                rate = statistics.median(r[0] for r in runs)
                again = statistics.median(r[1] for r in runs)
                ms = statistics.median(r[2] for r in runs)
                print(f"{threads:>7} | {shards:>6} | {rate:>7.0f} | {again:>9.0f} | {ms:>9.2f}")


if __name__ == "__main__":
    main()
