"""Upload -> aggregate -> collect through a real leader and helper (separate processes)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.deployment import Deployment, start_deployment
from tests.support.reports import encoded_report, forged_report
from tests.support.times import past_bucket
from veil.client import UploadError
from veil.collector import CollectionError
from veil.task import DpSpec, VdafSpec
from veil.vdaf.spec.circuits import encode_range_checked_int

pytestmark = pytest.mark.slow

TP = 3600
NONE = DpSpec("none")

CASES: dict[str, tuple[VdafSpec, list[Any], Any]] = {
    "count": (VdafSpec("count"), [1, 0, 1, 1, 0, 1], 4),
    "sum": (VdafSpec("sum", max_measurement=100), [5, 10, 99, 0], 114),
    "sumvec": (
        VdafSpec("sumvec", length=3, max_measurement=7, chunk_length=2),
        [[1, 2, 3], [7, 0, 7]],
        [8, 2, 10],
    ),
    "histogram": (VdafSpec("histogram", length=5, chunk_length=2), [0, 4, 4, 2], [1, 0, 1, 0, 2]),
    "multihot": (
        VdafSpec("multihot", length=4, max_weight=2, chunk_length=2),
        [[True, False, True, False], [False, False, False, True], [False] * 4],
        [1, 0, 1, 1],
    ),
    "l1boundsum": (
        VdafSpec("l1boundsum", length=3, max_value=10, chunk_length=2),
        [[1, 2, 7], [10, 0, 0], [0, 0, 0], [0, 3, 3]],
        [11, 5, 10],
    ),
}


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tasks: dict[str, tuple[VdafSpec, DpSpec, dict[str, Any]]] = {
        name: (spec, NONE, {"time_precision": TP, "min_batch_size": 1})
        for name, (spec, _, _) in CASES.items()
    }
    tasks["noisy"] = (
        VdafSpec("count"),
        DpSpec("geometric", epsilon="1"),
        {"time_precision": 60, "min_batch_size": 1},
    )
    tasks["small"] = (VdafSpec("sum", max_measurement=10), NONE, {"min_batch_size": 5})
    tasks["plain"] = (VdafSpec("sum", max_measurement=10), NONE, {"min_batch_size": 1})
    survey = DpSpec("geometric", epsilon="1", survey="s1", survey_budget="3/2")
    tasks["survey_a"] = (VdafSpec("count"), survey, {"min_batch_size": 1})
    tasks["survey_b"] = (VdafSpec("count"), survey, {"min_batch_size": 1})
    d = start_deployment(Path(tmp_path_factory.mktemp("e2e")), tasks, metrics=True)
    try:
        yield d
    finally:
        d.stop()


@pytest.mark.parametrize("name", list(CASES))
def test_every_type_exact_sum(dep: Deployment, name: str) -> None:
    _, measurements, expected = CASES[name]
    t = past_bucket(2)
    result = dep.client(name).upload_batch(measurements, report_time=t)
    assert (result.accepted, result.duplicates) == (len(measurements), 0)
    with dep.collector(name) as collector:
        r = collector.collect(t, TP, wait=60)
    assert r.report_count == len(measurements)
    assert r.estimate == expected
    assert r.lower == expected and r.upper == expected
    assert r.epsilon_spent == 0 and r.mechanism == "none"


def test_noise_within_interval_at_expected_rate(dep: Deployment) -> None:
    # 20 disjoint one-minute batches of a count with ε = 1 (parallel composition:
    # the budget of 1 covers them all). A 90% interval should miss about twice.
    trials = 20
    client = dep.client("noisy")
    base = past_bucket(1, tp=60) - trials * 60
    truths, counts = [], []
    for i in range(trials):
        values = [1] * (i % 4 + 1) + [0] * 2
        truths.append(sum(values))
        counts.append(len(values))
        client.upload_batch(values, report_time=base + i * 60)
    misses = 0
    widths = set()
    with dep.collector("noisy") as collector:
        for i in range(trials):
            r = collector.collect(base + i * 60, 60, wait=60, confidence=0.9)
            assert r.report_count == counts[i]
            assert r.epsilon_spent == 1 and r.mechanism == "geometric"
            misses += not r.lower <= truths[i] <= r.upper
            widths.add(r.upper - r.lower)
    # P(Binomial(20, 0.1) > 10) < 1e-6 (the exact miss rate here is 0.073, lower
    # still): a failure means the intervals are wrong, not bad luck.
    assert misses <= 10
    assert len(widths) == 1  # the width depends on public parameters only


def test_tampered_reports_rejected_and_not_counted(dep: Deployment) -> None:
    client = dep.client("plain")
    t = past_bucket(3)
    good = [client.build_report(v, t) for v in (1, 2, 3)]
    # A corrupted leader ciphertext: fails HPKE at the leader.
    bad_ct = client.build_report(4, t)
    bad_ct = replace(
        bad_ct,
        leader_ct=replace(
            bad_ct.leader_ct,
            payload=bytes([bad_ct.leader_ct.payload[0] ^ 1]) + bad_ct.leader_ct.payload[1:],
        ),
    )
    # A client that alters its own input share after proving: fails the proof.
    bad_proof = forged_report(client, 5, t)
    assert client.upload_reports([*good, bad_ct, bad_proof]).accepted == 5
    with dep.collector("plain") as collector:
        r = collector.collect(t, TP, wait=60)
    assert (r.report_count, r.estimate) == (3, 6)
    assert dep.rejections("leader", "plain") == {"hpke_decrypt_error": 1, "vdaf_verify_error": 1}
    assert dep.rejections("helper", "plain") == {"vdaf_verify_error": 1}
    # The same counts, by reason, on each server's metrics endpoint (loopback).
    import urllib.request

    label = dep.tasks["plain"].client.id_text
    for server, reasons in (
        (dep.leader, ("hpke_decrypt_error", "vdaf_verify_error")),
        (dep.helper, ("vdaf_verify_error",)),
    ):
        assert server.metrics_address is not None
        with urllib.request.urlopen(f"http://{server.metrics_address}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for reason in reasons:
            assert f'veil_reports_rejected_total{{reason="{reason}",task="{label}"}} 1.0' in text


def test_l1_bound_sum_over_the_bound_refused_by_both(dep: Deployment) -> None:
    """A client that proves entries of 10, 10 and 0 with a claimed sum of 10
    (every value's bits in range, the sum a lie) is refused by both
    aggregators' verification and not counted; an honest report beside it is."""
    client = dep.client("l1boundsum")
    field = client.vdaf.field
    bits = [b for v in (10, 10, 0, 10) for b in encode_range_checked_int(field, v, 10)]
    t = past_bucket(7)
    lie = encoded_report(client, bits, t)
    assert client.upload_reports([client.build_report([2, 0, 8], t), lie]).accepted == 2
    with dep.collector("l1boundsum") as collector:
        r = collector.collect(t, TP, wait=60)
    assert (r.report_count, r.estimate) == (1, [2, 0, 8])
    assert dep.rejections("leader", "l1boundsum") == {"vdaf_verify_error": 1}
    assert dep.rejections("helper", "l1boundsum") == {"vdaf_verify_error": 1}


def test_replayed_report_counts_once(dep: Deployment) -> None:
    client = dep.client("plain")
    t = past_bucket(4)
    reports = [client.build_report(v, t) for v in (7, 8)]
    assert client.upload_reports(reports).accepted == 2
    again = client.upload_reports(reports)
    assert (again.accepted, again.duplicates) == (0, 2)
    # The same report id with other content is refused, and nothing is written.
    other = client.build_report(1, t)
    with pytest.raises(UploadError) as e:
        client.upload_reports([replace(other, report_id=reports[0].report_id)])
    assert e.value.code == grpc.StatusCode.ALREADY_EXISTS
    with dep.collector("plain") as collector:
        r = collector.collect(t, TP, wait=60)
    assert (r.report_count, r.estimate) == (2, 15)


def test_wrong_token_refused(dep: Deployment) -> None:
    task = replace(dep.tasks["plain"].collector, collector_token="not-the-token")
    with dep.collector("plain", task) as collector, pytest.raises(CollectionError) as e:
        collector.collect(past_bucket(5), TP, wait=10)
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    # The helper refuses a caller without the aggregator token.
    from veil.aggregator.leader.helper_client import aggregation_job_request
    from veil.protocol.v1 import helper_pb2_grpc

    with grpc.insecure_channel(dep.helper.address) as channel:
        stub = helper_pb2_grpc.HelperStub(channel)
        request = aggregation_job_request(dep.tasks["plain"].client.task_id, bytes(16), [])
        for metadata in ((), (("authorization", "Bearer wrong"),)):
            with pytest.raises(grpc.RpcError) as rpc:
                stub.Aggregate(request, metadata=metadata, timeout=10)
            assert rpc.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_batch_collected_at_most_once(dep: Deployment) -> None:
    client = dep.client("plain")
    t = past_bucket(6)
    client.upload_batch([1, 1], report_time=t)
    with dep.collector("plain") as collector:
        assert collector.collect(t, TP, wait=60).estimate == 2
        with pytest.raises(CollectionError) as e:
            collector.collect(t, TP, wait=60)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "collected at most once" in e.value.message
        # An overlapping, longer batch is refused as well.
        with pytest.raises(CollectionError):
            collector.collect(t - TP, 2 * TP, wait=60)
    # Late reports for a collected batch are refused, and not stored.
    stored = dep.stored_reports("plain")
    with pytest.raises(UploadError) as up:
        client.upload(1, report_time=t)
    assert up.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert dep.stored_reports("plain") == stored


def test_batch_below_min_batch_size(dep: Deployment) -> None:
    client = dep.client("small")
    t = past_bucket(2)
    client.upload_batch([1, 2, 3], report_time=t)
    with dep.collector("small") as collector:
        with pytest.raises(CollectionError) as e:
            collector.collect(t, TP, wait=60)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "fewer than min_batch_size (5) reports" in e.value.message
        assert "3 reports" not in e.value.message  # never the count (issue 13)
        # Not consumed: with enough reports the same batch can be collected.
        client.upload_batch([4, 5], report_time=t)
        r = collector.collect(t, TP, wait=60)
    assert (r.report_count, r.estimate) == (5, 15)


def test_exhausted_budget(dep: Deployment) -> None:
    # Two tasks of one survey (same respondents), ε = 1 each, survey total 3/2.
    t = past_bucket(2)
    for name in ("survey_a", "survey_b"):
        dep.client(name).upload_batch([1, 0, 1], report_time=t)
    with dep.collector("survey_a") as collector:
        r = collector.collect(t, TP, wait=60)
    assert r.report_count == 3 and r.epsilon_spent == 1
    with dep.collector("survey_b") as collector, pytest.raises(CollectionError) as e:
        collector.collect(t, TP, wait=60)
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "budget" in e.value.message


def test_report_time_checks(dep: Deployment) -> None:
    client = dep.client("plain")
    stored = dep.stored_reports("plain")
    future = int(time.time()) + 10 * TP
    with pytest.raises(UploadError) as e:
        client.upload_batch([1, 2], report_time=future)
    assert e.value.code == grpc.StatusCode.OUT_OF_RANGE
    assert "clock" in e.value.message
    assert dep.stored_reports("plain") == stored


def test_unknown_task_and_bad_interval(dep: Deployment) -> None:
    task = replace(dep.tasks["plain"].collector, task_id=bytes(32))
    with dep.collector("plain", task) as collector, pytest.raises(CollectionError) as e:
        collector.collect(past_bucket(2), TP, wait=10)
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    with dep.collector("plain") as collector, pytest.raises(CollectionError) as e:
        collector.collect(past_bucket(2) + 1, TP, wait=10)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "time_precision" in e.value.message


def test_message_size_limits(dep: Deployment) -> None:
    from veil.protocol.v1 import leader_pb2, leader_pb2_grpc

    client = dep.client("plain")
    stored = dep.stored_reports("plain")
    report = client.build_report(1, past_bucket(2))
    with pytest.raises(UploadError) as e:
        client.upload_reports([replace(report, public_share=bytes(1 << 17))])
    # Each part of a report has one exact size (issue 13).
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "public_share is 131072 bytes; this task's is exactly" in e.value.message
    # A request above the server's max_message_bytes (16 MiB) is refused by gRPC.
    options = [("grpc.max_send_message_length", 64 << 20)]
    with grpc.insecure_channel(dep.leader.address, options=options) as channel:
        stub = leader_pb2_grpc.LeaderStub(channel)
        request = leader_pb2.UploadRequest(task_id=dep.tasks["plain"].client.task_id)
        request.reports.add(public_share=bytes(17 << 20))
        with pytest.raises(grpc.RpcError) as rpc:
            stub.UploadReports(request, timeout=30)
        assert rpc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dep.stored_reports("plain") == stored
