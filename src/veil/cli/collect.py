"""For the collector of one task: `veil collect`, one batch of the task over
gRPC or, for a task with a [dap] table, over DAP (surveys are collected by
`veil survey collect`, in operator.py)."""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from typing import Any

from veil.cli.common import add_retired_ca, load_task_file, number, read_pem, setup_logging


def cmd_collect(args: argparse.Namespace) -> int:
    from veil.collector import CollectionError, Collector, DapCollector, collector_for
    from veil.task import CollectorTask
    from veil.times import format_time

    name = "veil collect"
    setup_logging(args.log_level)
    task = load_task_file(args.task, CollectorTask, "collect")
    now = int(time.time())
    # DAP's leader-selected mode: the leader chooses each batch.
    chosen = task.dap is not None and task.dap.leader_selected
    if chosen:
        given = [
            option
            for option, value in (
                ("--start", args.start),
                ("--duration", args.duration),
                ("--include-open", args.include_open or None),
            )
            if value is not None
        ]
        if given:
            print(
                f"{name}: {given[0]} names a batch, and this task is leader-selected: its"
                " leader chooses each batch (one that holds min_batch_size reports and was"
                " not collected)",
                file=sys.stderr,
            )
            return 2
        start, duration = 0, 0  # the leader's choice
    else:
        interval = _interval(args, task.time_precision, now, name)
        if interval is None:
            return 2
        start, duration = interval
    job_id = None
    if args.job_id is not None:
        try:
            job_id = bytes.fromhex(args.job_id)
            if len(job_id) != 16:
                raise ValueError
        except ValueError:
            print(f"{name}: --job-id must be 32 hex digits", file=sys.stderr)
            return 2
    try:
        # A task with a [dap] table is collected over DAP (DapCollector).
        collector = collector_for(task, leader_root_certificates=read_pem(args.leader_ca))
    except (OSError, ValueError) as e:  # TrustError, UnusableTask
        print(f"{name}: {e}", file=sys.stderr)
        return 2

    def started(job: bytes) -> None:
        print(
            f"{name}: collection job {job.hex()} (to resume: --job-id {job.hex()})", file=sys.stderr
        )

    with collector:
        try:
            # Over DAP there is no call that checks the collector's key ahead (a
            # wrong one fails when the shares are opened, named), and no job id
            # to choose: the leader names the job (DapCollector's on_job).
            if job_id is None and isinstance(collector, Collector):
                collector.check_collector_key()
                job_id = secrets.token_bytes(16)
                started(job_id)
            asked: dict[str, Any] = {
                "wait": args.wait,
                "confidence": args.confidence,
                "simultaneous": args.simultaneous,
                "collection_job_id": job_id,
            }
            if chosen:
                assert isinstance(collector, DapCollector)
                r = collector.collect_next(on_job=started, **asked)
            elif isinstance(collector, DapCollector):
                r = collector.collect(start, duration, on_job=started, **asked)
            else:
                r = collector.collect(start, duration, **asked)
            job_id = r.collection_job_id or job_id
        except CollectionError as e:
            print(f"{name}: {e}", file=sys.stderr)
            return 1
    print(
        json.dumps(
            {
                "batch": {
                    "start": r.start,
                    "duration": r.duration,
                    "start_time": format_time(r.start),
                },
                "collection_job_id": None if job_id is None else job_id.hex(),
                # add_remove: the count is protected; the leader sent 0 (not a count).
                "report_count": None if task.dp.counts_protected else r.report_count,
                "estimate": number(r.estimate),
                "confidence_interval": {
                    "level": r.confidence,
                    "kind": r.intervals,
                    "lower": number(r.lower),
                    "upper": number(r.upper),
                },
                "mechanism": r.mechanism,
                "spent": {r.unit: str(r.spent)} if r.unit else None,
                "privacy_against_collector": r.against_collector.to_json(),
                "seconds": round(r.seconds, 3),
            }
            # Over DAP the other aggregator may add no noise: say whose the result carries.
            | ({} if task.dap is None else {"noise_added_by": list(r.noise_added_by)}),
            indent=2,
            default=str,
        )
    )
    return 0


def _interval(args: argparse.Namespace, tp: int, now: int, name: str) -> tuple[int, int] | None:
    """The batch --start and --duration name (None: refused, said on stderr)."""
    from veil.times import TimeFormatError, format_time, parse_time

    duration = args.duration or tp
    if duration <= 0 or duration % tp:
        print(f"{name}: --duration must be a positive multiple of {tp} s", file=sys.stderr)
        return None
    if args.start is None:
        # The last complete interval: collecting the current one would close
        # it while respondents may still upload to it.
        start = now - now % tp - duration
    else:
        try:
            start = parse_time(args.start, epoch_seconds=True)
        except TimeFormatError as e:
            print(f"{name}: --start: {e}", file=sys.stderr)
            return None
        if start % tp:
            print(
                f"{name}: --start {format_time(start)} is not aligned to the task's time"
                f" precision of {tp} s: use {format_time(start - start % tp)}",
                file=sys.stderr,
            )
            return None
    if start + duration > now and not args.include_open and args.job_id is None:
        print(
            f"{name}: the batch [{format_time(start)}, {format_time(start + duration)}) has not"
            " ended: collecting it now stops every later upload to it. Give --include-open to"
            " do it anyway, or collect a batch that has ended",
            file=sys.stderr,
        )
        return None
    return start, duration


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "collect",
        help="collect one batch of one task (surveys: use veil survey collect)",
        description=(
            "Collect one batch of one task. A batch is collected at most once: collecting"
            " closes it at both aggregators, and every later upload to it is refused. The"
            " default batch is therefore the last complete interval. A batch is lost (spent"
            " without a result) only when the aggregators released their shares and this"
            " collector cannot open them (a wrong key, checked before starting) or when the"
            " job id is lost: it is printed first, and --job-id resumes it. A DAP task in"
            " leader-selected mode names no batch: its leader chooses the next one that holds"
            " min_batch_size reports."
        ),
    )
    p.add_argument("--task", required=True, help="the collector's task file")
    p.add_argument(
        "--start",
        help="batch start: RFC 3339 (2026-05-01T09:00:00Z) or epoch seconds, aligned to the"
        " time precision (default: the start of the last complete interval)",
    )
    p.add_argument(
        "--duration", type=int, help="seconds, a multiple of the time precision (default: one)"
    )
    p.add_argument(
        "--include-open",
        action="store_true",
        help="allow a batch that has not ended yet: this stops every later upload to it",
    )
    p.add_argument(
        "--job-id",
        help="resume this collection job (32 hex digits, printed when it started; over DAP the"
        " leader's id of the job, polled with the batch --start and --duration name)",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=300.0,
        help="seconds to wait for the aggregators (default 300)",
    )
    p.add_argument(
        "--confidence", type=float, default=0.95, help="level of the interval (default 0.95)"
    )
    p.add_argument(
        "--simultaneous",
        action="store_true",
        help="intervals that cover every coordinate at once at --confidence (default: each"
        " coordinate on its own)",
    )
    p.add_argument("--leader-ca", help="PEM file of the CA of the leader (only the leader's)")
    add_retired_ca(p)
    p.add_argument("--log-level", default="warning", help="log level (default warning)")
    p.set_defaults(func=cmd_collect)
