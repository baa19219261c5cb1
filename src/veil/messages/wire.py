"""veil's message values to and from the generated protobuf classes.

The one place where `veil.messages` values meet the generated code of
protos/veil/protocol/v1: the client, the leader's and helper's services and
the collector convert here, so a field is mapped once. Decoding checks what
the protobuf types cannot say (a config id fits in one byte); the logic
checks the rest (sizes, times) where it decides what to do about it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from veil.messages import SUITE_IDS, Ciphertext, HpkeConfig, MessageError, Report, ReportBatch
from veil.protocol.v1 import leader_pb2, messages_pb2


def ciphertext_to_pb(ct: Ciphertext) -> messages_pb2.HpkeCiphertext:
    """The HpkeCiphertext message of `ct`."""
    return messages_pb2.HpkeCiphertext(config_id=ct.config_id, enc=ct.enc, payload=ct.payload)


def ciphertext_from_pb(msg: messages_pb2.HpkeCiphertext, what: str) -> Ciphertext:
    """Raises MessageError, naming `what`, on a config id outside 0..255."""
    if msg.config_id > 255:
        raise MessageError(f"{what}: HPKE config id {msg.config_id} is out of range")
    return Ciphertext(msg.config_id, msg.enc, msg.payload)


def report_to_pb(report: Report) -> leader_pb2.Report:
    """The Report message of `report` (leader.proto)."""
    return leader_pb2.Report(
        metadata=messages_pb2.ReportMetadata(report_id=report.report_id, time=report.time),
        public_share=report.public_share,
        leader_encrypted_input_share=ciphertext_to_pb(report.leader_ct),
        helper_encrypted_input_share=ciphertext_to_pb(report.helper_ct),
        token=report.token,
    )


def report_from_pb(msg: leader_pb2.Report, what: str) -> Report:
    """The report of a Report message; raises MessageError naming `what`."""
    return Report(
        msg.metadata.report_id,
        msg.metadata.time,
        msg.public_share,
        ciphertext_from_pb(msg.leader_encrypted_input_share, what),
        ciphertext_from_pb(msg.helper_encrypted_input_share, what),
        msg.token,
    )


def upload_request(task_id: bytes, reports: Iterable[Report]) -> leader_pb2.UploadRequest:
    """The leader's UploadReports request for `reports` of one task."""
    return leader_pb2.UploadRequest(task_id=task_id, reports=[report_to_pb(r) for r in reports])


def reports_from_upload(request: leader_pb2.UploadRequest) -> list[Report]:
    """The reports of an UploadReports request, each named by its index in errors."""
    return [report_from_pb(r, f"report {i}") for i, r in enumerate(request.reports)]


def report_batch_from_upload(request: leader_pb2.UploadRequest) -> ReportBatch:
    """The reports of an UploadReports request by columns, with the same
    check and the same error, naming the report by its index, as
    `reports_from_upload`."""
    report_ids: list[bytes] = []
    times: list[int] = []
    public_shares: list[bytes] = []
    leader_ids: list[int] = []
    leader_encs: list[bytes] = []
    leader_payloads: list[bytes] = []
    helper_ids: list[int] = []
    helper_encs: list[bytes] = []
    helper_payloads: list[bytes] = []
    tokens: list[bytes] = []
    # One pass, each submessage read once: a protobuf submessage is a new
    # Python object at every access (here 2.2 us a report against 5.2 for
    # the Report values).
    for r in request.reports:
        meta = r.metadata
        leader = r.leader_encrypted_input_share
        helper = r.helper_encrypted_input_share
        report_ids.append(meta.report_id)
        times.append(meta.time)
        public_shares.append(r.public_share)
        leader_ids.append(leader.config_id)
        leader_encs.append(leader.enc)
        leader_payloads.append(leader.payload)
        helper_ids.append(helper.config_id)
        helper_encs.append(helper.enc)
        helper_payloads.append(helper.payload)
        tokens.append(r.token)
    if max(leader_ids, default=0) > 255 or max(helper_ids, default=0) > 255:
        reports_from_upload(request)  # raises, naming the first report at fault
    return ReportBatch(
        report_ids,
        times,
        public_shares,
        leader_ids,
        leader_encs,
        leader_payloads,
        helper_ids,
        helper_encs,
        helper_payloads,
        tokens,
    )


def hpke_config_to_pb(config: HpkeConfig) -> messages_pb2.HpkeConfig:
    """The HpkeConfig message of `config`."""
    return messages_pb2.HpkeConfig(
        config_id=config.config_id,
        kem_id=config.kem_id,
        kdf_id=config.kdf_id,
        aead_id=config.aead_id,
        public_key=config.public_key,
    )


def hpke_configs_to_pb(configs: Sequence[HpkeConfig]) -> messages_pb2.HpkeConfigList:
    """An aggregator's answer to GetHpkeConfig."""
    return messages_pb2.HpkeConfigList(configs=[hpke_config_to_pb(c) for c in configs])


def hpke_configs_from_pb(msg: messages_pb2.HpkeConfigList) -> list[HpkeConfig]:
    """The configs of an aggregator's answer that use veil's one suite
    (others are left out: veil cannot seal to them); raises MessageError on
    one that is malformed (config id outside 0..255, key of the wrong size)."""
    out = []
    for c in msg.configs:
        if (c.kem_id, c.kdf_id, c.aead_id) != SUITE_IDS:
            continue
        try:
            out.append(HpkeConfig(c.config_id, c.public_key, c.kem_id, c.kdf_id, c.aead_id))
        except ValueError as e:
            raise MessageError(f"HPKE config: {e}") from None
    return out
