"""The outbox under `kill -9`: `veil upload --outbox` killed after sealing and
before the leader's acknowledgement (once with its request in flight to a
frozen leader, once retrying during a leader outage), then `veil outbox
flush` after the leader is back: every report is counted exactly once, as a
collection with mechanism "none" shows. Real leader, helper and client
processes."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.deployment import start_deployment
from tests.support.outbox import flush, kill_while_frozen, pending
from tests.support.outbox import veil_command as veil
from tests.support.wait import kill_once
from veil.task import DpSpec, VdafSpec

pytestmark = [pytest.mark.slow, pytest.mark.fault]

TP = 3600


def test_killed_client_delivers_every_report_exactly_once(tmp_path: Path) -> None:
    dep = start_deployment(
        tmp_path / "servers", {"count": (VdafSpec("count"), DpSpec("none"), {"min_batch_size": 1})}
    )
    try:
        task = dep.local.root / "count.client.toml"
        box = tmp_path / "client.outbox"
        now = int(time.time())
        t = str(now - now % TP - TP)
        upload = ["upload", "--task", str(task), "--outbox", str(box), "--time", t]

        # Delivered at once; the outbox now also remembers both HPKE configs.
        done = subprocess.run(veil(*upload, *["1"] * 5), capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert pending(box) == 0

        # 1. Sealed, stored, sent, never acknowledged: the leader is frozen,
        # so the request waits for an answer when the client is killed.
        assert dep.leader.pid is not None
        kill_while_frozen(dep.leader.pid, veil(*upload, *["1"] * 7), box, 7)

        # 2. The leader is down: the client seals with the configs the outbox
        # remembered, stores, and is killed while it retries.
        dep.leader.stop(signal.SIGKILL)
        kill_once(veil(*upload, *["1"] * 4), lambda: pending(box) == 11, "11 reports stored")

        # 3. Still down: an upload that gives up leaves its reports pending, says so.
        gave_up = subprocess.run(
            veil(*upload, "--retries", "1", *["1"] * 3), capture_output=True, text=True
        )
        assert gave_up.returncode == 1
        assert "14 pending in the outbox" in gave_up.stdout
        assert "flush later" in gave_up.stderr

        status = subprocess.run(
            veil("outbox", "status", "--outbox", str(box), "--json"),
            capture_output=True,
            text=True,
            check=True,
        )
        (row,) = json.loads(status.stdout)
        assert (row["pending"], row["delivered"], row["oldest"]) == (14, 5, int(t))

        # The leader is back: one flush delivers everything, once.
        dep.leader.start()
        final = flush(box, task)
        assert (final.delivered, final.refused, final.expired) == (19, 0, 0)

        with dep.collector("count") as collector:
            result = collector.collect(int(t), TP, wait=120)
        assert result.report_count == 19
        assert result.estimate == 19
    finally:
        dep.stop()
