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
where the time goes (docs/reports/SCALING.md).

    python scripts/bench_workers.py --reports 2000 --runs 3

One configuration as JSON (its last line: reports_per_s, cpu_us_per_report by
role, whether every collected sum was exact, and the parameters), e.g. two
workers and three helper processes on one port:

    python scripts/bench_workers.py --workers 2 --helpers 3 --vdaf count \
        --job-size 500 --reports 5000 --runs 1 --json

Every run is preceded by a measurement of the floor: the CPU time of one
X25519 HPKE open (what each aggregator must do per report at least), so
each CPU figure can be read as a ratio to a floor measured at the same
moment on the same machine (`hpke_open_us`, `x_hpke_open` in the JSON).
The floor is `cryptography`'s single-shot open, as it always was; veil's
own open (`veil.hpke.open_`, which the aggregators run) is measured beside
it in the same rounds, and the ratios are printed to both (`veil_open_us`,
`x_veil_open`).
`io_bytes_per_report` gives each process's bytes written and read by its
system calls over the same span (wchar and rchar of /proc/PID/io: on SQLite
the leader's database and WAL traffic) and, on PostgreSQL, the server's WAL.

Issue 28's table: Count and Histogram(100,10), on PostgreSQL (one worker,
one helper process) and on SQLite, one run of each per round, rounds
interleaved, CPU per report as a ratio to the open, in jobs of the default
size ([driver] job_size) and, for comparison with the tables before it
changed, of 500 (`--job-size N`: that size alone):

    python scripts/bench_workers.py --ratios --runs 5

What a job costs whatever its size: on both backends, one deployment per
job size given, CPU per job fitted as a + b x reports for each process
(docs/reports/SCALING.md, "The fixed cost of a job"):

    python scripts/bench_workers.py --fit 100 500 2000 --vdaf count --reports 8000 --runs 2

How the work spreads over processes: k workers and k helper processes for
each k, interleaved (`--processes 1 2 3`). How it spreads over the threads
of one process: `--threads 1 2` runs Count on PostgreSQL, one worker and
one helper process, with each `open_threads` given, interleaved, and prints
each process's CPU over the wall time (one `--threads` value with --json or
--ratios sets it for every run; without it, the servers' default). `--profile DIR` has py-spy (if
installed) sample every server process during the measured span and write a
flame graph (SVG) and collapsed stacks (text) per process.
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

import psycopg

# The throwaway PostgreSQL is the benchmarks' (bench/), not part of veil:
# run from a checkout, the script finds it beside scripts/.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.hpke import AEAD, KDF, KEM, Suite

from bench.postgres import as_url, postgres_dsn, with_schema
from bench.profiling import Profiler
from veil.aggregator.core import job_deltas, share_merge
from veil.aggregator.leader.settings import DEFAULT_JOB_SIZE
from veil.aggregator.store.postgres import PostgresDatastore
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.client import Client, seal_report
from veil.collector import Collector
from veil.hpke import (
    ROLE_HELPER,
    ROLE_LEADER,
    generate_keypair,
    input_share_info,
    open_,
    seal,
)
from veil.local.launcher import LocalDeployment
from veil.messages import Report, vdaf_ctx
from veil.task import DpSpec, VdafSpec
from veil.vdaf.batch.prio3 import BatchPrio3, OutShareBatch
from veil.vdaf.engine import OutShares, Prio3Engine

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


def io_bytes(pid: int | None) -> tuple[int, int]:
    """(bytes written, bytes read) by a process's write and read calls so far
    (wchar and rchar of Linux /proc/PID/io: its database and WAL files, its
    sockets, whether or not the page cache absorbed them)."""
    if pid is None:
        return 0, 0
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["wchar"]), int(fields["rchar"])


