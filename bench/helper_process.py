"""The helper's whole-process CPU per Count report over DAP against veil's
gRPC (issue 43's speed check, transports included): a real `veil helper`
process serving both listeners, its CPU read from the kernel around every
request.

The helper runs as `veil helper` runs it (gRPC on one loopback port, the
DAP routes under uvicorn behind the connection guard on the `[dap] listen`
port, SQLite or PostgreSQL), with two Count tasks alike but for the
protocol. This process plays the leader: it sends the requests an honest
leader sends, built before each round and outside every measurement (the
reports sealed, the leader's share verified, the requests' bytes made as in
`bench.helper_dap`), gRPC's over one channel kept open as the leader keeps
it, DAP's with urllib as the leader's `DapHelperClient` sends them (a
connection a request). A round sends each path's jobs, the two paths in
turn and which goes first alternating, then each path's aggregate share
request for the round's batch (a time bucket of its own); the helper's
answer to the share request is also the check that it aggregated every
report (it refuses a count or checksum other than its own).

What is counted: all the helper process's CPU, user and system, in every
thread (gRPC's and uvicorn's, the opener's, the database's), from just
before a request is sent to just after its answer is read: the transports,
the routing and the connection guard, the body read, authentication, the
decoding, opening and verifying, the store and the answer's encoding.
What is not: this process's own work (the leader's side), and a
PostgreSQL server's (another process). The clock is each thread's
``sum_exec_runtime`` (/proc/PID/task/TID/schedstat, nanoseconds), summed;
/proc/PID/stat's utime+stime counts whole 10 ms ticks, too coarse for one
job, and is kept as a cross-check over the whole run."""

from __future__ import annotations

import os
import secrets
import statistics
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench.helper_dap import TP, count_tasks, dap_job_bodies
from bench.helper_jobs import honest_items
from bench.profiling import Profiler
from veil.aggregator.core import CHECKSUM_SIZE, report_checksum, xor
from veil.aggregator.leader.dap import collection_job_req
from veil.aggregator.leader.helper_client import aggregation_job_request
from veil.aggregator.wire import interval_pb, window_pb
from veil.dap.jobs import AggregateShareReq, AggregationJobInitReq, BatchSelector
from veil.dap.messages import BatchMode, HpkeConfigList, Interval
from veil.dap.problems import media_type
from veil.hpke import HpkeConfig
from veil.local.launcher import ServerProcess, free_port
from veil.protocol.v1 import helper_pb2
from veil.task import TaskFiles, write_toml

_SERVICE = helper_pb2.DESCRIPTOR.services_by_name["Helper"].full_name


def thread_cpu_ns(pid: int) -> int:
    """The CPU time, in nanoseconds, of `pid`'s live threads together."""
    total = 0
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            pass  # a thread that ended between the listing and the read
    return total


def tick_cpu_ns(pid: int) -> int:
    """utime + stime of `pid` (every thread's, ended ones included), in ns."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


@dataclass
class HelperProcess:
    """A running `veil helper` and what the leader needs to reach it."""

    server: ServerProcess
    grpc_address: str
    dap_url: str

    @property
    def pid(self) -> int:
        pid = self.server.pid
        assert pid is not None
        return pid


@contextmanager
def helper_process(root: Path, tasks: Sequence[TaskFiles], storage: str) -> Iterator[HelperProcess]:
    """`veil helper` serving `tasks` in `root` (gRPC and DAP on free loopback
    ports, storing in `storage`: a file name or a PostgreSQL URL, exact
    releases allowed), stopped on leaving."""
    names = []
    for i, files in enumerate(tasks):
        names.append(f"task{i}.helper.toml")
        write_toml(root / names[-1], files.helper.to_dict(), secret=True)
    listen, dap = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    config: dict[str, Any] = {
        "listen": listen,
        "storage": storage,
        "tasks": names,
        "allow_exact_release": True,
        "dap": {"listen": dap},
    }
    write_toml(root / "helper.toml", config, secret=False)
    server = ServerProcess("helper", root / "helper.toml", root / "helper.log", listen)
    server.start()
    try:
        yield HelperProcess(server, listen, f"http://{dap}")
    finally:
        server.stop()


def _http(
    url: str, body: bytes | None, headers: dict[str, str], method: str
) -> tuple[int, str, bytes]:
    """One request as the leader's DapHelperClient sends it (urllib, a
    connection of its own): (status, content type, body)."""
    request = urllib.request.Request(url, body, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, r.headers.get("content-type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type", ""), e.read()


def hpke_config(helper: HelperProcess) -> HpkeConfig:
    """The helper's current HPKE config, from its DAP HpkeConfigList."""
    status, _, body = _http(f"{helper.dap_url}/hpke_config", None, {}, "GET")
    if status != 200:
        raise RuntimeError(f"GET /hpke_config answered {status}: {body[:200]!r}")
    found = HpkeConfigList.decode(body).first_supported()
    assert found is not None
    return found


@dataclass(frozen=True)
class Requests:
    """One round's requests of one path: its jobs' bytes and its aggregate
    share request's."""

    jobs: list[bytes]
    share: bytes


