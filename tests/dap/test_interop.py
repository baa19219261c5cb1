"""veil's DAP codec against bytes another implementation wrote: dap-ts (an
independent TypeScript implementation of draft-ietf-ppm-dap-19) encoded the
HPKE config lists, task configurations and uploads of
tests/fixtures/dap/dap_ts_reports.json, its client sealing Prio3Count, Sum
and Histogram reports to two X25519 keys. veil decodes every message, builds
the same task configuration byte for byte, opens both aggregators' input
shares with DAP's info and associated data, and runs the VDAF's verification
and aggregation over them with veil's own Prio3: the aggregate is the
measurements' sum."""

from __future__ import annotations

import base64
import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from veil.dap.messages import (
    BatchMode,
    Extension,
    HpkeConfigList,
    Interval,
    TaskConfiguration,
    UploadRequest,
    VdafConfig,
    task_interval_extension,
)
from veil.dap.problems import message_of
from veil.dap.shares import open_input_share
from veil.dap.versions import DapVersion, Role, vdaf_context
from veil.hpke import HpkeConfig, HpkeError, HpkeKeypair
from veil.vdaf.spec.prio3 import Prio3, Prio3Count, Prio3Histogram, Prio3Sum

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "dap" / "dap_ts_reports.json").read_text()
)
IN, OUT = FIXTURE["input"], FIXTURE["output"]
V19 = DapVersion.DAP_19
VDAFS: dict[str, tuple[Prio3[Any, Any], VdafConfig]] = {
    "count": (Prio3Count(2), VdafConfig("Prio3Count")),
    "sum": (
        Prio3Sum(2, IN["sum_max"]),
        VdafConfig("Prio3Sum", (("max_measurement", IN["sum_max"]),)),
    ),
    "histogram": (
        Prio3Histogram(2, IN["histogram_length"], IN["histogram_chunk_length"]),
        VdafConfig(
            "Prio3Histogram",
            (("length", IN["histogram_length"]), ("chunk_length", IN["histogram_chunk_length"])),
        ),
    ),
}


def _keypair(role: str) -> HpkeKeypair:
    spec = IN[role]
    public = bytes.fromhex(spec["public_key"])
    return HpkeKeypair(HpkeConfig(spec["config_id"], public), bytes.fromhex(spec["private_key"]))


def _task_id(name: str) -> bytes:
    encoded = IN["tasks"][name]["id"]
    return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))


def _veil_task(name: str) -> TaskConfiguration:
    """The task as veil encodes it from the same parameters."""
    spec = IN["tasks"][name]
    vdaf = VDAFS[name][1]
    return TaskConfiguration(
        task_info=spec["info"].encode(),
        leader_aggregator_endpoint=IN["leader"]["endpoint"].encode(),
        helper_aggregator_endpoint=IN["helper"]["endpoint"].encode(),
        time_precision=IN["time_precision"],
        min_batch_size=IN["min_batch_size"],
        batch_mode=BatchMode.TIME_INTERVAL,
        vdaf_type=vdaf.vdaf_type,
        vdaf_configuration=vdaf.encode(),
        extensions=(
            task_interval_extension(Interval(spec["interval_start"], spec["interval_duration"])),
        ),
    )


@pytest.mark.parametrize("role", ["leader", "helper"])
def test_their_hpke_config_list(role: str) -> None:
    configs = HpkeConfigList.decode(bytes.fromhex(OUT["hpke_config_lists"][role]))
    assert [c.id for c in configs.configs] == [IN[role]["decoy_id"], IN[role]["config_id"]]
    assert configs.configs[0].kem_id == 0x0010 and len(configs.configs[0].public_key) == 65
    # The P-256 config comes first; veil, like dap-ts, seals to the X25519 one.
    assert configs.first_supported() == _keypair(role).config
    assert configs.encode().hex() == OUT["hpke_config_lists"][role]


