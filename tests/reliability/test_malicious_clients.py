"""Malicious clients against a real leader and helper: every kind of bad
report is refused at upload or rejected during aggregation, with its reason,
counted by the server that caught it, and the collected aggregate equals the
sum of the honest reports alone.

Each kind gets its own time bucket holding honest reports and the bad one,
so a bad report that slipped through would show in that bucket's sum.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.deployment import Deployment, start_deployment
from tests.support.reliability import TP, bucket, record, rejections
from tests.support.reports import forged_report
from veil.aggregator.context import ReportSizes
from veil.client import Client, Report, UploadError, seal_report
from veil.hpke import ROLE_HELPER, ROLE_LEADER
from veil.messages import vdaf_ctx
from veil.task import DpSpec, VdafSpec

pytestmark = [pytest.mark.slow, pytest.mark.adversarial]

NONE = DpSpec("none")
HONEST = [10, 20, 30]


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tasks: dict[str, tuple[VdafSpec, DpSpec, dict[str, Any]]] = {
        "sum": (VdafSpec("sum", max_measurement=100), NONE, {"min_batch_size": 1}),
        # Histogram uses joint randomness: its public share carries the parts.
        "hist": (VdafSpec("histogram", length=5, chunk_length=2), NONE, {"min_batch_size": 1}),
        "other": (VdafSpec("sum", max_measurement=100), NONE, {"min_batch_size": 1}),
    }
    d = start_deployment(Path(tmp_path_factory.mktemp("malicious")), tasks, metrics=True)
    try:
        yield d
    finally:
        d.stop()


def _flip(data: bytes, at: int = 0) -> bytes:
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]


def _seal(
    client: Client,
    report_id: bytes,
    t: int,
    public_share: bytes,
    leader: bytes,
    helper: bytes,
    task_id: bytes | None = None,
) -> Report:
    """Seal chosen plaintexts exactly as an honest client would seal its shares."""
    return seal_report(
        client.task.task_id if task_id is None else task_id,
        report_id,
        t,
        public_share,
        leader,
        helper,
        client.hpke_config(ROLE_LEADER),
        client.hpke_config(ROLE_HELPER),
    )


def _shard(client: Client, measurement: Any) -> tuple[bytes, Any, list[Any]]:
    vdaf = client.vdaf
    rid = secrets.token_bytes(16)
    ctx = vdaf_ctx(client.task.task_id)
    public, shares = vdaf.shard(ctx, measurement, rid, secrets.token_bytes(vdaf.RAND_SIZE))
    return rid, public, shares


# --- bad reports rejected during aggregation ----------------------------


def out_of_range_with_honest_proof(client: Client, t: int) -> Report:
    """Sum value 102 > max 100: the encoding is not a bit vector, but the
    proof is computed honestly on it (a malicious client running the prover)."""
    vdaf = client.vdaf
    meas = vdaf.flp.encode(100)
    meas[0] += 2
    assert vdaf.flp.truncate(meas) == [102]
    rid = secrets.token_bytes(16)
    ctx = vdaf_ctx(client.task.task_id)
    seeds = secrets.token_bytes(vdaf.RAND_SIZE)
    size = vdaf.xof.SEED_SIZE
    _, shares = vdaf._shard_without_joint_rand(
        ctx, meas, [seeds[i : i + size] for i in range(0, len(seeds), size)]
    )
    return _seal(
        client,
        rid,
        t,
        b"",
        vdaf.encode_input_share(shares[0]),
        vdaf.encode_input_share(shares[1]),
    )


def tampered_proof(client: Client, t: int) -> Report:
    vdaf = client.vdaf
    rid, public, shares = _shard(client, 5)
    leader = shares[0]
    proof = list(leader.proofs_share)
    proof[0] = (proof[0] + 1) % vdaf.field.MODULUS
    bad = leader._replace(proofs_share=proof)
    return _seal(
        client,
        rid,
        t,
        vdaf.encode_public_share(public),
        vdaf.encode_input_share(bad),
        vdaf.encode_input_share(shares[1]),
    )


def tampered_joint_rand_part(client: Client, t: int) -> Report:
    vdaf = client.vdaf
    rid, public, shares = _shard(client, 2)
    parts = list(public)
    parts[1] = _flip(parts[1])
    return _seal(
        client,
        rid,
        t,
        vdaf.encode_public_share(parts),
        vdaf.encode_input_share(shares[0]),
        vdaf.encode_input_share(shares[1]),
    )


def mismatched_public_share(client: Client, t: int) -> Report:
    """Shares of one report with the public share of another (same value)."""
    vdaf = client.vdaf
    rid, _, shares = _shard(client, 3)
    _, other_public, _ = _shard(client, 3)
    return _seal(
        client,
        rid,
        t,
        vdaf.encode_public_share(other_public),
        vdaf.encode_input_share(shares[0]),
        vdaf.encode_input_share(shares[1]),
    )


def _lengths(leader_extra: int, helper_extra: int) -> Callable[[Client, int], Report]:
    def build(client: Client, t: int) -> Report:
        vdaf = client.vdaf
        rid, public, shares = _shard(client, 7 if client.task.vdaf.type == "sum" else 3)
        leader = vdaf.encode_input_share(shares[0])
        helper = vdaf.encode_input_share(shares[1])
        leader = leader + bytes(leader_extra) if leader_extra >= 0 else leader[:leader_extra]
        helper = helper + bytes(helper_extra) if helper_extra >= 0 else helper[:helper_extra]
        return _seal(client, rid, t, vdaf.encode_public_share(public), leader, helper)

    return build


def field_element_out_of_range(client: Client, t: int) -> Report:
    """A leader measurement share whose first element encodes a value >= p."""
    vdaf = client.vdaf
    rid, public, shares = _shard(client, 9)
    leader = bytearray(vdaf.encode_input_share(shares[0]))
    size = vdaf.field.ENCODED_SIZE
    leader[:size] = (vdaf.field.MODULUS + 1).to_bytes(size, "little")
    return _seal(
        client,
        rid,
        t,
        vdaf.encode_public_share(public),
        bytes(leader),
        vdaf.encode_input_share(shares[1]),
    )


def undecryptable_for(role: str) -> Callable[[Client, int], Report]:
    def build(client: Client, t: int) -> Report:
        r = client.build_report(4, t)
        ct = r.leader_ct if role == "leader" else r.helper_ct
        bad = replace(ct, payload=_flip(ct.payload, len(ct.payload) // 2))
        return replace(r, **{f"{role}_ct": bad})

    return build


def unknown_helper_key_id(client: Client, t: int) -> Report:
    r = client.build_report(4, t)
    return replace(r, helper_ct=replace(r.helper_ct, config_id=(r.helper_ct.config_id + 1) % 256))


def share_for_another_task(dep: Deployment) -> Callable[[Client, int], Report]:
    """An honest report of task "other" (its id sealed into both shares),
    uploaded to task "sum"."""

    def build(client: Client, t: int) -> Report:
        return dep.client("other").build_report(4, t)

    return build


@dataclass(frozen=True)
class Rejected:
    """Uploaded (acknowledged) but rejected during aggregation."""

    kind: str
    task: str
    build: Callable[[Client, int], Report]
    leader: dict[str, int]  # rejections the leader records (it records every outcome)
    helper: dict[str, int]  # rejections the helper records itself


def _aggregation_cases(dep: Deployment) -> list[Rejected]:
    verify = {"vdaf_verify_error": 1}
    decode = {"vdaf_decode_error": 1}
    return [
        Rejected("out-of-range value, honest proof", "sum", out_of_range_with_honest_proof,
                 verify, verify),
        Rejected("input share altered after proving", "sum",
                 lambda c, t: forged_report(c, 5, t), verify, verify),
        Rejected("tampered proof", "sum", tampered_proof, verify, verify),
        Rejected("tampered joint-randomness part", "hist", tampered_joint_rand_part,
                 verify, verify),
        Rejected("mismatched public share", "hist", mismatched_public_share, verify, verify),
        Rejected("field element >= p", "sum", field_element_out_of_range, decode, {}),
        Rejected("undecryptable leader ciphertext", "sum", undecryptable_for("leader"),
                 {"hpke_decrypt_error": 1}, {}),
        Rejected("undecryptable helper ciphertext", "sum", undecryptable_for("helper"),
                 {"hpke_decrypt_error": 1}, {"hpke_decrypt_error": 1}),
        Rejected("unknown helper HPKE key id", "sum", unknown_helper_key_id,
                 {"hpke_unknown_config_id": 1}, {"hpke_unknown_config_id": 1}),
        Rejected("share for another task", "sum", share_for_another_task(dep),
                 {"hpke_decrypt_error": 1}, {}),
    ]  # fmt: skip


_next_hour = iter(range(2, 1000))


def _honest(client: Client, t: int) -> list[Report]:
    values = HONEST if client.task.vdaf.type == "sum" else [0, 1, 4]
    return [client.build_report(v, t) for v in values]


def _expected(client: Client) -> Any:
    return sum(HONEST) if client.task.vdaf.type == "sum" else [1, 1, 0, 0, 1]


def test_bad_reports_rejected_by_reason_and_not_counted(dep: Deployment) -> None:
    outcomes = []
    for case in _aggregation_cases(dep):
        client = dep.client(case.task)
        task_id = client.task.task_id
        t = bucket(next(_next_hour))
        before = {
            role: rejections(dep.local.root / f"{role}.db", task_id)
            for role in ("leader", "helper")
        }
        reports = _honest(client, t)
        reports.insert(secrets.randbelow(len(reports) + 1), case.build(client, t))
        assert client.upload_reports(reports).accepted == len(reports), case.kind
        with dep.collector(case.task) as collector:
            r = collector.collect(t, TP, wait=60)
        delta = {}
        for role in ("leader", "helper"):
            after = rejections(dep.local.root / f"{role}.db", task_id)
            delta[role] = {
                k: after[k] - before[role].get(k, 0)
                for k in after
                if after[k] != before[role].get(k, 0)
            }
        outcomes.append((case.kind, delta["leader"], delta["helper"]))
        assert (r.report_count, r.estimate) == (3, _expected(client)), case.kind
        assert delta["leader"] == case.leader, case.kind
        assert delta["helper"] == case.helper, case.kind
    record(
        "malicious_clients.aggregation",
        kinds=len(outcomes),
        outcomes={k: {"leader": lead, "helper": help_} for k, lead, help_ in outcomes},
        aggregate_unchanged=True,
    )


# --- bad uploads refused outright -----------------------------------------


def _refused_counts(dep: Deployment, task: str) -> dict[str, float]:
    """veil_uploads_refused_total by reason for one task, from the leader's metrics."""
    import re
    import urllib.request

    assert dep.leader.metrics_address is not None
    with urllib.request.urlopen(f"http://{dep.leader.metrics_address}/metrics", timeout=10) as r:
        text = r.read().decode()
    label = dep.tasks[task].client.id_text
    pattern = rf'veil_uploads_refused_total{{reason="(\w+)",task="{re.escape(label)}"}} (\S+)'
    return {m[0]: float(m[1]) for m in re.findall(pattern, text)}