def wal_position(dsn: str | None) -> int:
    """The PostgreSQL server's WAL insert position in bytes (0 without one)."""
    if dsn is None:
        return 0
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def wait_until_quiet(
    procs: dict[str, int | None], window: float = 0.5, quiet_cpu: float = 0.02, timeout: float = 120
) -> None:
    """Return once every process has spent at most `quiet_cpu` CPU seconds in
    each of two consecutive `window`s (its start-up over: an idle server
    spends none, an idle worker's or SQLite leader's polling at most a few
    ms a second); RuntimeError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    quiet_windows = 0
    before = {name: cpu_seconds(pid) for name, pid in procs.items()}
    while quiet_windows < 2:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the servers were still busy {timeout:g} s after starting")
        time.sleep(window)
        after = {name: cpu_seconds(pid) for name, pid in procs.items()}
        busy = any(after[name] - before[name] > quiet_cpu for name in procs)
        quiet_windows = 0 if busy else quiet_windows + 1
        before = after


def hpke_open_floors(opens: int = 1000, rounds: int = 5) -> tuple[float, float]:
    """CPU µs of one X25519 HPKE open (the aggregator's floor per report) of
    an input share of a Count report's size and context, two ways in
    alternation: `cryptography`'s single-shot open (the floor, as veil's
    aggregators opened until they had their own) and `veil.hpke.open_`. Each
    the median of `rounds` rounds, timed by this thread's CPU clock."""
    kp = generate_keypair(1)
    task_id, shares = secrets.token_bytes(32), secrets.token_bytes(64)
    sealed = []
    for _ in range(opens):
        info = input_share_info(ROLE_HELPER, task_id, secrets.token_bytes(16), 0, b"")
        ct = seal(kp.config, info, shares)
        sealed.append((ct, ct.enc + ct.payload, info))
    # Each key loaded once, as an aggregator does.
    suite = Suite(KEM.X25519, KDF.HKDF_SHA256, AEAD.AES_128_GCM)
    private_key = X25519PrivateKey.from_private_bytes(kp.private_key)
    suite.decrypt(sealed[0][1], private_key, info=sealed[0][2])
    open_(kp, sealed[0][0], sealed[0][2])
    theirs, ours = [], []
    for _ in range(rounds):
        began = time.thread_time()
        for _ct, raw, info in sealed:
            suite.decrypt(raw, private_key, info=info)
        theirs.append((time.thread_time() - began) * 1e6 / opens)
        began = time.thread_time()
        for ct, _raw, info in sealed:
            open_(kp, ct, info)
        ours.append((time.thread_time() - began) * 1e6 / opens)
    return statistics.median(theirs), statistics.median(ours)


