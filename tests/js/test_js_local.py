"""The JavaScript client's local randomized response (js/src/local.js) on real
servers: the browser randomizes before sharding, the aggregators accept the
randomized reports, and the collector's de-biased intervals cover the truth."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.deployment import start_deployment
from tests.support.node import js_reports, require_node_client
from veil.client import Report
from veil.hpke import ROLE_HELPER, ROLE_LEADER
from veil.task import DpSpec, VdafSpec

pytestmark = pytest.mark.slow

TP = 3600
N = 200
LOCAL = DpSpec("none", local_epsilon="1")
CASES: dict[str, tuple[VdafSpec, DpSpec, Any, list[int]]] = {
    "count": (VdafSpec("count"), LOCAL, 1, [N]),
    "histogram": (VdafSpec("histogram", length=3, chunk_length=2), LOCAL, 2, [0, 0, N]),
    "multihot": (
        VdafSpec("multihot", length=3, max_weight=3, chunk_length=2),
        DpSpec("none", local_epsilon="2", local_max_choices=1),
        [False, True, False],
        [0, N, 0],
    ),
}


def test_js_local_layer_through_real_servers(tmp_path: Path) -> None:
    require_node_client()
    tasks = {
        name: (spec, dp, {"time_precision": TP, "min_batch_size": 1})
        for name, (spec, dp, _, _) in CASES.items()
    }
    dep = start_deployment(tmp_path, tasks)
    try:
        now = int(time.time())
        t = now - now % TP - 2 * TP
        for name, (_, _, answer, truth) in CASES.items():
            client = dep.client(name)
            built = js_reports(
                client.task,
                client.hpke_config(ROLE_LEADER),
                client.hpke_config(ROLE_HELPER),
                [answer] * N,
                t,
            )
            reports = [r for r in built if isinstance(r, Report)]
            assert len(reports) == N, built[:3]
            assert client.upload_reports(reports).accepted == N
            with dep.collector(name) as collector:
                r = collector.collect(t, TP, wait=60, confidence=1 - 1e-6)
            raw = r.noisy_aggregate
            # Every respondent gave the same answer; the servers saw it randomized.
            assert raw != truth and sum(raw) > 0
            lows = r.lower if isinstance(r.lower, list) else [r.lower]
            highs = r.upper if isinstance(r.upper, list) else [r.upper]
            for true, low, high in zip(truth, lows, highs, strict=True):
                assert low <= true <= high, (name, raw, lows, highs)
            assert dep.rejections("helper", name) == {}
    finally:
        dep.stop()