def _refusals(
    dep: Deployment,
) -> list[tuple[str, Callable[[Client, int], list[Report]], Any, str, str]]:
    def unknown_leader_key(c: Client, t: int) -> list[Report]:
        r = c.build_report(1, t)
        return [
            replace(r, leader_ct=replace(r.leader_ct, config_id=(r.leader_ct.config_id + 1) % 256))
        ]

    def far_future(c: Client, t: int) -> list[Report]:
        return [c.build_report(1, bucket(-24 * 365))]

    def unaligned(c: Client, t: int) -> list[Report]:
        return [replace(c.build_report(1, t), time=t + 1)]

    def oversized(c: Client, t: int) -> list[Report]:
        return [replace(c.build_report(1, t), public_share=bytes(1 << 17))]

    def short_enc(c: Client, t: int) -> list[Report]:
        r = c.build_report(1, t)
        return [replace(r, helper_ct=replace(r.helper_ct, enc=r.helper_ct.enc[:31]))]

    def padded_helper_ciphertext(c: Client, t: int) -> list[Report]:
        # Issue 13: honest leader share, helper ciphertext padded to 1 MiB.
        r = c.build_report(1, t)
        padding = bytes((1 << 20) - len(r.helper_ct.payload))
        return [replace(r, helper_ct=replace(r.helper_ct, payload=r.helper_ct.payload + padding))]

    def lengths(leader_extra: int, helper_extra: int) -> Callable[[Client, int], list[Report]]:
        return lambda c, t: [_lengths(leader_extra, helper_extra)(c, t)]

    sizes = ReportSizes.of(dep.client("sum").vdaf)
    exactly = "this task's is exactly"
    leader_payload = f"leader_encrypted_input_share.payload is {sizes.leader_payload + 8} bytes"

    def bad_id(c: Client, t: int) -> list[Report]:
        return [replace(c.build_report(1, t), report_id=bytes(15))]

    def reused_id(c: Client, t: int) -> list[Report]:
        first = c.build_report(1, t)
        assert c.upload_reports([first]).accepted == 1
        return [replace(c.build_report(2, t), report_id=first.report_id)]

    def honest_with_one_bad(c: Client, t: int) -> list[Report]:
        # All or nothing: one bad report refuses the whole upload.
        return [*_honest(c, t), *far_future(c, t)]

    def twice_in_one_upload(c: Client, t: int) -> list[Report]:
        r = c.build_report(1, t)
        return [r, r]

    return [
        ("unknown leader HPKE key id", unknown_leader_key, grpc.StatusCode.INVALID_ARGUMENT,
         "unknown leader HPKE config id", "invalid_message"),
        ("far-future timestamp", far_future, grpc.StatusCode.OUT_OF_RANGE, "in the future",
         "report_time_rejected"),
        ("time not rounded to time_precision", unaligned, grpc.StatusCode.INVALID_ARGUMENT,
         "time_precision", "invalid_message"),
        ("public share of 128 KiB", oversized, grpc.StatusCode.INVALID_ARGUMENT,
         f"public_share is {1 << 17} bytes; {exactly} {sizes.public_share} bytes",
         "wrong_length"),
        ("encapsulated key of 31 bytes", short_enc, grpc.StatusCode.INVALID_ARGUMENT,
         f"helper_encrypted_input_share.enc is 31 bytes; {exactly} 32 bytes", "wrong_length"),
        ("helper ciphertext padded to 1 MiB", padded_helper_ciphertext,
         grpc.StatusCode.INVALID_ARGUMENT,
         f"helper_encrypted_input_share.payload is {1 << 20} bytes; {exactly}"
         f" {sizes.helper_payload} bytes", "wrong_length"),
        ("leader share 8 bytes too long", lengths(8, 0), grpc.StatusCode.INVALID_ARGUMENT,
         leader_payload, "wrong_length"),
        ("leader share 1 byte short", lengths(-1, 0), grpc.StatusCode.INVALID_ARGUMENT,
         f"leader_encrypted_input_share.payload is {sizes.leader_payload - 1} bytes",
         "wrong_length"),
        ("helper share 8 bytes too long", lengths(0, 8), grpc.StatusCode.INVALID_ARGUMENT,
         f"helper_encrypted_input_share.payload is {sizes.helper_payload + 8} bytes",
         "wrong_length"),
        ("report id of 15 bytes", bad_id, grpc.StatusCode.INVALID_ARGUMENT, "16 bytes",
         "invalid_message"),
        ("report id reused with other content", reused_id, grpc.StatusCode.ALREADY_EXISTS,
         "already uploaded", "report_id_conflict"),
        ("one bad report among honest ones", honest_with_one_bad, grpc.StatusCode.OUT_OF_RANGE,
         "in the future", "report_time_rejected"),
        ("same report twice in one upload", twice_in_one_upload,
         grpc.StatusCode.INVALID_ARGUMENT, "twice", "invalid_message"),
    ]  # fmt: skip


