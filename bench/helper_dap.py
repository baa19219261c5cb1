"""The helper's CPU per report over DAP and over veil's gRPC, in one process
and one run (issue 43's speed check: a Count report at the helper over DAP
within 1.2x the gRPC path's).

One helper (`Helper`, on a fresh SQLite store each round) holds two Count
tasks alike but for the transport: one served over gRPC, one over DAP.
Each round feeds it the request bytes a leader sends, built as an honest
leader builds them: for gRPC the serialised AggregationJobRequest the
servicer parses (`HelperService.Aggregate`, its answer serialised), for DAP
the AggregationJobInitReq body the route hands to `DapHelper.init_job` (the
AggregationJobResp it returns). Neither includes its transport (gRPC's
HTTP/2, Starlette's request parsing): the two are measured at the same
depth, from the request's bytes to the answer's. The process's CPU clock
(the helper's opener threads included) is read around each job; the two
paths' jobs take turns, which goes first alternating, so that each round's
ratio compares jobs run a moment apart and a machine's changing load falls
on both alike."""

from __future__ import annotations

import gc
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.helper_jobs import CallContext, honest_items
from veil.aggregator.helper import Helper
from veil.aggregator.leader.helper_client import aggregation_job_request
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.run.service import HelperService
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.dap.jobs import AggregationJobInitReq, ReportShare, VerifyInit
from veil.dap.pingpong import initialize
from veil.dap.report import prepare_report
from veil.dap.shares import open_input_share
from veil.dap.versions import DapVersion, Role, vdaf_context
from veil.hpke import HpkeConfig, generate_keypair
from veil.protocol.v1 import helper_pb2
from veil.task import DapSpec, DpSpec, TaskFiles, VdafSpec, new_task
from veil.vdaf.engine import engine_for

TP = 3600
VERSION = DapVersion.DAP_19


def count_tasks() -> tuple[TaskFiles, TaskFiles]:
    """Two Count tasks, no DP: the first served over gRPC, the second over DAP."""
    addresses = ("127.0.0.1:1", "127.0.0.1:2")
    dap = DapSpec("https://leader.example/", "https://helper.example/", VERSION.value, "bench")
    return (
        new_task(VdafSpec("count"), *addresses, min_batch_size=1, dp=DpSpec("none")),
        new_task(VdafSpec("count"), *addresses, min_batch_size=1, dp=DpSpec("none"), dap=dap),
    )


def dap_job_bodies(
    files: TaskFiles, measurements: Sequence[Any], job_size: int, helper: HpkeConfig, when: int
) -> list[bytes]:
    """The AggregationJobInitReq bodies an honest leader sends for
    `measurements` of `files`' DAP task at `when` (seconds), `job_size`
    reports a job: each report sealed as a DAP client seals it, the leader's
    share opened and verified on the batched path under the context
    ``"dap-19" || task_id``, its verifier share in an `initialize` message."""
    task = files.leader
    vdaf = task.vdaf.instantiate()
    config = task.dap_configuration()
    leader_keys = generate_keypair(1)
    reports = [
        prepare_report(
            VERSION, task.task_id, config, vdaf, m, when // TP, leader_keys.config, helper
        )
        for m in measurements
    ]
    shares = [
        open_input_share(
            VERSION, leader_keys, Role.LEADER, task.task_id, config, r.metadata,
            r.public_share, r.leader_encrypted_input_share,
        ).payload
        for r in reports
    ]  # fmt: skip
    first = engine_for(vdaf).verify_init(
        task.verify_key,
        vdaf_context(VERSION, task.task_id),
        0,
        None,
        [r.metadata.report_id for r in reports],
        [r.public_share for r in reports],
        shares,
    )
    inits = []
    for i, (r, error, share) in enumerate(
        zip(reports, first.errors, first.verifier_shares, strict=True)
    ):
        if error is not None or share is None:
            raise ValueError(f"report {i}: the leader's verification failed: {error}")
        inits.append(
            VerifyInit(
                ReportShare(r.metadata, r.public_share, r.helper_encrypted_input_share),
                initialize(share),
            )
        )
    return [
        AggregationJobInitReq(0, b"", (), tuple(inits[i : i + job_size])).encode()
        for i in range(0, len(inits), job_size)
    ]


@dataclass(frozen=True)
class Round:
    """CPU µs per report of one round's gRPC and DAP jobs, and which path
    ran first in the round's first pair."""

    grpc: float
    dap: float
    dap_first: bool

    @property
    def ratio(self) -> float:
        return self.dap / self.grpc


