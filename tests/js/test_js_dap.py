"""The JavaScript client's DAP reports (js/src/dap.js) against veil's Python
encoding: each report the JS client builds decodes as the draft's Report
(veil.dap.messages), encodes again to the same bytes, carries its time in
time precisions, and opens, verifies and aggregates under the task's DAP
version and TaskConfiguration to the exact sum; sealed under the other
draft's tag, no share opens. Malformed measurements are refused with the
Python client's messages, before anything is sealed."""

from __future__ import annotations

import functools
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.dap_reports import dap_aggregate
from tests.support.node import js_dap_reports, require_node_client
from veil.client.dap import DapClient
from veil.dap.invitation import (
    INVITATION_EXTENSION,
)
from veil.dap.messages import (
    InputShareAad,
    PlaintextInputShare,
    Report,
    ReportMetadata,
    TaskConfiguration,
)
from veil.dap.versions import DapVersion, Role, input_share_info, vdaf_context
from veil.hpke import (
    ROLE_HELPER,
    ROLE_LEADER,
    Ciphertext,
    HpkeConfig,
    HpkeError,
    generate_keypair,
)
from veil.invite import blindrsa
from veil.invite.token import TOKEN_SIZE, public_key_bytes
from veil.task import ClientTask, DapSpec, DpSpec, VdafSpec, new_task

TP = 3600
WHEN = 480_000 * TP + 1234  # not on the time precision: rounded down
LEADER, HELPER = generate_keypair(3), generate_keypair(4)

CASES: dict[str, tuple[VdafSpec, list[Any], Any]] = {
    "count": (VdafSpec("count"), [1, 0, 1, 1], 3),
    "sum": (VdafSpec("sum", max_measurement=100), [5, 99, 0], 104),
    "histogram": (VdafSpec("histogram", length=4, chunk_length=2), [0, 3, 3], [1, 0, 0, 2]),
    "sumvec": (
        VdafSpec("sumvec", length=3, max_measurement=7, chunk_length=2),
        [[1, 2, 3], [7, 0, 7]],
        [8, 2, 10],
    ),
}


@pytest.fixture(scope="module", autouse=True)
def _node() -> None:
    require_node_client()


def _task(vdaf: VdafSpec, version: DapVersion = DapVersion.DAP_19) -> Any:
    dap = DapSpec("https://leader.example/", "https://helper.example/dap/", version.value, "js")
    files = new_task(vdaf, "127.0.0.1:1", "127.0.0.1:2", min_batch_size=2, dp=DpSpec("none"),
                     dap=dap, time_precision=TP)  # fmt: skip
    return files.client


@pytest.mark.parametrize("version", list(DapVersion))
@pytest.mark.parametrize("name", sorted(CASES))
def test_js_dap_reports_open_and_sum_exactly(name: str, version: DapVersion) -> None:
    vdaf, measurements, want = CASES[name]
    task = _task(vdaf, version)
    built = js_dap_reports(task, LEADER.config, HELPER.config, measurements, WHEN)
    reports = []
    for encoded in built:
        assert isinstance(encoded, bytes), encoded
        report = Report.decode(encoded)
        assert report.encode() == encoded
        assert report.metadata.time == WHEN // TP
        assert report.metadata.public_extensions == ()
        reports.append(report)
    assert len({r.metadata.report_id for r in reports}) == len(reports)
    assert dap_aggregate(task, version, LEADER, HELPER, reports) == want


def test_a_report_sealed_under_another_draft_does_not_open() -> None:
    task = _task(VdafSpec("count"))
    (encoded,) = js_dap_reports(task, LEADER.config, HELPER.config, [1], WHEN, version="dap-18")
    assert isinstance(encoded, bytes)
    with pytest.raises(HpkeError):
        dap_aggregate(task, DapVersion.DAP_19, LEADER, HELPER, [Report.decode(encoded)])


def test_malformed_measurements_are_refused() -> None:
    task = _task(VdafSpec("sum", max_measurement=100))
    got = js_dap_reports(task, LEADER.config, HELPER.config, [101, -1, 7], WHEN)
    assert isinstance(got[0], str) and isinstance(got[1], str)
    assert isinstance(got[2], bytes)


FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dap_js_encodings.json"


