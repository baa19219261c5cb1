"""Issue 13, item 1: uploads that try to stall the leader, against a real
leader and helper.

The attack: reports with an honest leader share but a helper ciphertext
padded to 1 MiB, 4 concurrent uploads of 14. Before, the leader stored them
(it accepted any ciphertext up to 1 MiB), grew its database by tens of MB
and put them in one aggregation job larger than max_message_bytes, which
failed on every pass before any other job, across restarts: honest tasks
never collected. Now each part must have its exact size: every such upload
is refused (INVALID_ARGUMENT naming the part), counted, nothing is stored,
and honest tasks aggregate and collect on time, before and after a leader
restart.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.deployment import Deployment, start_deployment
from tests.support.reliability import TP, bucket, record
from veil.client import Client, Report, UploadError
from veil.task import DpSpec, VdafSpec

pytestmark = [pytest.mark.slow, pytest.mark.adversarial]

NONE = DpSpec("none")
ATTACKERS, REPORTS_EACH = 4, 14
# A collection of a few honest reports takes well under a second on a quiet
# machine; the bound only keeps a stalled leader from hanging the test, so it
# is generous (30 s ran out beside a whole loaded suite, at load 12 on 2 cores).
WAIT = 180.0


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tasks: dict[str, tuple[VdafSpec, DpSpec, dict[str, Any]]] = {
        "victim": (VdafSpec("sum", max_measurement=100), NONE, {"min_batch_size": 1}),
        "other": (VdafSpec("histogram", length=4, chunk_length=2), NONE, {"min_batch_size": 1}),
    }
    d = start_deployment(Path(tmp_path_factory.mktemp("hostile")), tasks, metrics=True)
    try:
        yield d
    finally:
        d.stop()


def _padded(client: Client, t: int) -> list[Report]:
    reports = client.build_reports([1] * REPORTS_EACH, t)
    return [
        replace(r, helper_ct=replace(r.helper_ct, payload=r.helper_ct.payload.ljust(1 << 20)))
        for r in reports
    ]


def _refused_wrong_length(dep: Deployment) -> float:
    assert dep.leader.metrics_address is not None
    with urllib.request.urlopen(f"http://{dep.leader.metrics_address}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.findall(
        r'veil_uploads_refused_total{reason="wrong_length",task="[^"]+"} (\S+)', text
    )
    return sum(float(x) for x in found)


def _honest_round(dep: Deployment, hours_ago: int) -> None:
    """Honest reports in both tasks, each collected within WAIT seconds."""
    t = bucket(hours_ago)
    victim, other = dep.client("victim"), dep.client("other")
    assert victim.upload_batch([10, 20, 30], t).accepted == 3
    assert other.upload_batch([0, 1, 1, 3], t).accepted == 4
    with dep.collector("victim") as c:
        r = c.collect(t, TP, wait=WAIT)
    assert (r.report_count, r.estimate) == (3, 60)
    with dep.collector("other") as c:
        r = c.collect(t, TP, wait=WAIT)
    assert (r.report_count, r.estimate) == (4, [1, 2, 0, 1])


def test_padded_helper_ciphertexts_cannot_stall_the_leader(dep: Deployment) -> None:
    attacker = dep.client("victim")
    t = bucket(2)
    batches = [_padded(attacker, t) for _ in range(ATTACKERS)]
    stored = dep.stored_reports("victim")
    db = dep.local.root / "leader.db"
    size_before = db.stat().st_size
    refused_before = _refused_wrong_length(dep)

    def attack(reports: list[Report]) -> UploadError:
        with Client(dep.tasks["victim"].client, retries=0, timeout=60) as c:
            with pytest.raises(UploadError) as e:
                c.upload_reports(reports)
            return e.value

    with ThreadPoolExecutor(ATTACKERS) as pool:
        errors = list(pool.map(attack, batches))
    for e in errors:
        assert e.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "helper_encrypted_input_share.payload is 1048576 bytes" in e.message
    assert dep.stored_reports("victim") == stored
    assert _refused_wrong_length(dep) == refused_before + ATTACKERS
    grown = db.stat().st_size - size_before

    _honest_round(dep, hours_ago=3)
    dep.leader.stop()
    dep.leader.start()
    _honest_round(dep, hours_ago=4)
    assert grown < 1 << 20, grown
    record(
        "hostile.padded_helper_ciphertexts",
        uploads=ATTACKERS,
        reports_each=REPORTS_EACH,
        refused=len(errors),
        stored=0,
        leader_db_growth_bytes=grown,
        honest_collections_before_and_after_restart=4,
    )