def _checksum(report_ids: Sequence[bytes]) -> bytes:
    checksum = bytes(CHECKSUM_SIZE)
    for report_id in report_ids:
        checksum = xor(checksum, report_checksum(report_id))
    return checksum


def grpc_requests(
    files: TaskFiles, reports: int, job_size: int, helper: HpkeConfig, start: int
) -> Requests:
    """The serialised AggregationJobRequests of `reports` Count reports at
    `start` (a bucket's first second) and the AggregateShareRequest of that
    bucket, as veil's leader sends them over gRPC."""
    task = files.leader
    measurements = [i % 2 for i in range(reports)]
    jobs, ids = [], []
    for i in range(0, reports, job_size):
        items = honest_items(task, measurements[i : i + job_size], helper, start)
        ids += [it.report_id for it in items]
        window = (task.not_before, task.not_after)
        request = aggregation_job_request(
            task.task_id, secrets.token_bytes(16), items, None, window
        )
        jobs.append(request.SerializeToString())
    share = helper_pb2.AggregateShareRequest(
        task_id=task.task_id,
        collection_job_id=secrets.token_bytes(16),
        batch_interval=interval_pb(start, TP),
        report_count=reports,
        checksum=_checksum(ids),
        task_window=window_pb(task.not_before, task.not_after),
    )
    return Requests(jobs, share.SerializeToString())