def encodings() -> dict[str, Any]:
    """Python's encoding of every part the JS client writes, from fixed inputs
    (tests/fixtures/dap_js_encodings.json was written from it, with an
    "about" key): js/test/dap.test.js encodes the same inputs and compares."""
    task = _task(VdafSpec("count"))
    configuration = task.dap_configuration().encode(DapVersion.DAP_19)
    report_id, time, public_share = bytes(range(16)), 480_000, bytes([7] * 5)
    metadata = ReportMetadata(report_id, time)
    leader = Ciphertext(3, bytes([1] * 32), bytes([2] * 40))
    helper = Ciphertext(255, bytes([9]), bytes([8]))
    aad = InputShareAad(task.task_id, task.dap_configuration(), metadata, public_share)
    return {
        "task_id": task.task_id.hex(),
        "configuration": configuration.hex(),
        "report_id": report_id.hex(),
        "time": time,
        "public_share": public_share.hex(),
        "payload": bytes([5] * 20).hex(),
        "leader": {"config_id": 3, "enc": leader.enc.hex(), "payload": leader.payload.hex()},
        "helper": {"config_id": 255, "enc": helper.enc.hex(), "payload": helper.payload.hex()},
        "metadata_encoded": metadata.encode().hex(),
        "input_share_aad": aad.encode(DapVersion.DAP_19).hex(),
        "plaintext_input_share": PlaintextInputShare((), bytes([5] * 20)).encode().hex(),
        "report": Report(metadata, public_share, leader, helper).encode().hex(),
        "info": {
            v.value: {
                "leader": input_share_info(v, Role.LEADER).hex(),
                "helper": input_share_info(v, Role.HELPER).hex(),
                "vdaf_context": vdaf_context(v, task.task_id).hex(),
            }
            for v in DapVersion
        },
    }


def test_the_encoding_fixture_is_pythons() -> None:
    # The fixture's task id is drawn anew by each new_task: the check rebuilds
    # every encoding from the fixture's own task and configuration.
    fixture = json.loads(FIXTURE.read_text())
    task_id = bytes.fromhex(fixture["task_id"])
    configuration = bytes.fromhex(fixture["configuration"])
    assert (
        TaskConfiguration.decode(configuration, DapVersion.DAP_19).encode(DapVersion.DAP_19)
        == configuration
    )
    metadata = ReportMetadata(bytes.fromhex(fixture["report_id"]), fixture["time"])
    public_share = bytes.fromhex(fixture["public_share"])
    cts = [
        Ciphertext(c["config_id"], bytes.fromhex(c["enc"]), bytes.fromhex(c["payload"]))
        for c in (fixture["leader"], fixture["helper"])
    ]
    task = TaskConfiguration.decode(configuration, DapVersion.DAP_19)
    aad = InputShareAad(task_id, task, metadata, public_share).encode(DapVersion.DAP_19)
    plain = PlaintextInputShare((), bytes.fromhex(fixture["payload"])).encode()
    assert fixture["metadata_encoded"] == metadata.encode().hex()
    assert fixture["input_share_aad"] == aad.hex()
    assert fixture["plaintext_input_share"] == plain.hex()
    assert fixture["report"] == Report(metadata, public_share, *cts).encode().hex()
    for v in DapVersion:
        assert fixture["info"][v.value] == {
            "leader": input_share_info(v, Role.LEADER).hex(),
            "helper": input_share_info(v, Role.HELPER).hex(),
            "vdaf_context": vdaf_context(v, task_id).hex(),
        }


INVITED_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dap_js_invitation.json"
# Token bytes of the right size: sealing does not check them.
TOKEN = bytes(i % 251 for i in range(TOKEN_SIZE))
# The invited tasks' aggregators: the discard port on loopback, which
# refuses at once, so that an invited report stays in the client's outbox.
INVITED_ENDPOINTS = ("http://127.0.0.1:9/", "http://127.0.0.1:9/dap/")


@functools.cache
def _issuer_key() -> bytes:
    # The client only needs a task that takes tokens: sealing checks none.
    return public_key_bytes(blindrsa.generate_key().public_key())


def _invited_task(case: dict[str, Any]) -> ClientTask:
    """The client's task of one case: its task id and configuration, its
    invitation extension where the case puts it (in the leader's share
    where the helper is another implementation)."""
    dap = DapSpec(
        *INVITED_ENDPOINTS, case["version"], "js",
        other_implementation="helper" if case["invitation"] == "leader" else None,
    )  # fmt: skip
    files = new_task(
        VdafSpec.from_dict(case["vdaf"]), "127.0.0.1:1", "127.0.0.1:2", min_batch_size=2,
        dp=DpSpec("none"), dap=dap, time_precision=case["time_precision"],
        issuer_public_key=_issuer_key(),
    )  # fmt: skip
    return replace(files.client, task_id=bytes.fromhex(case["task_id"]))


