"""The JavaScript client (js/) against real veil servers.

Reports built by the JS client are uploaded to a real leader, opened,
verified and aggregated by the leader and helper, and collected: the sums
are exact. Malformed measurements are refused by the JS client with the
Python client's messages.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.deployment import Deployment, start_deployment
from tests.support.node import js_reports, require_node_client
from tests.support.times import past_bucket
from veil.client import Report
from veil.hpke import ROLE_HELPER, ROLE_LEADER
from veil.task import DpSpec, VdafSpec

pytestmark = pytest.mark.slow

TP = 3600

CASES: dict[str, tuple[VdafSpec, list[Any], Any]] = {
    "count": (VdafSpec("count"), [1, 0, 1, 1, 0, 1], 4),
    "sum": (VdafSpec("sum", max_measurement=100), [5, 10, 99, 0], 114),
    "sumvec": (
        VdafSpec("sumvec", length=3, max_measurement=7, chunk_length=2),
        [[1, 2, 3], [7, 0, 7]],
        [8, 2, 10],
    ),
    "histogram": (
        VdafSpec("histogram", length=5, chunk_length=2),
        [0, 4, 4, 2],
        [1, 0, 1, 0, 2],
    ),
    "multihot": (
        VdafSpec("multihot", length=4, max_weight=2, chunk_length=2),
        [[True, False, True, False], [False, False, False, True], [False] * 4],
        [1, 0, 1, 1],
    ),
    "l1boundsum": (
        VdafSpec("l1boundsum", length=3, max_value=10, chunk_length=2),
        [[1, 2, 7], [10, 0, 0], [0, 0, 0]],
        [11, 2, 7],
    ),
}

# Measurements each type must refuse (JSON values, as a page would send them).
MALFORMED: dict[str, list[Any]] = {
    "count": [2, -1, "1", True, 0.5, None, [1]],
    "sum": [101, -1, "5", 2.5, False],
    "sumvec": [[1, 2], [1, 2, 8], [1, 2, -1], "abc", 3, [1, 2, "3"]],
    "histogram": [5, -1, "0", 1.5, True, [0]],
    "multihot": [[True, True, True, False], [True, False], [2, 0, 0, 0], ["x", 0, 0, 0], 1],
    "l1boundsum": [[5, 5, 1], [11, 0, 0], [0, -1, 0], [1, True, 0], [1, 2], "abc", [1, 2, "3"]],
}


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    require_node_client()
    tasks = {
        name: (spec, DpSpec("none"), {"time_precision": TP, "min_batch_size": 1})
        for name, (spec, _, _) in CASES.items()
    }
    d = start_deployment(Path(tmp_path_factory.mktemp("js")), tasks)
    try:
        yield d
    finally:
        d.stop()


@pytest.mark.parametrize("name", list(CASES))
def test_js_reports_aggregate_to_exact_sums(dep: Deployment, name: str) -> None:
    _, measurements, expected = CASES[name]
    client = dep.client(name)
    t = past_bucket(2)
    built = js_reports(
        client.task,
        client.hpke_config(ROLE_LEADER),
        client.hpke_config(ROLE_HELPER),
        measurements,
        t + 17,  # the JS client rounds down to the time precision, as Python's does
    )
    reports = [r for r in built if isinstance(r, Report)]
    assert len(reports) == len(measurements)
    assert all(r.time == t and len(r.report_id) == 16 for r in reports)
    result = client.upload_reports(reports)
    assert (result.accepted, result.duplicates) == (len(measurements), 0)
    with dep.collector(name) as collector:
        r = collector.collect(t, TP, wait=60)
    assert r.report_count == len(measurements)
    assert r.estimate == expected
    assert dep.rejections("leader", name) == {}
    assert dep.rejections("helper", name) == {}


@pytest.mark.parametrize("name", list(CASES))
def test_js_refuses_malformed_measurements_like_python(dep: Deployment, name: str) -> None:
    client = dep.client(name)
    bad = MALFORMED[name]
    refused = js_reports(
        client.task,
        client.hpke_config(ROLE_LEADER),
        client.hpke_config(ROLE_HELPER),
        bad,
        past_bucket(3),
    )
    for measurement, message in zip(bad, refused, strict=True):
        with pytest.raises(ValueError) as e:
            client.vdaf.flp.encode(measurement)
        assert message == str(e.value), measurement
