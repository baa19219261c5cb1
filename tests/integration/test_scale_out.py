"""Scale-out: several `veil helper` processes (and leader front ends) on one
PostgreSQL serve one address (SO_REUSEPORT), also while workers and helpers
are killed; on SQLite a second process is refused, saying why."""

from __future__ import annotations

import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.postgres import as_url, with_schema
from tests.support.deployment import Deployment
from tests.support.modes import LONG
from tests.support.wait import wait_until
from veil.local.launcher import LocalDeployment
from veil.task import DpSpec, VdafSpec

TP = 3600
TASKS: dict[str, tuple[VdafSpec, DpSpec, dict[str, Any]]] = {
    "sum": (VdafSpec("sum", max_measurement=100), DpSpec("none"), {"min_batch_size": 1}),
}


def test_a_second_process_on_one_sqlite_database_is_refused(tmp_path: Path) -> None:
    with LocalDeployment.start(tmp_path, TASKS) as local:
        second = subprocess.run(
            [sys.executable, "-m", "veil.cli", "helper", "--config", str(local.helper.config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 2, second.stderr
        message = second.stderr.strip().splitlines()[-1]
        assert message.startswith("veil helper: the SQLite database ")
        assert "in use by another veil process" in message and "PostgreSQL" in message
        # The first one still serves.
        assert local.helper.proc is not None and local.helper.proc.poll() is None


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.postgres
def test_scale_out_under_faults(tmp_path: Path, postgres_server: str) -> None:
    """2 upload front ends and 3 helpers each on one port, 2 workers; three
    tasks uploaded concurrently while workers and helpers are SIGKILLed and
    restarted: every batch is exact (nothing lost, nothing counted twice) and
    the noisy task's collection is charged once in each ledger."""
    # 20,001 reports in all, as the scale-out issue asks; the long mode kills more.
    per_task, kills = 6667, 30 if LONG else 10
    suffix = secrets.token_hex(4)
    leader_db = with_schema(postgres_server, f"leader_{suffix}")
    helper_db = with_schema(postgres_server, f"helper_{suffix}")
    tasks: dict[str, tuple[VdafSpec, DpSpec, dict[str, Any]]] = {
        "count": (VdafSpec("count"), DpSpec("none"), {"min_batch_size": 1}),
        "sum": (VdafSpec("sum", max_measurement=100), DpSpec("none"), {"min_batch_size": 1}),
        "noisy": (VdafSpec("count"), DpSpec("geometric", epsilon="1"), {"min_batch_size": 1}),
    }
    values = {
        "count": [i % 2 for i in range(per_task)],
        "sum": [(i * 37) % 101 for i in range(per_task)],
        "noisy": [i % 2 for i in range(per_task)],
    }
    local = LocalDeployment.start(
        tmp_path,
        tasks,
        job_size=50,
        storage={"leader": as_url(leader_db), "helper": as_url(helper_db)},
        workers=2,
        lease_seconds=2.0,
        helpers=3,
        front_ends=2,
    )
    d = Deployment(local)
    try:
        now = int(time.time())
        t = now - now % TP - TP
        errors: list[BaseException] = []

        def upload(name: str) -> None:
            try:
                client = d.client(name)
                vs = values[name]
                for at in range(0, len(vs), 100):
                    chunk = vs[at : at + 100]
                    assert client.upload_batch(chunk, report_time=t).accepted == len(chunk)
            except BaseException as e:
                errors.append(e)

        uploads = [threading.Thread(target=upload, args=(name,)) for name in tasks]
        for u in uploads:
            u.start()
        # The chaos loop: a random worker or helper killed and started again,
        # while uploads and aggregation go on.
        rng = random.Random(secrets.randbits(64))
        victims = [*local.workers, *local.helpers]
        for _ in range(kills):
            time.sleep(rng.uniform(0.2, 1.0))
            victim = rng.choice(victims)
            victim.stop(signal.SIGKILL)
            if victim.role == "worker":
                victim.start_worker()
            else:
                victim.start(timeout=60)
        for u in uploads:
            u.join(timeout=600)
        assert not errors, errors
        # Each report verified by the helpers once: a replay record each,
        # counted before the collections, after which the helpers' GC takes
        # a collected batch's records (a pass came between the collections
        # and this count at load 8: 13,334 of 20,001 left).
        with psycopg.connect(helper_db, autocommit=True) as conn:

            def recorded() -> tuple[int, int]:
                sql = "SELECT count(*), count(DISTINCT report_id) FROM helper_reports"
                row = conn.execute(sql).fetchone()
                assert row is not None
                return int(row[0]), int(row[1])

            wait_until(
                lambda: recorded()[0] >= 3 * per_task,
                "the helpers to verify every report",
                timeout=600,
            )
            assert recorded() == (3 * per_task, 3 * per_task)
        with d.collector("count") as c:
            r = c.collect(t, TP, wait=300)
        assert (r.report_count, r.estimate) == (per_task, sum(values["count"]))
        with d.collector("sum") as c:
            r = c.collect(t, TP, wait=300)
        assert (r.report_count, r.estimate) == (per_task, sum(values["sum"]))
        with d.collector("noisy") as c:
            c.collect(t, TP, wait=300)
        for db in (leader_db, helper_db):
            with psycopg.connect(db) as conn:
                spends = conn.execute("SELECT count(*) FROM dp_spends").fetchone()
                assert spends == (1,), db
    finally:
        d.stop()
