"""One client process of the overload test (started by test_overload.py).

Seals its Count reports in advance (the batched path, as a real client
does), says so by writing `--ready`, waits for the `--go` file, then uploads
batch after batch with the stock `Client` for `--seconds`, as fast as the
leader takes them: the client's own retry policy backs off when the leader
refuses, honouring the leader's advice; a batch still refused after the
client's retries (retryable) is sent again, the same report ids, once the
advised wait has passed, as an outbox flush would. If the sealed reports run
out, more are sealed on the way (and counted). Then writes what happened as
JSON: reports acknowledged and their ones, batches refused after the
client's retries (with their kind and advice), and failures of any other
kind (the test asserts none). Only loopback addresses come from the task
file the test wrote.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from pathlib import Path

from veil.client import Client, UploadError
from veil.messages import Report
from veil.task import load_task


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--task", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ready", type=Path, required=True)
    p.add_argument("--go", type=Path, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--reports", type=int, required=True, help="reports sealed in advance")
    p.add_argument("--report-time", type=int, required=True)
    p.add_argument("--batch", type=int, default=500)
    a = p.parse_args()
    with Client(load_task(a.task), timeout=60) as client:

        def seal(n: int) -> list[tuple[list[int], list[Report]]]:
            out = []
            for _ in range(0, n, a.batch):
                values = [secrets.randbelow(2) for _ in range(a.batch)]
                out.append((values, client.build_reports(values, a.report_time)))
            return out

        stock = seal(a.reports)
        sealed_in_advance = sum(len(r) for _, r in stock)
        a.ready.write_text("ready")
        while not a.go.exists():
            time.sleep(0.05)
        acknowledged = ones = requests = sealed_later = 0
        refused: list[dict[str, object]] = []
        failures: list[str] = []
        began = time.monotonic()
        while time.monotonic() - began < a.seconds:
            if not stock:
                stock = seal(a.batch)
                sealed_later += a.batch
            values, reports = stock[0]
            requests += 1
            try:
                result = client.upload_reports(reports)
            except UploadError as e:
                if not e.retryable:
                    failures.append(repr(e)[:300])
                    break
                refused.append(
                    {
                        "at": round(time.monotonic() - began, 2),
                        "code": e.code.name,
                        "kind": e.kind,
                        "retry_after": e.retry_after,
                    }
                )
                # Sent again, unchanged, once the advised wait is over.
                time.sleep(e.retry_after or 1.0)
                continue
            except Exception as e:  # every other failure counts; the test asserts none
                failures.append(repr(e)[:300])
                break
            # All or nothing: a batch an earlier attempt stored unbeknown to
            # this client comes back as duplicates, and is acknowledged too.
            if result.accepted + result.duplicates != len(reports):
                failures.append(
                    f"acknowledged {result.accepted + result.duplicates} of {len(reports)}"
                )
                break
            acknowledged += len(reports)
            ones += sum(values)
            stock.pop(0)
        elapsed = time.monotonic() - began
    a.out.write_text(
        json.dumps(
            {
                "acknowledged": acknowledged,
                "ones": ones,
                "requests": requests,
                "sealed_in_advance": sealed_in_advance,
                "sealed_later": sealed_later,
                "refused_after_retries": refused,
                "failures": failures,
                "seconds": round(elapsed, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
