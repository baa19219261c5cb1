"""Sustained upload rate of one `AsyncClient` (issue 20).

A local leader and helper run as separate processes (loopback, SQLite, the
leader aggregating as usual); this process runs one `AsyncClient` on one
event loop, with `concurrency` tasks each uploading Count measurements in
calls of `batch` measurements (`upload` for 1, `upload_batch` above) for
`seconds`. Every report is built (sharded and sealed, in the client's
thread pool) and uploaded inside the measured time, so the rate is what an
application embedding the client sustains. ``scripts/bench_async_client.py``
prints the table.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from veil.aggregator.local import LocalDeployment
from veil.client import AsyncClient
from veil.task import DpSpec, VdafSpec


@dataclass(frozen=True)
class Mode:
    batch: int  # measurements per call
    concurrency: int  # tasks sharing the one client


@dataclass(frozen=True)
class ModeResult:
    mode: Mode
    reports: int
    seconds: float
    per_s: float
    p50_ms: float  # latency of one call
    p99_ms: float
    client_cpu_us: float  # this process's CPU (all threads) per report


DEFAULT_MODES = (Mode(1, 64), Mode(10, 32), Mode(100, 8))


async def _sustain(client: AsyncClient, mode: Mode, seconds: float) -> ModeResult:
    latencies: list[float] = []
    uploaded = 0
    t = client.report_time()
    cpu = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds

    async def worker() -> None:
        nonlocal uploaded
        values = [1] * mode.batch
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            if mode.batch == 1:
                result = await client.upload(1, t)
            else:
                result = await client.upload_batch(values, t)
            latencies.append(time.perf_counter() - began)
            uploaded += result.accepted

    await asyncio.gather(*(worker() for _ in range(mode.concurrency)))
    elapsed = time.perf_counter() - start
    cpu_us = (time.process_time() - cpu) / max(uploaded, 1) * 1e6
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return ModeResult(
        mode, uploaded, elapsed, uploaded / elapsed, cuts[49] * 1e3, cuts[98] * 1e3, cpu_us
    )


def run(
    modes: tuple[Mode, ...] = DEFAULT_MODES, seconds: float = 10.0, workers: int | None = None
) -> list[ModeResult]:
    """Start a local leader and helper, then run each mode for `seconds`."""
    with tempfile.TemporaryDirectory(prefix="veil-bench-client-") as tmp:
        tasks = {"count": (VdafSpec("count"), DpSpec("none"), {"min_batch_size": 1})}
        with LocalDeployment.start(Path(tmp), tasks) as dep:

            async def main() -> list[ModeResult]:
                async with AsyncClient(dep.tasks["count"].client, workers=workers) as client:
                    await client.upload(1)  # fetch the HPKE configs, warm the kernels
                    return [await _sustain(client, m, seconds) for m in modes]

            return asyncio.run(main())
