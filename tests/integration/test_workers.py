"""Scaled-out leader on PostgreSQL: an upload front end and two `veil worker` processes.

One worker is killed with SIGKILL while it holds an aggregation job; the other
takes the job over once its lease expires, and the collected sum is exact.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.postgres import as_url, with_schema
from tests.support.deployment import Deployment
from veil.local.launcher import LocalDeployment
from veil.task import DpSpec, VdafSpec

pytestmark = [pytest.mark.slow, pytest.mark.fault, pytest.mark.postgres]

TP = 3600
LEASE = 2.0


@pytest.fixture
def dep(tmp_path: Path, postgres_server: str) -> Iterator[tuple[Deployment, str]]:
    suffix = secrets.token_hex(4)
    leader_db = with_schema(postgres_server, f"leader_{suffix}")
    helper_db = with_schema(postgres_server, f"helper_{suffix}")
    tasks: dict[str, tuple[VdafSpec, DpSpec, dict[str, Any]]] = {
        "sum": (VdafSpec("sum", max_measurement=100), DpSpec("none"), {"min_batch_size": 1}),
    }
    local = LocalDeployment.start(
        tmp_path,
        tasks,
        job_size=10,
        storage={"leader": as_url(leader_db), "helper": as_url(helper_db)},
        workers=2,
        lease_seconds=LEASE,
        metrics=True,
    )
    d = Deployment(local)
    try:
        yield d, leader_db
    finally:
        d.stop()


def _held_by(db: str, pid: int) -> list[bytes]:
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT job_id FROM aggregation_jobs WHERE state = 'open' AND lease_owner LIKE %s",
            (f"%:{pid}:%",),
        ).fetchall()
    return [bytes(r[0]) for r in rows]


def test_killed_worker_jobs_are_taken_over(dep: tuple[Deployment, str]) -> None:
    d, leader_db = dep
    now = int(time.time())
    t = now - now % TP - TP
    values = [(i * 37) % 101 for i in range(300)]
    pids = [w.pid or 0 for w in d.local.workers]
    assert all(pids)
    assert d.client("sum").upload_batch(values, report_time=t).accepted == len(values)
    # Kill whichever worker is first seen holding an unfinished job (either
    # may take them all before the other polls).
    deadline = time.monotonic() + 60
    held: list[bytes] = []
    while not held:
        assert time.monotonic() < deadline, "no worker was seen holding a job"
        for k, pid in enumerate(pids):
            if _held_by(leader_db, pid):
                # Frozen first, then asked again: a job it finished between the
                # look and the kill would not be one the survivor took over.
                os.kill(pid, signal.SIGSTOP)
                held = _held_by(leader_db, pid)
                victim, survivor_worker = d.local.workers[k], d.local.workers[1 - k]
                if held:
                    break
                os.kill(pid, signal.SIGCONT)
        else:
            time.sleep(0.005)
    victim.stop(signal.SIGKILL)
    with d.collector("sum") as c:
        r = c.collect(t, TP, wait=120)
    assert (r.report_count, r.estimate) == (len(values), sum(values))
    with psycopg.connect(leader_db) as conn:
        states = dict(
            conn.execute("SELECT state, count(*) FROM aggregation_jobs GROUP BY state").fetchall()
        )
        taken_over = conn.execute(
            "SELECT attempts, lease_owner FROM aggregation_jobs WHERE job_id = ANY(%s)",
            (held,),
        ).fetchall()
    assert set(states) == {"finished"}
    # The job the dead worker held was finished by the survivor, on a later attempt.
    assert all(attempts >= 2 for attempts, _ in taken_over)
    # The survivor's own metrics endpoint counts the jobs it finished.
    survivor = survivor_worker.metrics_address
    with urllib.request.urlopen(f"http://{survivor}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    finished = re.search(r'^veil_aggregation_jobs_total\{outcome="finished"\} (\S+)$', text, re.M)
    assert finished is not None and float(finished.group(1)) >= 1
    # SIGTERM stops a worker cleanly between two steps.
    assert survivor_worker.stop(signal.SIGTERM) == 0


def test_a_worker_loads_the_field_kernels_at_start(dep: tuple[Deployment, str]) -> None:
    """The compiled kernels are loaded when a worker starts, not in its first
    job (where they cost that job's reports about half a second of CPU): a
    fresh process has them once the worker is built, before any job."""
    d, _ = dep
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from veil.aggregator.run.config import load_config\n"
        "from veil.aggregator.run.worker import AggregationWorker\n"
        "w = AggregationWorker(load_config(Path(sys.argv[1])))\n"
        "kinds = ('field128', 'field64', 'xof')\n"
        "print(all(f'veil.vdaf.batch._{k}_kernels' in sys.modules for k in kinds))\n"
        "w.close()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(d.local.workers[0].config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "True"
