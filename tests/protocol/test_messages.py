"""veil.messages and veil.messages.wire: the constants, the ciphertext
encoding at rest, the protobuf conversions, and reports built without the
network by veil.client.prepare_report."""

from __future__ import annotations

import pytest

from veil.client import prepare_report, prepare_reports, seal_report
from veil.hpke import (
    ROLE_HELPER,
    ROLE_LEADER,
    HpkeConfig,
    generate_keypair,
    input_share_info,
    open_,
)
from veil.messages import (
    ENC_SIZE,
    REPORT_ID_SIZE,
    Ciphertext,
    MessageError,
    Report,
    ReportBatch,
    vdaf_ctx,
)
from veil.messages.wire import (
    ciphertext_from_pb,
    hpke_configs_from_pb,
    hpke_configs_to_pb,
    report_batch_from_upload,
    report_from_pb,
    report_to_pb,
    reports_from_upload,
    upload_request,
)
from veil.protocol.v1 import leader_pb2, messages_pb2
from veil.task import DpSpec, VdafSpec, new_task
from veil.vdaf.batch.prio3 import BatchPrio3

FILES = new_task(
    VdafSpec("sum", max_measurement=100),
    "127.0.0.1:1",
    "127.0.0.1:2",
    min_batch_size=1,
    dp=DpSpec("none"),
)
TASK = FILES.client
LEADER, HELPER = generate_keypair(1), generate_keypair(2)


def test_vdaf_ctx_is_the_prefix_and_the_task_id() -> None:
    assert vdaf_ctx(TASK.task_id) == b"veil-v1" + TASK.task_id


def test_ciphertext_bytes_round_trip_and_short_input() -> None:
    ct = Ciphertext(7, bytes(range(ENC_SIZE)), b"payload")
    assert Ciphertext.from_bytes(ct.to_bytes()) == ct
    assert Ciphertext.from_bytes(Ciphertext(1, b"e" * ENC_SIZE, b"").to_bytes()).payload == b""
    with pytest.raises(MessageError):
        Ciphertext.from_bytes(b"\x01" + b"e" * (ENC_SIZE - 1))


def test_report_protobuf_round_trip() -> None:
    report = prepare_report(TASK, 42, LEADER.config, HELPER.config, 7200)
    assert report_from_pb(report_to_pb(report), "r") == report
    request = upload_request(TASK.task_id, [report, report])
    parsed = leader_pb2.UploadRequest.FromString(request.SerializeToString())
    assert parsed.task_id == TASK.task_id
    assert reports_from_upload(parsed) == [report, report]


def test_an_upload_by_columns_holds_its_reports_in_order() -> None:
    reports = [prepare_report(TASK, v, LEADER.config, HELPER.config, 7200) for v in (1, 2, 3)]
    request = upload_request(TASK.task_id, reports)
    batch = report_batch_from_upload(
        leader_pb2.UploadRequest.FromString(request.SerializeToString())
    )
    assert len(batch) == 3
    assert [batch.report(i) for i in range(3)] == reports
    assert batch == ReportBatch.of(reports)
    assert batch.leader_cts() == [r.leader_ct.to_bytes() for r in reports]
    assert batch.helper_cts() == [r.helper_ct.to_bytes() for r in reports]
    assert len(report_batch_from_upload(leader_pb2.UploadRequest())) == 0


def test_an_upload_by_columns_refuses_a_config_id_beyond_one_byte_as_report_by_report() -> None:
    report = prepare_report(TASK, 1, LEADER.config, HELPER.config, 7200)
    for side in ("leader_encrypted_input_share", "helper_encrypted_input_share"):
        request = upload_request(TASK.task_id, [report, report, report])
        getattr(request.reports[1], side).config_id = 300
        getattr(request.reports[2], side).config_id = 256
        with pytest.raises(MessageError) as by_report:
            reports_from_upload(request)
        with pytest.raises(MessageError) as by_column:
            report_batch_from_upload(request)
        assert (
            str(by_column.value)
            == str(by_report.value)
            == ("report 1: HPKE config id 300 is out of range")
        )


def test_ciphertext_config_id_beyond_one_byte_is_refused() -> None:
    with pytest.raises(MessageError, match="report 3: HPKE config id 256"):
        ciphertext_from_pb(messages_pb2.HpkeCiphertext(config_id=256), "report 3")


def test_hpke_configs_keep_the_supported_suite_and_refuse_malformed_ones() -> None:
    pb = hpke_configs_to_pb([LEADER.config])
    pb.configs.add(config_id=9, kem_id=0x0010, kdf_id=1, aead_id=1, public_key=b"p" * 65)
    assert hpke_configs_from_pb(pb) == [LEADER.config]
    bad = messages_pb2.HpkeConfigList()
    bad.configs.add(config_id=3, kem_id=0x20, kdf_id=1, aead_id=1, public_key=b"short")
    with pytest.raises(MessageError, match="HPKE config"):
        hpke_configs_from_pb(bad)


def test_prepared_reports_open_with_each_aggregators_key_and_verify() -> None:
    batch = BatchPrio3(TASK.vdaf.instantiate())
    reports = prepare_reports(TASK, [3, 100], LEADER.config, HELPER.config, 7265, batch=batch)
    assert len({r.report_id for r in reports}) == 2
    vdaf = batch.vdaf
    key = bytes(vdaf.VERIFY_KEY_SIZE)
    values = []
    for r in reports:
        assert len(r.report_id) == REPORT_ID_SIZE
        assert r.time == 7200  # rounded down to the task's time_precision
        shares = [
            open_(kp, ct, input_share_info(role, TASK.task_id, r.report_id, r.time, r.public_share))
            for kp, ct, role in (
                (LEADER, r.leader_ct, ROLE_LEADER),
                (HELPER, r.helper_ct, ROLE_HELPER),
            )
        ]
        ctx = vdaf_ctx(TASK.task_id)
        public = vdaf.decode_public_share(r.public_share)
        states, verifier_shares = zip(
            *(
                vdaf.verify_init(
                    key, ctx, j, None, r.report_id, public, vdaf.decode_input_share(j, shares[j])
                )
                for j in (0, 1)
            ),
            strict=True,
        )
        message = vdaf.verifier_shares_to_message(None, ctx, list(verifier_shares))
        outs = [vdaf.verify_next(ctx, s, message) for s in states]
        agg_shares = [vdaf.agg_update(None, vdaf.agg_init(None), o) for o in outs]
        values.append(vdaf.unshard(None, agg_shares, 1))
    assert values == [3, 100]


def test_prepare_refuses_an_invalid_measurement() -> None:
    with pytest.raises(ValueError):
        prepare_report(TASK, 101, LEADER.config, HELPER.config, 0)


def test_seal_report_binds_the_given_task_id() -> None:
    other = bytes(32)
    r = seal_report(other, bytes(16), 0, b"ps", b"l", b"h", LEADER.config, HELPER.config)
    assert isinstance(r, Report)
    info = input_share_info(ROLE_LEADER, other, bytes(16), 0, b"ps")
    assert open_(LEADER, r.leader_ct, info) == b"l"


def test_config_ids_in_a_config_are_one_byte() -> None:
    with pytest.raises(ValueError):
        HpkeConfig(256, b"k" * 32)