def invited_report(case: dict[str, Any], outbox: Path) -> dict[str, str]:
    """Python's invited DAP report from the inputs of one case of
    tests/fixtures/dap_js_invitation.json, built by the client's own
    public path: DapClient.prepare_invited, with the case's report id,
    randomness and ephemeral keys as its draws (its test hook), then
    upload_invited with the case's token, which keeps the report in the
    client's outbox (the leader is unreachable), where it is read: the
    leader's key digest, the token's redemption context and the encoded
    Report, in hex."""
    task = _invited_task(case)
    version = DapVersion(case["version"])
    assert task.dap_configuration().encode(version).hex() == case["configuration"]
    configs = [
        HpkeConfig(c["config_id"], bytes.fromhex(c["public_key"]))
        for c in (case["leader"], case["helper"])
    ]
    drawn = [bytes.fromhex(case["report_id"]), bytes.fromhex(case["rand"])]
    drawn += [bytes.fromhex(e) for e in case["ephemerals"]]

    def draw(n: int) -> bytes:
        got = drawn.pop(0)
        assert len(got) == n
        return got

    when = case["time"] * case["time_precision"]
    with DapClient(task, outbox=outbox, retries=0, clock=lambda: when) as client:
        assert client.outbox is not None
        for role, config in zip((ROLE_LEADER, ROLE_HELPER), configs, strict=True):
            client.outbox.save_config(task.task_id, role, config, time.time())
        invited = client.prepare_invited(case["measurement"], when, draw=draw)
        assert drawn == []
        result = client.upload_invited(invited, bytes.fromhex(case["token"]))
        assert (result.accepted, result.pending) == (0, 1)
        ((_, report),) = client.outbox.pending(task.task_id, 2)
    return {
        "leader_key_digest": invited.leader_key_digest.hex(),
        "context": invited.context.hex(),
        "report": report.encode().hex(),
    }


def invited_fixture(directory: Path) -> dict[str, Any]:
    """The fixture's inputs and Python's outputs (written to
    tests/fixtures/dap_js_invitation.json with an "about" key; each
    client's outbox in `directory`): a Count task with its extension
    public, a Histogram task with it in the leader's share;
    js/test/dap.test.js builds the same with the JS client."""
    cases = []
    for n, (vdaf, measurement, place) in enumerate(
        [(VdafSpec("count"), 1, "public"),
         (VdafSpec("histogram", length=4, chunk_length=2), 2, "leader")]
    ):  # fmt: skip
        case: dict[str, Any] = {
            "version": "dap-19",
            "task_id": bytes(range(100 + n, 132 + n)).hex(),
            "vdaf": vdaf.to_dict(),
            "time_precision": TP,
            "time": 480_000 + n,
            "measurement": measurement,
            "invitation": place,
            "report_id": bytes(range(16 * n, 16 * n + 16)).hex(),
            "rand": bytes((7 * i + n) % 256 for i in range(vdaf.instantiate().RAND_SIZE)).hex(),
            "leader": {"config_id": 3, "public_key": LEADER.config.public_key.hex()},
            "helper": {"config_id": 4, "public_key": HELPER.config.public_key.hex()},
            "ephemerals": [bytes([n + 1] * 32).hex(), bytes([n + 2] * 32).hex()],
            "token": TOKEN.hex(),
        }
        configuration = _invited_task(case).dap_configuration().encode(DapVersion.DAP_19)
        case["configuration"] = configuration.hex()
        cases.append({**case, **invited_report(case, directory / f"outbox-{n}.sqlite")})
    return {"cases": cases}


def test_the_invitation_fixture_is_pythons(tmp_path: Path) -> None:
    """Each case's outputs are what the Python client builds from its
    inputs, and its report carries the extension where the case says (the
    JS test compares its own build with the same outputs)."""
    cases = json.loads(INVITED_FIXTURE.read_text())["cases"]
    assert [c["invitation"] for c in cases] == ["public", "leader"]
    for n, case in enumerate(cases):
        assert invited_report(case, tmp_path / f"outbox-{n}.sqlite") == {
            k: case[k] for k in ("leader_key_digest", "context", "report")
        }
        report = Report.decode(bytes.fromhex(case["report"]))
        public = report.metadata.public_extensions
        if case["invitation"] == "public":
            assert [e.extension_type for e in public] == [INVITATION_EXTENSION]
            assert public[0].extension_data == bytes.fromhex(case["token"]) + bytes.fromhex(
                case["leader_key_digest"]
            )
        else:
            assert public == ()