def one_run(
    dsn: str | None,
    workers: int,
    reports: int,
    job_size: int,
    helpers: int = 1,
    vdaf: str = "sum",
    exact: list[bool] | None = None,
    profile: Path | None = None,
    io: dict[str, tuple[float, float]] | None = None,
    threads: int | None = None,
) -> tuple[float, dict[str, float]]:
    """Reports aggregated per second with `workers` workers and `helpers` helper
    processes, on a fresh deployment, and the CPU µs per report each process
    spent meanwhile (robust to a busy machine). With `exact` given, the batch is
    then collected and whether it equals the true aggregate appended to it.
    With `profile`, py-spy samples each server process meanwhile (Profiler).
    With `io` given, each process's bytes written and read per report over the
    same span are put in it ("wal" on PostgreSQL: the server's WAL bytes per
    report, both aggregators' databases together). `threads` is the servers'
    `open_threads` (None: not written, their default)."""
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
            extra_config=None if threads is None else {"open_threads": threads},
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
        # Wait until every worker has started.
        deadline = time.monotonic() + 60
        while not all(w.log.exists() and "started" in w.log.read_text() for w in dep.workers):
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not start")
            time.sleep(0.05)
        helper_procs = getattr(dep, "helpers", [dep.helper])
        procs = {f"helper {i + 1}": h.pid for i, h in enumerate(helper_procs)}
        if dsn is None:
            procs["worker 1 (the leader: front end and driver)"] = dep.leader.pid
        else:
            procs |= {"front end": dep.leader.pid} | {
                f"worker {i + 1}": w.pid for i, w in enumerate(dep.workers)
            }
        # Only steady-state work is measured: a server reports ready before it
        # loads the field kernels and freezes its start-up heap (serve_forever),
        # which may take a second of CPU on a busy machine.
        wait_until_quiet(procs)
        storage_name = "sqlite" if dsn is None else "pg"
        profiler = Profiler(profile, f"{vdaf}-{storage_name}-w{workers}-h{helpers}", procs)
        began = time.perf_counter()
        cpu_before = {name: cpu_seconds(pid) for name, pid in procs.items()}
        io_before = {name: io_bytes(pid) for name, pid in procs.items()}
        wal_before = wal_position(dsn)
        assert client.upload_reports(built).accepted == reports
        while store.has_unaggregated(files.client.task_id, 0, 1 << 62):
            time.sleep(0.02)
        elapsed = time.perf_counter() - began
        profiler.stop()
        cpu = {
            name: (cpu_seconds(pid) - cpu_before[name]) * 1e6 / reports
            for name, pid in procs.items()
        }
        if io is not None:
            for name, pid in procs.items():
                written, read = io_bytes(pid)
                io[name] = (
                    (written - io_before[name][0]) / reports,
                    (read - io_before[name][1]) / reports,
                )
            if dsn is not None:
                io["wal"] = ((wal_position(dsn) - wal_before) / reports, 0.0)
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
        engine = Prio3Engine(batch)
        merge = share_merge(engine)
        jobs = 0
        while True:
            job_id = secrets.token_bytes(16)
            if not store.create_aggregation_job(task_id, job_id, job_size):
                break
            ids = [r.report_id for r in store.job_reports(task_id, job_id)]
            out = OutShares(first_out.errors, first_out)
            deltas = job_deltas(engine, out, [(0, rid, 0) for rid in ids])
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
    floors: list[float] = []
    veil_floors: list[float] = []
    results = []
    ios: list[dict[str, tuple[float, float]]] = []
    for _ in range(args.runs):
        # The floor measured before each run: same machine, same moment.
        floor, veil_floor = hpke_open_floors()
        floors.append(floor)
        veil_floors.append(veil_floor)
        ios.append({})
        results.append(
            one_run(
                dsn,
                args.workers[0],
                args.reports,
                args.job_size,
                args.helpers,
                args.vdaf,
                exact,
                args.profile,
                ios[-1],
                threads=args.threads[0] if args.threads else None,
            )
        )
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
        "hpke_open_us": round(statistics.median(floors), 1),
        "veil_open_us": round(statistics.median(veil_floors), 1),
        # Bytes written and read per report by each process's system calls
        # ("wal": PostgreSQL's WAL, both aggregators), medians over the runs.
        "io_bytes_per_report": {
            name: {
                "written": round(statistics.median(r[name][0] for r in ios)),
                "read": round(statistics.median(r[name][1] for r in ios)),
            }
            for name in ios[0]
        },
        # Each run's CPU per report over the floor measured just before it.
        "x_hpke_open": _ratios(roles, floors),
        "x_veil_open": _ratios(roles, veil_floors),
        "exact": all(exact),
        "workers": args.workers[0],
        "helpers": args.helpers,
        "vdaf": args.vdaf,
        "job_size": args.job_size,
        "reports": args.reports,
        "runs": args.runs,
        "storage": "sqlite" if dsn is None else "postgresql",
        "open_threads": args.threads[0] if args.threads else None,
        "cpus": os.cpu_count(),
    }


def _ratios(roles: list[dict[str, float | None]], floors: list[float]) -> dict[str, float | None]:
    """Each role's median over the runs of its CPU per report over the run's floor."""
    return {
        k: None
        if roles[0][k] is None
        else round(
            statistics.median((r[k] or 0.0) / f for r, f in zip(roles, floors, strict=True)), 2
        )
        for k in roles[0]
    }


# --ratios: the configurations whose CPU per report issue 28 states as a
# ratio to one HPKE open: (label, VDAF, PostgreSQL?, reports a run).
RATIO_CONFIGS = (
    ("Count, PostgreSQL", "count", True, 12_000),
    ("Count, SQLite", "count", False, 12_000),
    ("Histogram(100,10), PostgreSQL", "histogram", True, 6_000),
    ("Histogram(100,10), SQLite", "histogram", False, 6_000),
)


# Jobs of 500: the default before issue 28's jobs grew, printed beside the
# default for comparison with the tables measured then.
EARLIER_JOB_SIZE = 500

# One run of --ratios: reports/s, CPU µs per report by role, and the two
# floors measured before it (cryptography's single-shot open, veil's own).
RatioRow = tuple[float, dict[str, float | None], float, float]


