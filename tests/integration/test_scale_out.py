"""Helper scale-out: several `veil helper` processes on one PostgreSQL serve one
address (SO_REUSEPORT); on SQLite a second process is refused, saying why."""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.deployment import Deployment
from tests.support.postgres import as_url, with_schema
from veil.aggregator.local import LocalDeployment
from veil.task import DpSpec, VdafSpec

TP = 3600
TASKS: dict[str, tuple[VdafSpec, DpSpec, dict[str, Any]]] = {
    "sum": (VdafSpec("sum", max_measurement=100), DpSpec("none"), {"min_batch_size": 1}),
}


@pytest.mark.slow
@pytest.mark.postgres
def test_three_helpers_on_one_port(tmp_path: Path, postgres_server: str) -> None:
    suffix = secrets.token_hex(4)
    helper_db = with_schema(postgres_server, f"helper_{suffix}")
    local = LocalDeployment.start(
        tmp_path,
        TASKS,
        job_size=20,
        storage={
            "leader": as_url(with_schema(postgres_server, f"leader_{suffix}")),
            "helper": as_url(helper_db),
        },
        workers=2,
        lease_seconds=2.0,
        helpers=3,
    )
    d = Deployment(local)
    try:
        assert len({h.pid for h in local.helpers}) == 3
        assert all(h.proc is not None and h.proc.poll() is None for h in local.helpers)
        now = int(time.time())
        first, second = now - now % TP - 2 * TP, now - now % TP - TP
        values = [(i * 37) % 101 for i in range(200)]
        assert d.client("sum").upload_batch(values, report_time=first).accepted == len(values)
        with d.collector("sum") as c:
            r = c.collect(first, TP, wait=120)
        assert (r.report_count, r.estimate) == (len(values), sum(values))
        # Any one of them may die: the others keep serving the address.
        local.helpers[0].stop(signal.SIGKILL)
        assert d.client("sum").upload_batch(values, report_time=second).accepted == len(values)
        with d.collector("sum") as c:
            r = c.collect(second, TP, wait=120)
        assert (r.report_count, r.estimate) == (len(values), sum(values))
        with psycopg.connect(helper_db) as conn:
            row = conn.execute("SELECT count(*), count(DISTINCT report_id) FROM helper_reports")
            assert row.fetchone() == (2 * len(values), 2 * len(values))
    finally:
        d.stop()


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