def dap_requests(
    files: TaskFiles, reports: int, job_size: int, helper: HpkeConfig, start: int
) -> Requests:
    """The AggregationJobInitReq bodies of `reports` Count reports at `start`
    and the AggregateShareReq of that bucket, as veil's leader sends them
    over DAP."""
    task = files.leader
    jobs = dap_job_bodies(files, [i % 2 for i in range(reports)], job_size, helper, start)
    ids = [
        init.report_share.metadata.report_id
        for body in jobs
        for init in AggregationJobInitReq.decode(body).verify_inits
    ]
    share = AggregateShareReq(
        collection_job_req(task, start, TP),
        BatchSelector(BatchMode.TIME_INTERVAL, Interval(start // TP, 1)),
        reports,
        _checksum(ids),
    )
    return Requests(jobs, share.encode())


class Leader:
    """This process as the helper's leader: sends one request of a path and
    checks that it was answered."""

    def __init__(self, helper: HelperProcess, grpc_files: TaskFiles, dap_files: TaskFiles) -> None:
        self.channel = grpc.insecure_channel(
            helper.grpc_address,
            options=[
                ("grpc.max_receive_message_length", 1 << 24),
                ("grpc.max_send_message_length", 1 << 24),
            ],
        )
        # Raw bytes both ways: the requests are serialised beforehand.
        self.aggregate = self.channel.unary_unary(f"/{_SERVICE}/Aggregate")
        self.get_share = self.channel.unary_unary(f"/{_SERVICE}/GetAggregateShare")
        self.metadata = (("authorization", f"Bearer {grpc_files.leader.aggregator_token}"),)
        task = dap_files.leader
        self.dap_base = f"{helper.dap_url}/tasks/{task.id_text}"
        self.dap_auth = f"Bearer {task.aggregator_token}"

    def close(self) -> None:
        self.channel.close()

    def grpc_job(self, raw: bytes) -> None:
        self.aggregate(raw, metadata=self.metadata, timeout=120)

    def grpc_share(self, raw: bytes) -> None:
        self.get_share(raw, metadata=self.metadata, timeout=120)

    def dap_job(self, body: bytes) -> None:
        self._dap("aggregation_jobs", body, "aggregation-job-init-req", "aggregation-job-resp")

    def dap_share(self, body: bytes) -> None:
        self._dap("aggregate_shares", body, "aggregate-share-req", "aggregate-share")

    def _dap(self, resource: str, body: bytes, sent: str, expected: str) -> None:
        headers = {"Content-Type": media_type(sent), "Authorization": self.dap_auth}
        status, kind, answer = _http(f"{self.dap_base}/{resource}", body, headers, "POST")
        if status != 200 or kind != media_type(expected):
            raise RuntimeError(f"POST {resource} answered {status} {kind}: {answer[:300]!r}")


@dataclass
class Round:
    """The helper's CPU µs per report of one round: each path's jobs and its
    aggregate share request; which path ran first in the round's first
    pair."""

    dap_first: bool
    jobs: dict[str, float] = field(default_factory=dict)
    share: dict[str, float] = field(default_factory=dict)

    def total(self, path: str) -> float:
        return self.jobs[path] + self.share[path]

    @property
    def ratio(self) -> float:
        return self.total("dap") / self.total("grpc")

    @property
    def jobs_ratio(self) -> float:
        return self.jobs["dap"] / self.jobs["grpc"]


@dataclass
class Run:
    rounds: list[Round]
    # utime+stime over every measured request of the run, µs per report.
    ticks: dict[str, float]
    load: tuple[float, float]  # the 1-minute load average at the start and the end


def one_round(
    pid: int, leader: Leader, grpc_side: Requests, dap_side: Requests, dap_first: bool,
    reports: int, ticks: dict[str, int],
) -> Round:  # fmt: skip
    """Both paths' requests, job by job in turn, then both share requests."""
    out = Round(dap_first)
    spent = {"grpc": 0, "dap": 0}
    shared = {"grpc": 0, "dap": 0}

    def measure(path: str, send: Callable[[bytes], None], raw: bytes, into: dict[str, int]) -> None:
        tick = tick_cpu_ns(pid)
        began = thread_cpu_ns(pid)
        send(raw)
        into[path] += thread_cpu_ns(pid) - began
        ticks[path] += tick_cpu_ns(pid) - tick

    for i, (raw, body) in enumerate(zip(grpc_side.jobs, dap_side.jobs, strict=True)):
        steps = [("grpc", leader.grpc_job, raw), ("dap", leader.dap_job, body)]
        if dap_first == (i % 2 == 0):
            steps.reverse()
        for path, send, request in steps:
            measure(path, send, request, spent)
    steps = [
        ("grpc", leader.grpc_share, grpc_side.share),
        ("dap", leader.dap_share, dap_side.share),
    ]
    if dap_first:
        steps.reverse()
    for path, send, request in steps:
        measure(path, send, request, shared)
    out.jobs = {path: ns / 1000 / reports for path, ns in spent.items()}
    out.share = {path: ns / 1000 / reports for path, ns in shared.items()}
    return out


def run(
    rounds: int,
    reports: int,
    job_size: int,
    storage: str | None = None,
    say: Callable[[str], None] = print,
    profile: Path | None = None,
) -> Run:
    """`rounds` rounds of `reports` reports a path on one helper process
    (SQLite, or the PostgreSQL URL `storage`), after a warm-up round of one
    job a path that is not counted; with `profile`, py-spy samples the
    helper over the counted rounds (bench.profiling, into that directory)."""
    grpc_files, dap_files = count_tasks()
    now = int(time.time())
    hour = now - now % TP
    load = os.getloadavg()[0]
    ticks = {"grpc": 0, "dap": 0}
    out = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        helper = stack.enter_context(
            helper_process(Path(tmp), (grpc_files, dap_files), storage or "helper.db")
        )
        config = hpke_config(helper)
        leader = Leader(helper, grpc_files, dap_files)
        stack.callback(leader.close)

        def requests(bucket: int, count: int) -> tuple[Requests, Requests]:
            # Each round a batch of its own, an hour further back.
            start = hour - (bucket + 1) * TP
            return (
                grpc_requests(grpc_files, count, job_size, config, start),
                dap_requests(dap_files, count, job_size, config, start),
            )

        # The compiled kernels, the routes' imports, the first connections.
        one_round(
            helper.pid, leader, *requests(0, job_size), False, job_size, {"grpc": 0, "dap": 0}
        )
        profiler = Profiler(profile, "helper", {"helper": helper.pid})
        stack.callback(profiler.stop)
        for i in range(rounds):
            built = requests(i + 1, reports)
            r = one_round(helper.pid, leader, *built, i % 2 == 1, reports, ticks)
            say(
                f"  round {i + 1}: gRPC {r.total('grpc'):.1f} µs, DAP {r.total('dap'):.1f} µs"
                f" per report (jobs {r.jobs['grpc']:.1f} and {r.jobs['dap']:.1f}), ratio"
                f" {r.ratio:.2f} ({'DAP' if r.dap_first else 'gRPC'} first)"
            )
            out.append(r)
    per_report = {path: ns / 1000 / (reports * rounds) for path, ns in ticks.items()}
    return Run(out, per_report, (load, os.getloadavg()[0]))


def table(result: Run, reports: int, job_size: int, storage: str = "SQLite") -> str:
    """The markdown table of the rounds' medians."""
    rounds = result.rounds

    def spread(values: Callable[[Round], float]) -> str:
        got = sorted(values(r) for r in rounds)
        return f"{statistics.median(got):.2f} ({got[0]:.2f} to {got[-1]:.2f})"

    lines = [
        f"Count, jobs of {job_size}, {storage}, {reports} reports a path a round,"
        f" {len(rounds)} rounds, load average {result.load[0]:.1f} at the start,"
        f" {result.load[1]:.1f} at the end",
        "| helper process CPU µs per report (median) | jobs | aggregate share | all |",
        "|---|---|---|---|",
    ]
    for path, name in (("grpc", "gRPC"), ("dap", "DAP")):
        jobs = statistics.median(r.jobs[path] for r in rounds)
        share = statistics.median(r.share[path] for r in rounds)
        total = statistics.median(r.total(path) for r in rounds)
        lines.append(f"| {name} | {jobs:.1f} | {share:.2f} | {total:.1f} |")
    lines.append(
        "| ratio DAP/gRPC, median of the rounds' (range)"
        f" | {spread(lambda r: r.jobs_ratio)} | | {spread(lambda r: r.ratio)} |"
    )
    lines.append(
        f"utime+stime (10 ms ticks) over every request: gRPC {result.ticks['grpc']:.1f},"
        f" DAP {result.ticks['dap']:.1f} µs per report"
    )
    return "\n".join(lines)