@pytest.mark.parametrize("name", sorted(VDAFS))
def test_their_task_configuration_is_ours(name: str) -> None:
    theirs = bytes.fromhex(OUT["tasks"][name]["task_configuration"])
    assert _veil_task(name).encode(V19) == theirs
    decoded = TaskConfiguration.decode(theirs, V19)
    assert decoded == _veil_task(name)
    assert VdafConfig.decode(decoded.vdaf_type, decoded.vdaf_configuration) == VDAFS[name][1]


@pytest.mark.parametrize("name", sorted(VDAFS))
def test_their_upload_opens_and_aggregates_in_veil(name: str) -> None:
    spec, out = IN["tasks"][name], OUT["tasks"][name]
    assert out["method"] == "POST"
    assert out["url"] == f"{IN['leader']['endpoint']}tasks/{spec['id']}/reports"
    assert message_of(out["content_type"]) == "upload-req"
    upload = UploadRequest.decode(bytes.fromhex(out["upload_request"]))
    assert upload.encode().hex() == out["upload_request"]
    assert len(upload.reports) == len(spec["measurements"])

    vdaf = VDAFS[name][0]
    task_id, task = _task_id(name), _veil_task(name)
    ctx = vdaf_context(V19, task_id)
    verify_key = secrets.token_bytes(vdaf.VERIFY_KEY_SIZE)
    leader_key, helper_key = _keypair("leader"), _keypair("helper")
    agg_shares = [vdaf.agg_init(None), vdaf.agg_init(None)]
    for report in upload.reports:
        meta = report.metadata
        assert meta.time == IN["time_ms"] // 1000 // IN["time_precision"]  # in time precisions
        assert meta.public_extensions == (Extension(0xFF01, b"public"),)
        shares = []
        for agg_id, (role, keypair, ct, private) in enumerate(
            [
                (Role.LEADER, leader_key, report.leader_encrypted_input_share, b"for the leader"),
                (Role.HELPER, helper_key, report.helper_encrypted_input_share, b"for the helper"),
            ]
        ):
            plain = open_input_share(
                V19, keypair, role, task_id, task, meta, report.public_share, ct
            )
            assert plain.private_extensions == (Extension(0xFF02 + agg_id, private),)
            shares.append(vdaf.decode_input_share(agg_id, plain.payload))
        public_share = vdaf.decode_public_share(report.public_share)
        states, verifier_shares = zip(
            *(
                vdaf.verify_init(verify_key, ctx, i, None, meta.report_id, public_share, shares[i])
                for i in range(2)
            ),
            strict=True,
        )
        message = vdaf.verifier_shares_to_message(ctx, None, verifier_shares)
        for i in range(2):
            out_share = vdaf.verify_next(ctx, states[i], message)
            agg_shares[i] = vdaf.agg_update(None, agg_shares[i], out_share)
    result = vdaf.unshard(None, agg_shares, len(upload.reports))
    measurements = spec["measurements"]
    if name == "histogram":
        expected: Any = [measurements.count(b) for b in range(IN["histogram_length"])]
    else:
        expected = sum(measurements)
    assert result == expected


def test_their_shares_do_not_open_under_another_task_or_draft() -> None:
    report = UploadRequest.decode(bytes.fromhex(OUT["tasks"]["count"]["upload_request"])).reports[0]
    task_id, task = _task_id("count"), _veil_task("count")
    args = (report.metadata, report.public_share, report.leader_encrypted_input_share)
    open_input_share(V19, _keypair("leader"), Role.LEADER, task_id, task, *args)
    other_task = _veil_task("sum")
    for version, tid, t in [
        (DapVersion.DAP_18, task_id, task),  # the info string says dap-19
        (V19, _task_id("sum"), task),
        (V19, task_id, other_task),
    ]:
        with pytest.raises(HpkeError):
            open_input_share(version, _keypair("leader"), Role.LEADER, tid, t, *args)
