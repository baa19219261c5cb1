"""The DAP client's outbox under `kill -9`: `veil upload --outbox` on a DAP
task killed after sealing and before the leader's acknowledgement, its
request sent to a frozen leader (or about to be), then `veil outbox flush`
once the leader runs again: every report is counted exactly once, as a
collection with mechanism "none" shows. A real `veil leader` and `veil
helper` serving DAP on loopback (SQLite), and real client processes."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.outbox import flush, kill_while_frozen, pending
from tests.support.outbox import veil_command as veil
from veil.client.dap import DapReports
from veil.collector import DapCollector
from veil.local.launcher import ServerProcess, free_port
from veil.task import DapSpec, DpSpec, VdafSpec, new_task, write_toml

pytestmark = [pytest.mark.slow, pytest.mark.fault]

TP = 3600


CODEC = DapReports(TP)


def test_killed_dap_client_delivers_every_report_exactly_once(tmp_path: Path) -> None:
    leader_dap, helper_dap = (f"127.0.0.1:{free_port()}" for _ in range(2))
    leader_grpc, helper_grpc = (f"127.0.0.1:{free_port()}" for _ in range(2))
    spec = DapSpec(f"http://{leader_dap}/", f"http://{helper_dap}/", "dap-19", "veil")
    files = new_task(
        VdafSpec("count"), leader_grpc, helper_grpc, min_batch_size=1, dp=DpSpec("none"), dap=spec
    )
    servers: dict[str, ServerProcess] = {}
    for role, listen, dap in (
        ("helper", helper_grpc, helper_dap),
        ("leader", leader_grpc, leader_dap),
    ):
        write_toml(tmp_path / f"{role}.task.toml", getattr(files, role).to_dict(), secret=True)
        config: dict[str, Any] = {
            "listen": listen,
            "storage": f"{role}.db",
            "tasks": [f"{role}.task.toml"],
            "allow_exact_release": True,
            "dap": {"listen": dap},
        }
        if role == "leader":
            config["driver"] = {"interval": 0.2}
        write_toml(tmp_path / f"{role}.toml", config, secret=False)
        servers[role] = ServerProcess(
            role, tmp_path / f"{role}.toml", tmp_path / f"{role}.log", listen
        )
        servers[role].start()
    leader = servers["leader"]
    try:
        task = tmp_path / "client.toml"
        write_toml(task, files.client.to_dict(), secret=True)
        box = tmp_path / "client.outbox"
        now = int(time.time())
        t = str(now - now % TP - TP)
        upload = ["upload", "--task", str(task), "--outbox", str(box), "--time", t]

        # Delivered at once; the outbox now also remembers both HPKE configs.
        done = subprocess.run(veil(*upload, *["1"] * 3), capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert pending(box, CODEC) == 0

        # Sealed, stored, sent, never acknowledged: the leader is frozen,
        # so the request waits for an answer when the client is killed.
        assert leader.pid is not None
        kill_while_frozen(leader.pid, veil(*upload, *["1"] * 4), box, 4, CODEC)

        # One flush delivers everything, once.
        final = flush(box, task, CODEC)
        assert (final.delivered, final.refused, final.expired) == (7, 0, 0)

        result = DapCollector(files.collector).collect(int(t), TP, wait=120)
        assert (result.report_count, result.estimate) == (7, 7)
    finally:
        for server in (servers["leader"], servers["helper"]):
            server.stop()
