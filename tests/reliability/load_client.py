"""One load-generating client process (started by test_load.py).

Builds Count reports (shard and HPKE seal, as a real client does) and uploads
them in batches at a fixed pace for a bounded time and a bounded number of
reports, then writes what happened as JSON: reports acknowledged, ones sent,
failed requests (any exception, after the client's own retries) and the
slowest request. Only loopback addresses come from the task file the test
wrote.

Each batch is sharded in one call (`Client.build_reports`, the batched path):
built one by one, a report cost about three times as much client CPU, and the
four clients took two thirds of the 2-core machine away from the servers.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from pathlib import Path

from veil.client import Client
from veil.task import load_task


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--task", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--rate", type=float, required=True, help="reports per second")
    p.add_argument("--max-reports", type=int, required=True)
    p.add_argument("--report-time", type=int, required=True)
    p.add_argument("--batch", type=int, default=100)
    a = p.parse_args()
    acknowledged = ones = failures = requests = sent = 0
    slowest = 0.0
    errors: list[str] = []
    with Client(load_task(a.task), timeout=60) as client:
        began = time.monotonic()
        due = began
        while time.monotonic() - began < a.seconds and sent < a.max_reports:
            values = [secrets.randbelow(2) for _ in range(a.batch)]
            reports = client.build_reports(values, a.report_time)
            sent += len(reports)
            due += a.batch / a.rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            t0 = time.monotonic()
            requests += 1
            try:
                result = client.upload_reports(reports)
            except Exception as e:  # every failure counts; the test asserts none
                failures += 1
                errors.append(repr(e)[:300])
                continue
            slowest = max(slowest, time.monotonic() - t0)
            if result.accepted == len(reports):
                acknowledged += result.accepted
                ones += sum(values)
            else:
                failures += 1
                errors.append(f"accepted {result.accepted} of {len(reports)}")
        elapsed = time.monotonic() - began
    a.out.write_text(
        json.dumps(
            {
                "acknowledged": acknowledged,
                "ones": ones,
                "sent": sent,
                "requests": requests,
                "failures": failures,
                "errors": errors[:5],
                "seconds": elapsed,
                "slowest_request_seconds": slowest,
            }
        )
    )


if __name__ == "__main__":
    main()