def test_bad_uploads_refused_with_reason_and_nothing_stored(dep: Deployment) -> None:
    client = dep.client("sum")
    t = bucket(next(_next_hour))
    honest = _honest(client, t)
    assert client.upload_reports(honest).accepted == len(honest)
    refused = {}
    for kind, build, code, words, reason in _refusals(dep):
        reports = build(client, t)
        stored = dep.stored_reports("sum")
        counted = _refused_counts(dep, "sum")
        with pytest.raises(UploadError) as e:
            client.upload_reports(reports)
        assert e.value.code == code, kind
        assert words in e.value.message, (kind, e.value.message)
        assert dep.stored_reports("sum") == stored, kind
        now = _refused_counts(dep, "sum")
        delta = {k: v - counted.get(k, 0) for k, v in now.items() if v != counted.get(k, 0)}
        assert delta == {reason: 1}, (kind, delta)
        refused[kind] = f"{code.name} ({reason})"
    # An exact replay is acknowledged as a duplicate and stored once.
    again = client.upload_reports(honest)
    assert (again.accepted, again.duplicates) == (0, len(honest))
    with dep.collector("sum") as collector:
        r = collector.collect(t, TP, wait=60)
    # The honest reports plus the first report of "reused id" (value 1).
    assert (r.report_count, r.estimate) == (len(honest) + 1, sum(HONEST) + 1)
    record("malicious_clients.upload", kinds=len(refused) + 1, refused=refused, replay="duplicate")


