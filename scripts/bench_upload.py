"""The leader's upload path in this process: what one UploadReports call
costs per report, step by step, against one HPKE open measured in the same run.

The leader logic runs here on a fresh SQLite store (as `veil serve` on its
default storage), reached through its gRPC servicer as the server calls it
(the request's bytes parsed, the handler run, the answer serialised), with
no network in between. Each upload is `--batch` reports of one task, built
and serialised before the clock starts; the store already holds `--stored`
reports of the task, as a leader holds a backlog (the cost of the random
report-id B-trees grows with it). Rounds alternate over fresh stores; each
figure is the median over `--runs` rounds of CPU time (`time.process_time`)
per report, and its ratio to `cryptography`'s single-shot HPKE open measured
in the same round.

    python scripts/bench_upload.py --vdaf histogram --batch 1000 --uploads 12 --runs 5

Steps: "parse" (the request's bytes to the protobuf message), "decode" (the
message to the values the upload logic checks), "check" (the upload's checks,
without the store), "store" (the store's transaction), "whole call" (the
servicer's method from bytes to bytes, measured apart over fresh reports).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.leader import NOW, TP, upload_leader
from scripts.bench_workers import VDAFS, hpke_open_floors
from veil.aggregator.leader import upload as upload_module
from veil.aggregator.run.service import LeaderService, add_service
from veil.client import prepare_reports
from veil.messages.wire import upload_request
from veil.protocol.v1 import leader_pb2
from veil.task import DpSpec, new_task
from veil.vdaf.batch.prio3 import BatchPrio3

STEPS = ("parse", "decode", "check", "store")


class Methods:
    """Collects what add_service registers, as the server would serve it."""

    def __init__(self) -> None:
        self.methods: dict[str, Any] = {}

    def add_unary_service(self, name: str, methods: dict[str, Any]) -> None:
        self.methods.update(methods)


def timed(cost: dict[str, float], name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.process_time()
        try:
            return f(*args, **kwargs)
        finally:
            cost[name] += time.process_time() - t

    return wrapper


def one_round(vdaf: str, batch: int, uploads: int, stored: int) -> dict[str, float]:
    """CPU µs per report of each step, and of the whole call, in a fresh store."""
    spec, value = VDAFS[vdaf]
    files = new_task(spec, "127.0.0.1:1", "127.0.0.1:2", min_batch_size=1, dp=DpSpec("none"))
    t = NOW - NOW % TP - TP
    with tempfile.TemporaryDirectory() as tmp, upload_leader(files, Path(tmp)) as (leader, helper):
        prio3 = BatchPrio3(files.client.vdaf.instantiate())

        def build(n: int) -> bytes:
            reports = prepare_reports(
                files.client,
                [value(i) for i in range(n)],
                leader.current_config,
                helper,
                t,
                batch=prio3,
            )
            return upload_request(files.client.task_id, reports).SerializeToString()

        task_id = files.client.task_id
        for at in range(0, stored, 10_000):
            n = min(10_000, stored - at)
            leader.upload(task_id, list(world_reports(build(n))))
        calls = [build(batch) for _ in range(2 * uploads)]
        cost: dict[str, float] = defaultdict(float)
        # The steps, timed inside the path (the timers' own cost included).
        store = leader.store
        originals = instrument(cost, store)
        try:
            call = upload_method(leader)
            for raw in calls[:uploads]:
                t0 = time.process_time()
                leader_pb2.UploadRequest.FromString(raw)
                cost["parse"] += time.process_time() - t0
                call(raw, None)
        finally:
            restore(store, originals)
        call = upload_method(leader)
        whole = 0.0
        for raw in calls[uploads:]:
            t0 = time.process_time()
            call(raw, None)
            whole += time.process_time() - t0
        n = uploads * batch
        out = {k: cost[k] * 1e6 / n for k in STEPS}
        out["check"] -= out["store"]
        out["decode"] -= out["check"] + out["store"]
        out["whole call"] = whole * 1e6 / n
        return out


def upload_method(leader: Any) -> Callable[[bytes, Any], bytes]:
    """UploadReports as the server registers it: bytes in, bytes out."""
    sink = Methods()
    service = leader_pb2.DESCRIPTOR.services_by_name["Leader"]
    add_service(sink, LeaderService(leader), service, None)  # type: ignore[arg-type]
    call: Callable[[bytes, Any], bytes] = sink.methods["UploadReports"].call
    return call


def world_reports(raw: bytes) -> Any:
    from veil.messages.wire import reports_from_upload

    return reports_from_upload(leader_pb2.UploadRequest.FromString(raw))


def instrument(cost: dict[str, float], store: Any) -> dict[str, Any]:
    """Time the decode (the handler from its message on), the checks and the store."""
    # The store's upload unit (put_reports before it took a ReportBatch).
    unit = "put_report_batch" if hasattr(store, "put_report_batch") else "put_reports"
    originals = {
        "handler": LeaderService.UploadReports,
        "writer": upload_module.ReportWriter.upload,
        "unit": unit,
        "store": getattr(store, unit),
    }
    LeaderService.UploadReports = timed(cost, "decode", LeaderService.UploadReports)  # type: ignore[method-assign]
    upload_module.ReportWriter.upload = timed(cost, "check", upload_module.ReportWriter.upload)  # type: ignore[method-assign]
    setattr(store, unit, timed(cost, "store", getattr(store, unit)))
    return originals


def restore(store: Any, originals: dict[str, Any]) -> None:
    LeaderService.UploadReports = originals["handler"]  # type: ignore[method-assign]
    upload_module.ReportWriter.upload = originals["writer"]  # type: ignore[method-assign]
    setattr(store, originals["unit"], originals["store"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vdaf", choices=sorted(VDAFS), default="histogram")
    parser.add_argument("--batch", type=int, default=1000, help="reports per upload")
    parser.add_argument("--uploads", type=int, default=12, help="uploads timed per round")
    parser.add_argument("--stored", type=int, default=10_000, help="reports stored before")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    rounds: list[dict[str, float]] = []
    for _ in range(args.runs):
        floor, _veil = hpke_open_floors()
        r = one_round(args.vdaf, args.batch, args.uploads, args.stored)
        r["open"] = floor
        rounds.append(r)
    print(
        f"{args.vdaf}, uploads of {args.batch}, {args.stored} reports stored before;"
        f" medians of {args.runs} rounds, CPU µs per report"
    )
    print("| step | µs per report | ratio to one HPKE open |")
    print("|---|---|---|")
    for name in (*STEPS, "whole call", "open"):
        us = statistics.median(r[name] for r in rounds)
        ratio = statistics.median(r[name] / r["open"] for r in rounds)
        print(f"| {name} | {us:.1f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