def ratio_table(
    dsn: str,
    runs: int,
    job_sizes: list[int],
    scale: float,
    profile: Path | None,
    threads: int | None = None,
) -> None:
    """Each configuration once per round and job size, rounds interleaved,
    the HPKE open floors measured before every run; per job size and
    configuration the median CPU µs per report of each role and the medians
    of the runs' ratios to their floors (`cryptography`'s single-shot open,
    then veil's own)."""
    per: dict[tuple[int, str], list[RatioRow]] = {
        (size, label): [] for size in job_sizes for label, *_ in RATIO_CONFIGS
    }
    ios: dict[tuple[int, str], list[dict[str, tuple[float, float]]]] = {
        (size, label): [] for size in job_sizes for label, *_ in RATIO_CONFIGS
    }
    for i in range(runs):
        for size in job_sizes:
            for label, vdaf, pg, reports in RATIO_CONFIGS:
                floor, veil_floor = hpke_open_floors()
                exact: list[bool] = []
                n = max(500, int(reports * scale))
                first = i == 0 and size == job_sizes[0]
                ios[size, label].append({})
                rate, cpu = one_run(
                    dsn if pg else None,
                    1,
                    n,
                    size,
                    1,
                    vdaf,
                    exact,
                    profile if first else None,
                    ios[size, label][-1],
                    threads=threads,
                )
                if not all(exact):
                    raise RuntimeError(f"{label}: the collected aggregate was not exact")
                roles = by_role(cpu)
                per[size, label].append((rate, roles, floor, veil_floor))
                print(
                    f"  round {i + 1}, jobs of {size}, {label}: open {floor:.1f} µs (veil's"
                    f" {veil_floor:.1f}), {roles}, {rate:.0f} reports/s, load average"
                    f" {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    for size in job_sizes:
        print_ratios(
            size,
            runs,
            {label: per[size, label] for label, *_ in RATIO_CONFIGS},
            threads,
            {label: ios[size, label] for label, *_ in RATIO_CONFIGS},
        )


def print_ratios(
    job_size: int,
    runs: int,
    per: dict[str, list[RatioRow]],
    threads: int | None = None,
    ios: dict[str, list[dict[str, tuple[float, float]]]] | None = None,
) -> None:
    """One table of --ratios: its runs in jobs of `job_size`."""
    default = " (the default)" if job_size == DEFAULT_JOB_SIZE else ""
    print(
        f"\nCPU µs per report (x one HPKE open measured before each run: cryptography's"
        f" single shot / veil.hpke.open_; medians of {runs} rounds), jobs of"
        f" {job_size}{default}, open_threads {'default' if threads is None else threads},"
        f" {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "| configuration | HPKE open µs (cryptography / veil) | helper | leader worker"
        " | upload front end | SQLite leader process | reports/s |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, *_ in RATIO_CONFIGS:
        rows = per[label]
        pg = "PostgreSQL" in label

        def cell(role: str, rows: list[RatioRow] = rows) -> str:
            if rows[0][1][role] is None:
                return ""
            us = statistics.median(r[role] or 0.0 for _, r, _, _ in rows)
            x = statistics.median((r[role] or 0.0) / f for _, r, f, _ in rows)
            xv = statistics.median((r[role] or 0.0) / v for _, r, _, v in rows)
            return f"{us:.1f} ({x:.2f}x / {xv:.2f}x)"

        floor = statistics.median(r[2] for r in rows)
        veil_floor = statistics.median(r[3] for r in rows)
        rate = statistics.median(r[0] for r in rows)
        print(
            f"| {label} | {floor:.1f} / {veil_floor:.1f} | {cell('helper')}"
            f" | {cell('worker') if pg else ''} | {cell('upload') if pg else ''}"
            f" | {'' if pg else cell('worker')} | {rate:.0f} |"
        )
    if ios is None:
        return
    print(
        "\nBytes per report (medians): written / read by the leader's process (on PostgreSQL"
        " the worker's), by its system calls; on PostgreSQL also the server's WAL (both"
        " aggregators)"
    )
    print("| configuration | leader process written / read | PostgreSQL WAL |")
    print("|---|---|---|")
    for label, *_ in RATIO_CONFIGS:
        runs_io = ios[label]
        leader = next(name for name in runs_io[0] if name.startswith("worker"))
        written = statistics.median(r[leader][0] for r in runs_io)
        read = statistics.median(r[leader][1] for r in runs_io)
        wal = statistics.median(r["wal"][0] for r in runs_io) if "wal" in runs_io[0] else None
        print(f"| {label} | {written:.0f} / {read:.0f} | {'' if wal is None else f'{wal:.0f}'} |")


def threads_table(dsn: str, counts: list[int], runs: int, reports: int, job_size: int) -> None:
    """Count on PostgreSQL, one worker and one helper process, with each
    `open_threads` in `counts`, rounds interleaved: the rate, each role's
    CPU per report (over veil's open, measured before each run) and each
    process's CPU over the wall time (above 1: more than one core)."""
    per: dict[int, list[tuple[float, dict[str, float], float]]] = {k: [] for k in counts}
    for i in range(runs):
        for k in counts:
            _floor, veil_floor = hpke_open_floors()
            exact: list[bool] = []
            rate, cpu = one_run(dsn, 1, reports, job_size, 1, "count", exact, threads=k)
            if not all(exact):
                raise RuntimeError(f"open_threads {k}: the collected aggregate was not exact")
            per[k].append((rate, cpu, veil_floor))
            print(
                f"  round {i + 1}, open_threads {k}: {rate:.0f} reports/s,"
                f" helper CPU/wall {cpu['helper 1'] * rate / 1e6:.2f},"
                f" worker CPU/wall {cpu['worker 1'] * rate / 1e6:.2f}",
                flush=True,
            )
    print(
        f"\nCount, jobs of {job_size}, {reports} reports a run, PostgreSQL, one worker and one"
        f" helper, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; medians of {runs}"
    )
    print(
        "| open_threads | reports/s | wall s a run | helper µs (x veil's open) | worker µs"
        " | helper CPU/wall | worker CPU/wall |"
    )
    print("|---|---|---|---|---|---|---|")
    for k in counts:
        rows = per[k]
        rate = statistics.median(r for r, _, _ in rows)

        def us(name: str, rows: list[tuple[float, dict[str, float], float]] = rows) -> str:
            x = statistics.median(c[name] / v for _, c, v in rows)
            return f"{statistics.median(c[name] for _, c, _ in rows):.1f} ({x:.2f}x)"

        def busy(name: str, rows: list[tuple[float, dict[str, float], float]] = rows) -> float:
            return statistics.median(r * c[name] / 1e6 for r, c, _ in rows)

        print(
            f"| {k} | {rate:.0f} | {reports / rate:.1f} | {us('helper 1')} | {us('worker 1')}"
            f" | {busy('helper 1'):.2f} | {busy('worker 1'):.2f} |"
        )


def fit_per_job(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(a, b) of CPU per job = a + b * n, from (n, CPU µs per report) points:
    least squares of the CPU per report, b + a / n, against 1 / n."""
    xs = [1 / n for n, _ in points]
    ys = [c for _, c in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    if spread == 0:
        raise ValueError("a fit needs at least two job sizes")
    a = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / spread
    return a, my - a * mx


def fit_table(
    dsn: str, sizes: list[int], runs: int, reports: int, vdaf: str, threads: int | None
) -> None:
    """What a job costs whatever its size: one deployment per backend and
    job size in each round, rounds interleaved, the open measured before
    each run; per backend and role the fit of CPU per job = a + b * n over
    every run (a in ms, b in µs and as a ratio to the median open)."""
    points: dict[tuple[str, str], list[tuple[int, float]]] = {}
    floors: list[float] = []
    for i in range(runs):
        for backend, backend_dsn in (("PostgreSQL", dsn), ("SQLite", None)):
            for size in sizes:
                floor, _ = hpke_open_floors()
                floors.append(floor)
                exact: list[bool] = []
                _, cpu = one_run(backend_dsn, 1, reports, size, 1, vdaf, exact, threads=threads)
                if not all(exact):
                    raise RuntimeError(f"{backend}, jobs of {size}: the aggregate was not exact")
                roles = by_role(cpu)
                for role, us in roles.items():
                    if us is not None:
                        points.setdefault((backend, role), []).append((size, us))
                print(
                    f"  round {i + 1}, {backend}, jobs of {size}: open {floor:.1f} µs, {roles},"
                    f" load average {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    floor = statistics.median(floors)
    names = {"helper": "helper", "worker": "worker", "upload": "upload front end"}
    print(
        f"\nCPU per job = a + b x reports, {vdaf}, jobs of {', '.join(map(str, sizes))},"
        f" {reports} reports a run, {runs} rounds; HPKE open {floor:.1f} µs (median),"
        f" load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "| backend | process | a: ms a job | b: µs a report | b / open | µs a report at jobs of"
        f" 500 | at {DEFAULT_JOB_SIZE} (the default) |"
    )
    print("|---|---|---|---|---|---|---|")
    for (backend, role), pts in points.items():
        a, b = fit_per_job(pts)
        process = "leader process" if backend == "SQLite" and role == "worker" else names[role]
        print(
            f"| {backend} | {process} | {a / 1000:.2f} | {b:.1f} | {b / floor:.2f} |"
            f" {b + a / 500:.1f} | {b + a / DEFAULT_JOB_SIZE:.1f} |"
        )


def scale_table(dsn: str, counts: list[int], runs: int, reports: int, job_size: int) -> None:
    """k workers and k helper processes for each k, rounds interleaved: the
    aggregation rate, the CPU per report of each role (what adding processes
    costs in work) and how busy the busiest process was (CPU seconds over
    wall seconds: near 1 means it was the bottleneck, given a core)."""
    per: dict[int, list[tuple[float, dict[str, float]]]] = {k: [] for k in counts}
    for i in range(runs):
        for k in counts:
            exact: list[bool] = []
            rate, cpu = one_run(dsn, k, reports, job_size, k, "count", exact)
            if not all(exact):
                raise RuntimeError(f"{k} processes: the collected aggregate was not exact")
            per[k].append((rate, cpu))
            print(f"  round {i + 1}, {k} + {k}: {rate:.0f} reports/s", flush=True)
    print(
        f"\nCount, jobs of {job_size}, {reports} reports a run, PostgreSQL, {os.cpu_count()} CPUs,"
        f" load average {os.getloadavg()[0]:.1f}; medians of {runs}"
    )
    print(
        "| workers + helpers | reports/s | x one of each | helper µs | worker µs"
        " | front end µs | busiest process, CPU/wall |"
    )
    print("|---|---|---|---|---|---|---|")
    base = statistics.median(r for r, _ in per[counts[0]])
    for k in counts:
        rows = per[k]
        rate = statistics.median(r for r, _ in rows)
        roles = [by_role(c) for _, c in rows]
        med = {role: statistics.median(r[role] or 0.0 for r in roles) for role in roles[0]}
        busiest = statistics.median(r * max(c.values()) / 1e6 for r, c in rows)
        print(
            f"| {k} + {k} | {rate:.0f} | {rate / base:.2f} | {med['helper']:.1f}"
            f" | {med['worker']:.1f} | {med['upload']:.1f} | {busiest:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--job-size",
        type=int,
        help=f"reports per aggregation job (default: the servers' default, {DEFAULT_JOB_SIZE};"
        f" with --ratios, both {DEFAULT_JOB_SIZE} and {EARLIER_JOB_SIZE})",
    )
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
    parser.add_argument(
        "--ratios",
        action="store_true",
        help="Count and Histogram(100,10) on both backends, interleaved, as ratios to one HPKE"
        " open measured in the same run (--runs rounds; --scale shrinks the reports a run)",
    )
    parser.add_argument("--scale", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        help="the servers' open_threads: several values compare them (Count, PostgreSQL, one"
        " worker and one helper, interleaved); one value sets it for --json and --ratios",
    )
    parser.add_argument(
        "--fit",
        type=int,
        nargs="+",
        metavar="SIZE",
        help="job sizes: on both backends, CPU per job fitted as a + b x reports for each"
        " process (--vdaf, --reports, --runs rounds)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        nargs="+",
        help="k workers and k helper processes for each k given (Count), interleaved",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="a directory: py-spy samples every server process (flame graph and collapsed"
        " stacks; with --ratios, the first round)",
    )
    args = parser.parse_args()
    if args.ratios:
        ratio_sizes = [args.job_size] if args.job_size else [DEFAULT_JOB_SIZE, EARLIER_JOB_SIZE]
    if args.job_size is None:
        args.job_size = DEFAULT_JOB_SIZE
    compare_threads = args.threads is not None and len(args.threads) > 1
    if (args.json or args.ratios) and compare_threads:
        parser.error("--json and --ratios take one --threads value")
    if args.fit:
        if len(set(args.fit)) < 2 or min(args.fit) < 1:
            parser.error("--fit takes at least two different job sizes, each at least 1")
        with ExitStack() as stack:
            dsn = args.dsn or stack.enter_context(postgres_dsn())
            threads = args.threads[0] if args.threads else None
            fit_table(dsn, sorted(set(args.fit)), args.runs, args.reports, args.vdaf, threads)
        return
    if args.ratios or args.processes or compare_threads:
        with ExitStack() as stack:
            dsn = args.dsn or stack.enter_context(postgres_dsn())
            threads = args.threads[0] if args.threads else None
            if args.ratios:
                ratio_table(
                    dsn,
                    args.runs,
                    sorted(set(ratio_sizes), reverse=True),
                    args.scale,
                    args.profile,
                    threads,
                )
            if args.processes:
                scale_table(dsn, args.processes, args.runs, args.reports, args.job_size)
            if compare_threads:
                threads_table(dsn, args.threads, args.runs, args.reports, args.job_size)
        return
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