def _malformed_count(dep: Deployment) -> float:
    """veil_requests_malformed_total for UploadReports, from the leader's metrics."""
    import re
    import urllib.request

    assert dep.leader.metrics_address is not None
    with urllib.request.urlopen(f"http://{dep.leader.metrics_address}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.findall(r'veil_requests_malformed_total{method="UploadReports"} (\S+)', text)
    return float(found[0]) if found else 0.0


def test_garbage_and_oversized_messages(dep: Deployment) -> None:
    """Bytes that are no UploadRequest at all: refused as INVALID_ARGUMENT
    naming the method and counted, when they do not parse (random bytes
    sometimes parse, as an empty or unknown-task request: refused too). A
    request above max_message_bytes: refused by gRPC before our code, as
    RESOURCE_EXHAUSTED. Nothing stored, and the leader keeps serving."""
    stored = dep.stored_reports("sum")
    malformed_before = _malformed_count(dep)
    malformed = 0
    codes = {}
    with grpc.insecure_channel(
        dep.leader.address, options=[("grpc.max_send_message_length", 64 << 20)]
    ) as channel:
        raw = channel.unary_unary("/veil.protocol.v1.Leader/UploadReports")
        for size in (1, 7, 100, 4096):
            for _ in range(5):
                try:
                    raw(secrets.token_bytes(size), timeout=10)
                    name = "accepted"
                except grpc.RpcError as e:
                    name = e.code().name
                    if (e.details() or "").startswith("malformed UploadReports request"):
                        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
                        malformed += 1
                codes[name] = codes.get(name, 0) + 1
        with pytest.raises(grpc.RpcError) as rpc:
            raw(bytes(17 << 20), timeout=30)
        assert rpc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dep.stored_reports("sum") == stored
    # Random bytes may happen to parse as an (empty or unknown-task) request;
    # either way they must be refused.
    assert "accepted" not in codes, codes
    assert "INTERNAL" not in codes, codes
    assert malformed > 0
    assert _malformed_count(dep) == malformed_before + malformed
    client = dep.client("sum")
    assert client.upload(1, bucket(1)).accepted == 1
    record(
        "malicious_clients.garbage",
        messages=20,
        oversized=1,
        refused_by_code=codes,
        counted_malformed=malformed,
    )