def one_round(reports: int, job_size: int, dap_first: bool) -> Round:
    """Both paths over `reports` fresh Count reports each, on a fresh helper."""
    grpc_files, dap_files = count_tasks()
    now = int(time.time())
    when = now - now % TP - TP
    measurements = [i % 2 for i in range(reports)]
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        store = SqliteDatastore(Path(tmp) / "helper.db")
        stack.callback(store.close)
        tasks = {f.helper.task_id: f.helper for f in (grpc_files, dap_files)}
        helper = Helper(
            tasks,
            store,
            PrivacyEngine(
                str(Path(tmp) / "ledger.db"),
                [grpc_files.helper, dap_files.helper],
                allow_exact_release=True,
            ),
        )
        stack.callback(helper.opener.close)
        service = HelperService(helper)
        context = CallContext(grpc_files.leader.aggregator_token)
        grpc_jobs = [
            aggregation_job_request(
                grpc_files.leader.task_id,
                secrets.token_bytes(16),
                honest_items(
                    grpc_files.leader,
                    measurements[i : i + job_size],
                    helper.current_config,
                    when,
                ),
            ).SerializeToString()
            for i in range(0, reports, job_size)
        ]
        dap_jobs = dap_job_bodies(dap_files, measurements, job_size, helper.current_config, when)
        parse = helper_pb2.AggregationJobRequest.FromString
        serialize = helper_pb2.AggregationJobResponse.SerializeToString

        dap_id, token = dap_files.leader.task_id, dap_files.leader.aggregator_token
        spent = {"grpc": 0.0, "dap": 0.0}
        # Each round starts from a collected heap: the collections its jobs
        # cause (more for the path that allocates more) are its own.
        gc.collect()

        # Job by job, the two paths in turn (which goes first alternating),
        # so that a change of the machine's load falls on both alike.
        def grpc_job(raw: bytes) -> None:
            serialize(service.Aggregate(parse(raw), context))

        def dap_job(body: bytes) -> None:
            helper.dap.init_job(dap_id, token, body)

        for i, (raw, body) in enumerate(zip(grpc_jobs, dap_jobs, strict=True)):
            steps: list[tuple[str, Callable[[bytes], None], bytes]] = [
                ("grpc", grpc_job, raw),
                ("dap", dap_job, body),
            ]
            if dap_first == (i % 2 == 0):
                steps.reverse()
            for name, step, request in steps:
                began = time.process_time()
                step(request)
                spent[name] += time.process_time() - began
        spent = {name: cpu * 1e6 / reports for name, cpu in spent.items()}
        held = {
            task_id: store.batch_aggregates(task_id, 0, 2**63 - 1)
            for task_id in (grpc_files.helper.task_id, dap_files.helper.task_id)
        }
        # Every report of both paths aggregated: nothing was refused.
        assert all(sum(a.report_count for a in aggs) == reports for aggs in held.values())
    return Round(spent["grpc"], spent["dap"], dap_first)


def run(
    rounds: int, reports: int, job_size: int, say: Callable[[str], None] = print
) -> list[Round]:
    """`rounds` rounds, the order of the two paths alternating."""
    out = []
    for i in range(rounds):
        r = one_round(reports, job_size, dap_first=i % 2 == 1)
        say(
            f"  round {i + 1}: gRPC {r.grpc:.1f} µs, DAP {r.dap:.1f} µs per report,"
            f" ratio {r.ratio:.2f} ({'DAP' if r.dap_first else 'gRPC'} first)"
        )
        out.append(r)
    return out


def table(rounds: Sequence[Round], reports: int, job_size: int) -> str:
    """The markdown table of the rounds' medians."""
    grpc = statistics.median(r.grpc for r in rounds)
    dap = statistics.median(r.dap for r in rounds)
    ratios = sorted(r.ratio for r in rounds)
    return "\n".join(
        [
            f"Count, jobs of {job_size}, SQLite, {reports} reports a path a round,"
            f" {len(rounds)} rounds, load average {os.getloadavg()[0]:.1f} at the end",
            "| path | CPU µs per report (median) |",
            "|---|---|",
            f"| gRPC (AggregationJobRequest) | {grpc:.1f} |",
            f"| DAP (AggregationJobInitReq) | {dap:.1f} |",
            f"| ratio DAP/gRPC, median of the rounds' | {statistics.median(ratios):.2f}"
            f" (from {ratios[0]:.2f} to {ratios[-1]:.2f}) |",
        ]
    )
