"""Malicious or curious peers: the test plays the leader against the real
helper (with the real aggregator token where the attack needs it) and a
collector against the real leader. Every refusal leaves the refusing
server's database unchanged, and no aggregator ever releases an un-noised
aggregate share of a task with a DP mechanism.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.deployment import Deployment, start_deployment
from tests.support.modes import LONG
from tests.support.reliability import (
    TP,
    bucket,
    leader_verify_init_item,
    query,
    record,
    state_digest,
)
from veil.aggregator.core import VerifyInitItem
from veil.aggregator.leader.helper_client import aggregation_job_request
from veil.collector import CollectionError
from veil.dp import decode
from veil.hpke import (
    ROLE_HELPER,
    ROLE_LEADER,
    Ciphertext,
    agg_share_info,
    input_share_info,
    open_,
    seal,
)
from veil.messages import vdaf_ctx
from veil.protocol.v1 import helper_pb2, helper_pb2_grpc, leader_pb2, leader_pb2_grpc
from veil.task import DpSpec, VdafSpec

pytestmark = [pytest.mark.slow, pytest.mark.adversarial]

NONE = DpSpec("none")
NOISE_TP = 60
# Scale Δ/ε = 10 / (1/100) = 1000: a draw is exactly 0 with probability ~1/2000.
NOISY = DpSpec("geometric", epsilon="1/100")
NOISY_COLLECTIONS = 40 if LONG else 12


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    survey = DpSpec("geometric", epsilon="1", survey="s1", survey_budget="3/2")
    tasks: dict[str, tuple[VdafSpec, DpSpec, dict[str, Any]]] = {
        "plain": (VdafSpec("sum", max_measurement=10), NONE, {"min_batch_size": 2}),
        "other": (VdafSpec("sum", max_measurement=10), NONE, {"min_batch_size": 1}),
        "noisy": (
            VdafSpec("sum", max_measurement=10),
            NOISY,
            {"time_precision": NOISE_TP, "min_batch_size": 1},
        ),
        "survey_a": (VdafSpec("count"), survey, {"min_batch_size": 1}),
        "survey_b": (VdafSpec("count"), survey, {"min_batch_size": 1}),
    }
    d = start_deployment(Path(tmp_path_factory.mktemp("peers")), tasks)
    try:
        yield d
    finally:
        d.stop()


def _db(dep: Deployment, role: str) -> Path:
    return dep.local.root / f"{role}.db"


def _helper_stub(dep: Deployment) -> tuple[grpc.Channel, helper_pb2_grpc.HelperStub]:
    channel = grpc.insecure_channel(dep.helper.address)
    return channel, helper_pb2_grpc.HelperStub(channel)


def _token(dep: Deployment, name: str) -> tuple[tuple[str, str], ...]:
    token = dep.tasks[name].leader.aggregator_token
    return (("authorization", f"Bearer {token}"),)


def _checksum(report_ids: list[bytes]) -> bytes:
    out = bytes(32)
    for rid in report_ids:
        out = bytes(a ^ b for a, b in zip(out, hashlib.sha256(rid).digest(), strict=True))
    return out


def _wait_helper_count(dep: Deployment, name: str, t: int, n: int) -> None:
    """Wait until the helper has aggregated `n` reports into bucket `t`."""
    task_id = dep.tasks[name].client.task_id
    deadline = time.monotonic() + 60
    while True:
        rows = query(
            _db(dep, "helper"),
            "SELECT sum(report_count) FROM batch_aggregates WHERE task_id = ? AND bucket = ?",
            task_id,
            t,
        )
        if rows and rows[0][0] == n:
            return
        assert time.monotonic() < deadline, f"helper aggregated {rows} of {n} reports"
        time.sleep(0.1)


def _share_request(
    dep: Deployment, name: str, t: int, count: int, checksum: bytes, job_id: bytes
) -> helper_pb2.AggregateShareRequest:
    return helper_pb2.AggregateShareRequest(
        task_id=dep.tasks[name].client.task_id,
        collection_job_id=job_id,
        batch_interval={"start": t, "duration": dep.tasks[name].client.time_precision},
        report_count=count,
        checksum=checksum,
    )


def _refused(call: Any, request: Any, metadata: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        call(request, metadata=metadata, timeout=30)
    code: grpc.StatusCode = e.value.code()
    return code


def test_helper_refuses_unauthenticated_leader(dep: Deployment) -> None:
    t = bucket(2)
    client = dep.client("plain")
    reports = [client.build_report(v, t) for v in (1, 2, 3)]
    client.upload_reports(reports)
    _wait_helper_count(dep, "plain", t, 3)
    before = state_digest(_db(dep, "helper"))
    channel, stub = _helper_stub(dep)
    ids = [r.report_id for r in reports]
    share = _share_request(dep, "plain", t, 3, _checksum(ids), secrets.token_bytes(16))
    job = aggregation_job_request(dep.tasks["plain"].client.task_id, secrets.token_bytes(16), [])
    wrong = [
        (),
        (("authorization", "Bearer " + secrets.token_urlsafe(32)),),
        (("authorization", dep.tasks["plain"].leader.aggregator_token or ""),),  # no "Bearer "
        _token(dep, "other"),  # a real token, of another task
    ]
    with channel:
        for metadata in wrong:
            assert _refused(stub.Aggregate, job, metadata) == grpc.StatusCode.UNAUTHENTICATED
            assert _refused(stub.GetAggregateShare, share, metadata) == (
                grpc.StatusCode.UNAUTHENTICATED
            )
    assert state_digest(_db(dep, "helper")) == before
    # The batch is still whole: the real collector gets it.
    with dep.collector("plain") as collector:
        r = collector.collect(t, TP, wait=60)
    assert (r.report_count, r.estimate) == (3, 6)
    record("peers.helper_auth", attempts=2 * len(wrong), refused=2 * len(wrong))


def test_helper_checks_count_checksum_and_collects_once(dep: Deployment) -> None:
    t = bucket(3)
    client = dep.client("plain")
    reports = [client.build_report(v, t) for v in (4, 5, 6, 7)]
    client.upload_reports(reports)
    _wait_helper_count(dep, "plain", t, 4)
    ids = [r.report_id for r in reports]
    good = _checksum(ids)
    auth = _token(dep, "plain")
    job_id = secrets.token_bytes(16)
    before = state_digest(_db(dep, "helper"))
    channel, stub = _helper_stub(dep)
    with channel:
        for count, checksum in ((3, good), (5, good), (4, _checksum(ids[:3])), (4, bytes(32))):
            request = _share_request(dep, "plain", t, count, checksum, job_id)
            assert _refused(stub.GetAggregateShare, request, auth) == grpc.StatusCode.ABORTED
        assert state_digest(_db(dep, "helper")) == before
        # The honest request is answered, and again identically on retry.
        request = _share_request(dep, "plain", t, 4, good, job_id)
        first = stub.GetAggregateShare(request, metadata=auth, timeout=30)
        again = stub.GetAggregateShare(request, metadata=auth, timeout=30)
        assert first == again
        after_release = state_digest(_db(dep, "helper"))
        # A second collection of the batch, under another job id, is refused.
        second = _share_request(dep, "plain", t, 4, good, secrets.token_bytes(16))
        assert _refused(stub.GetAggregateShare, second, auth) == (
            grpc.StatusCode.FAILED_PRECONDITION
        )
        # The same job id for another batch is refused too.
        moved = _share_request(dep, "plain", t - TP, 0, bytes(32), job_id)
        assert _refused(stub.GetAggregateShare, moved, auth) == grpc.StatusCode.ALREADY_EXISTS
    assert state_digest(_db(dep, "helper")) == after_release
    # The real leader cannot get the helper's share of this batch a second time.
    with dep.collector("plain") as collector, pytest.raises(CollectionError):
        collector.collect(t, TP, wait=60)
    record("peers.helper_batch_checks", wrong_count_or_checksum=4, second_collection=2)


def test_helper_refuses_replays_from_the_leader(dep: Deployment) -> None:
    t = bucket(4)
    name = "other"
    task_id = dep.tasks[name].client.task_id
    items = [leader_verify_init_item(dep, name, t, v) for v in (3, 4)]
    auth = _token(dep, name)

    def job(job_id: bytes, its: list[VerifyInitItem]) -> helper_pb2.AggregationJobRequest:
        return aggregation_job_request(task_id, job_id, its)

    j1 = secrets.token_bytes(16)
    channel, stub = _helper_stub(dep)
    with channel:
        first = stub.Aggregate(job(j1, items), metadata=auth, timeout=30)
        assert [r.WhichOneof("result") for r in first.verify_resps] == ["verifier_message"] * 2
        _wait_helper_count(dep, name, t, 2)
        # A retry of the same job gets the same answer and changes nothing.
        # Only the helper's clock reading (helper_time_ms, read afresh for
        # each answer so that the leader measures the skew now) may differ.
        before = state_digest(_db(dep, "helper"))
        retried = stub.Aggregate(job(j1, items), metadata=auth, timeout=30)
        assert retried.helper_time_ms >= first.helper_time_ms > 0
        retried.helper_time_ms = first.helper_time_ms
        assert retried == first
        assert state_digest(_db(dep, "helper")) == before
        # The same job id with other content is refused outright.
        assert _refused(stub.Aggregate, job(j1, items[:1]), auth) == (
            grpc.StatusCode.ALREADY_EXISTS
        )
        # The same reports in a new job: each rejected as replayed, nothing added.
        again = stub.Aggregate(job(secrets.token_bytes(16), items), metadata=auth, timeout=30)
        assert [r.reject for r in again.verify_resps] == [helper_pb2.REPORT_REPLAYED] * 2
    _wait_helper_count(dep, name, t, 2)
    record("peers.helper_replay", replayed_reports=2, counted=0, job_id_reuse_refused=1)


def test_budget_refused_by_both(dep: Deployment) -> None:
    # Two tasks over the same respondents; ε = 1 each, survey total 3/2.
    t = bucket(2)
    reports = {}
    for name in ("survey_a", "survey_b"):
        client = dep.client(name)
        reports[name] = [client.build_report(v, t) for v in (1, 0, 1)]
        client.upload_reports(reports[name])
    with dep.collector("survey_a") as collector:
        assert collector.collect(t, TP, wait=60).epsilon_spent == 1
    _wait_helper_count(dep, "survey_b", t, 3)
    helper_before = state_digest(_db(dep, "helper"))
    leader_before = state_digest(_db(dep, "leader"))
    ids = [r.report_id for r in reports["survey_b"]]
    channel, stub = _helper_stub(dep)
    with channel:
        request = _share_request(dep, "survey_b", t, 3, _checksum(ids), secrets.token_bytes(16))
        code = _refused(stub.GetAggregateShare, request, _token(dep, "survey_b"))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert state_digest(_db(dep, "helper")) == helper_before
    with dep.collector("survey_b") as collector, pytest.raises(CollectionError) as e:
        collector.collect(t, TP, wait=60)
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert state_digest(_db(dep, "leader")) == leader_before
    record("peers.budget", helper_refused=1, leader_refused=1)


def test_leader_refuses_collector(dep: Deployment) -> None:
    t = bucket(5)
    dep.client("plain").upload_batch([1, 2], report_time=t)
    task_id = dep.tasks["plain"].client.task_id
    job_id = secrets.token_bytes(16)
    create = leader_pb2.CreateCollectionRequest(
        task_id=task_id, collection_job_id=job_id, batch_interval={"start": t, "duration": TP}
    )
    get = leader_pb2.GetCollectionRequest(task_id=task_id, collection_job_id=job_id)
    wrong = [
        (),
        (("authorization", "Bearer " + secrets.token_urlsafe(32)),),
        (("authorization", f"Bearer {dep.tasks['other'].collector.collector_token}"),),
        # The aggregator token is no collector token.
        (("authorization", f"Bearer {dep.tasks['plain'].leader.aggregator_token}"),),
    ]
    # Let the driver aggregate, so that the digest is stable: no report left
    # pending or in a job, and no change over a few of its passes.
    deadline = time.monotonic() + 60
    before = ""
    while True:
        pending = query(_db(dep, "leader"), "SELECT count(*) FROM reports WHERE state IN (0, 1)")
        digest = state_digest(_db(dep, "leader"))
        if pending == [(0,)] and digest == before:
            break
        assert time.monotonic() < deadline, "the leader did not settle"
        before = digest
        time.sleep(0.3)
    with grpc.insecure_channel(dep.leader.address) as channel:
        stub = leader_pb2_grpc.LeaderStub(channel)
        for metadata in wrong:
            assert _refused(stub.CreateCollection, create, metadata) == (
                grpc.StatusCode.UNAUTHENTICATED
            )
            assert _refused(stub.GetCollection, get, metadata) == grpc.StatusCode.UNAUTHENTICATED
    assert state_digest(_db(dep, "leader")) == before
    with dep.collector("plain") as collector:
        r = collector.collect(t, TP, wait=60, collection_job_id=job_id)
        assert (r.report_count, r.estimate) == (2, 3)
        with pytest.raises(CollectionError) as e:
            collector.collect(t, TP, wait=60)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(CollectionError) as e:
            collector.collect(t - TP, TP, wait=60, collection_job_id=job_id)
        assert e.value.code == grpc.StatusCode.ALREADY_EXISTS
    record("peers.collector_auth", wrong_token_attempts=2 * len(wrong), second_collection=1)


def _open(dep: Deployment, role: int, ct: Any, start: int, count: int) -> list[int]:
    task = dep.tasks["noisy"].collector
    info = agg_share_info(
        role, task.task_id, start, NOISE_TP, count, dp_params=task.dp.binding(task.vdaf)
    )
    plain = open_(task.collector_hpke_keypair, Ciphertext(ct.config_id, ct.enc, ct.payload), info)
    return list(task.vdaf.instantiate().decode_agg_share(None, plain))


def test_no_aggregator_releases_an_unnoised_share(dep: Deployment) -> None:
    """Each aggregator's released share, opened with the collector's key,
    against the same aggregator's un-noised share in its own database: the
    difference is its noise. It must be fresh and non-zero (a zero draw has
    probability ~1/2000, so at most one of the collections may show one)."""
    name = "noisy"
    client = dep.client(name)
    task_id = client.task.task_id
    vdaf = client.vdaf
    p = vdaf.field.MODULUS
    base = bucket(1, NOISE_TP) - NOISY_COLLECTIONS * NOISE_TP
    truths = []
    for i in range(NOISY_COLLECTIONS):
        values = [secrets.randbelow(11) for _ in range(3)]
        truths.append(sum(values))
        client.upload_batch(values, report_time=base + i * NOISE_TP)
    noise: dict[str, list[int]] = {"leader": [], "helper": []}
    with dep.collector(name) as collector, grpc.insecure_channel(dep.leader.address) as channel:
        stub = leader_pb2_grpc.LeaderStub(channel)
        auth = (("authorization", f"Bearer {dep.tasks[name].collector.collector_token}"),)
        for i in range(NOISY_COLLECTIONS):
            start = base + i * NOISE_TP
            job_id = secrets.token_bytes(16)
            result = collector.collect(start, NOISE_TP, wait=60, collection_job_id=job_id)
            job = stub.GetCollection(
                leader_pb2.GetCollectionRequest(task_id=task_id, collection_job_id=job_id),
                metadata=auth,
                timeout=30,
            )
            released = {
                "leader": _open(dep, ROLE_LEADER, job.leader_encrypted_agg_share, start, 3),
                "helper": _open(dep, ROLE_HELPER, job.helper_encrypted_agg_share, start, 3),
            }
            raw = {}
            for role in ("leader", "helper"):
                rows = query(
                    _db(dep, role),
                    "SELECT agg_share FROM batch_aggregates WHERE task_id = ? AND bucket = ?"
                    " AND agg_share IS NOT NULL",
                    task_id,
                    start,
                )
                # The bucket's shard rows add up to its aggregate share.
                raw[role] = vdaf.merge(
                    None, [vdaf.decode_agg_share(None, bytes(r[0])) for r in rows]
                )
            # The stored shares are the real ones: together they open to the truth.
            assert decode(vdaf.merge(None, [raw["leader"], raw["helper"]]), p) == [truths[i]]
            for role in noise:
                noise[role] += decode(
                    [(a - b) % p for a, b in zip(released[role], raw[role], strict=True)], p
                )
            # What the collector saw is the truth plus both noises.
            assert result.noisy_aggregate == [truths[i] + noise["leader"][-1] + noise["helper"][-1]]
    zeros = {role: sum(1 for z in draws if z == 0) for role, draws in noise.items()}
    record(
        "peers.noise",
        collections=NOISY_COLLECTIONS,
        zero_noise_draws=zeros,
        mean_abs_noise={r: sum(map(abs, d)) / len(d) for r, d in noise.items()},
        distinct_draws={r: len(set(d)) for r, d in noise.items()},
    )
    for role, draws in noise.items():
        # A zero draw has probability tanh(1/2000) = 5e-4 (scale 1000): two of
        # twelve happen by chance about once in 60,000 runs, three of them
        # about once in 2e7 (40 draws in the long mode: 2.4e-6).
        assert zeros[role] <= 2, (role, draws)
        assert len(set(draws)) > NOISY_COLLECTIONS // 2, (role, draws)
    assert noise["leader"] != noise["helper"]


# --- what held up in the adversarial review (issue 13): kept by these tests ---


def test_superset_and_nested_intervals_refused_by_the_helper(dep: Deployment) -> None:
    """A malicious leader's fresh collection id for an interval that contains,
    or lies inside, a collected batch: the helper closes each bucket once."""
    name = "other"
    client = dep.client(name)
    single, pair = bucket(40), bucket(43)  # [40] alone; [43, 42] together
    client.upload_reports([client.build_report(3, single), client.build_report(4, pair)])
    client.upload_reports([client.build_report(5, pair + TP)])
    with dep.collector(name) as collector:
        assert collector.collect(single, TP, wait=60).report_count == 1
        assert collector.collect(pair, 2 * TP, wait=60).report_count == 2
    before = state_digest(_db(dep, "helper"))
    auth = _token(dep, name)
    channel, stub = _helper_stub(dep)
    with channel:
        for start, duration in (
            (single - TP, 3 * TP),  # superset of the collected single bucket
            (pair, TP),  # nested in the collected pair
            (pair + TP, TP),  # the other half of the pair
            (single - TP, 2 * TP),  # overlaps the single bucket
        ):
            request = helper_pb2.AggregateShareRequest(
                task_id=dep.tasks[name].client.task_id,
                collection_job_id=secrets.token_bytes(16),
                batch_interval={"start": start, "duration": duration},
                report_count=1,
                checksum=bytes(32),
            )
            assert _refused(stub.GetAggregateShare, request, auth) == (
                grpc.StatusCode.FAILED_PRECONDITION
            ), (start, duration)
    assert state_digest(_db(dep, "helper")) == before


def test_concurrent_collections_exactly_one_wins(dep: Deployment) -> None:
    """Collectors racing for one batch (and a superset of it): exactly one
    collection finishes; the others are refused, and nothing is released twice."""
    name = "other"
    client = dep.client(name)
    t = bucket(46)
    client.upload_batch([1, 2, 3], report_time=t)
    from concurrent.futures import ThreadPoolExecutor

    def collect(interval: tuple[int, int]) -> str:
        with dep.collector(name) as collector:
            try:
                r = collector.collect(*interval, wait=60)
            except CollectionError as e:
                return e.code.name
            assert (r.report_count, r.estimate) == (3, 6)
            return "finished"

    intervals = [(t, TP)] * 3 + [(t - TP, 2 * TP)]
    with ThreadPoolExecutor(len(intervals)) as pool:
        outcomes = list(pool.map(collect, intervals))
    assert outcomes.count("finished") == 1, outcomes
    assert set(outcomes) == {"finished", "FAILED_PRECONDITION"}, outcomes
    record("peers.concurrent_collections", racers=len(intervals), outcomes=outcomes)


def test_tampered_leader_shares_reject_every_value_alike(dep: Deployment) -> None:
    """A leader that tampers with its verifier share, or with its input share
    before verifying, to learn a report's value from whether it is accepted
    (a selective failure): every value is rejected alike, so acceptance says
    nothing about the value."""
    name = "other"
    leader_task = dep.tasks[name].leader
    assert leader_task.verify_key is not None
    verify_key = leader_task.verify_key
    client = dep.client(name)
    vdaf = client.vdaf
    ctx = vdaf_ctx(leader_task.task_id)
    t = bucket(48)

    def shifted_input_share(value: int) -> VerifyInitItem:
        # The leader's measurement share shifted by one in its first coordinate,
        # then its verifier share computed honestly from the shifted share.
        rid = secrets.token_bytes(16)
        public, shares = vdaf.shard(ctx, value, rid, secrets.token_bytes(vdaf.RAND_SIZE))
        meas = list(shares[0].meas_share)
        meas[0] = (meas[0] + 1) % vdaf.field.MODULUS
        leader = shares[0]._replace(meas_share=meas)
        _, vs = vdaf.verify_init(verify_key, ctx, 0, None, rid, public, leader)
        ps = vdaf.encode_public_share(public)
        ct = seal(
            client.hpke_config(ROLE_HELPER),
            input_share_info(ROLE_HELPER, leader_task.task_id, rid, t, ps),
            vdaf.encode_input_share(shares[1]),
        )
        return VerifyInitItem(rid, t, ps, ct, vdaf.encode_verifier_share(vs))

    def flipped_verifier_share(value: int) -> VerifyInitItem:
        item = leader_verify_init_item(dep, name, t, value)
        share = bytearray(item.leader_verifier_share)
        share[0] ^= 1
        return item._replace(leader_verifier_share=bytes(share))

    accepted: dict[str, int] = {}
    auth = _token(dep, name)
    channel, stub = _helper_stub(dep)
    with channel:
        for how, build in (
            ("verifier share", flipped_verifier_share),
            ("input share", shifted_input_share),
        ):
            for value in (0, 1, 9, 10):
                request = aggregation_job_request(
                    leader_task.task_id,
                    secrets.token_bytes(16),
                    [build(value) for _ in range(6)],
                )
                answer = stub.Aggregate(request, metadata=auth, timeout=30)
                accepted[f"{how}, value {value}"] = sum(
                    r.WhichOneof("result") == "verifier_message" for r in answer.verify_resps
                )
    assert set(accepted.values()) == {0}, accepted
    record("peers.tampered_leader_shares", accepted=accepted)
