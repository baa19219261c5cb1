"""DAP's messages against the draft's text (draft-ietf-ppm-dap-18, the
structure -19 shares): each encoding written out field by field from the
definitions, every message round-tripped over generated values, and every
decoder given truncated, oversized, trailing and unknown-enum input."""

from __future__ import annotations

import struct
from collections.abc import Callable
from hashlib import sha256
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from veil.dap.codec import DecodeError
from veil.dap.jobs import (
    AggregateShare,
    AggregateShareAad,
    AggregateShareReq,
    AggregationJobContinueReq,
    AggregationJobInitReq,
    AggregationJobResp,
    BatchSelector,
    CollectionJobReq,
    CollectionJobResp,
    Query,
    ReportShare,
    VerifyContinue,
    VerifyInit,
    VerifyResp,
    VerifyRespType,
    batch_id_extension,
    continue_resp,
)
from veil.dap.messages import (
    BatchMode,
    Extension,
    HpkeConfig,
    HpkeConfigList,
    InputShareAad,
    Interval,
    PlaintextInputShare,
    Report,
    ReportMetadata,
    ReportUploadStatus,
    TaskConfiguration,
    UploadErrors,
    UploadRequest,
    VdafConfig,
    batch_checksum,
    extensions_in_order,
    task_interval_extension,
)
from veil.dap.versions import DapVersion, ReportError
from veil.messages import Ciphertext

V18, V19 = DapVersion.DAP_18, DapVersion.DAP_19


def u8(v: int) -> bytes:
    return struct.pack(">B", v)


def u16(v: int) -> bytes:
    return struct.pack(">H", v)


def u32(v: int) -> bytes:
    return struct.pack(">I", v)


def u64(v: int) -> bytes:
    return struct.pack(">Q", v)


RID = bytes(range(16))
TID = bytes(range(100, 132))
CT = Ciphertext(7, b"E" * 32, b"ciphertext")
CT_BYTES = u8(7) + u16(32) + b"E" * 32 + u32(10) + b"ciphertext"
TASK = TaskConfiguration(
    task_info=b"info",
    leader_aggregator_endpoint=b"https://leader.example/",
    helper_aggregator_endpoint=b"https://helper.example/dap/",
    time_precision=3600,
    min_batch_size=100,
    batch_mode=BatchMode.TIME_INTERVAL,
    vdaf_type=4,
    vdaf_configuration=VdafConfig("Prio3Histogram", (("length", 10), ("chunk_length", 3))).encode(),
    extensions=(task_interval_extension(Interval(480000, 24)),),
)
TASK_BYTES = (
    u8(4)
    + b"info"
    + u16(23)
    + b"https://leader.example/"
    + u16(27)
    + b"https://helper.example/dap/"
    + u64(3600)
    + u64(100)
    + u8(1)
    + u16(0)
    + u32(4)
    + u16(8)
    + u32(10)
    + u32(3)
    + u16(20)
    + u16(1)
    + u16(16)
    + u64(480000)
    + u64(24)
)


# -- encodings written from the draft's definitions -----------------------------


def test_hpke_config_list_field_by_field() -> None:
    pk = bytes(range(32))
    configs = HpkeConfigList(
        (HpkeConfig(194, 0x0020, 1, 1, pk), HpkeConfig(17, 0x0010, 1, 3, b"\x04" * 65))
    )
    one = u8(194) + u16(0x20) + u16(1) + u16(1) + u16(32) + pk
    two = u8(17) + u16(0x10) + u16(1) + u16(3) + u16(65) + b"\x04" * 65
    assert configs.encode() == u16(len(one) + len(two)) + one + two
    assert HpkeConfigList.decode(configs.encode()) == configs
    # A client picks the first config of veil's suite.
    found = configs.first_supported()
    assert found is not None and found.config_id == 194 and found.public_key == pk
    assert HpkeConfigList((configs.configs[1],)).first_supported() is None


def test_report_field_by_field() -> None:
    report = Report(
        ReportMetadata(RID, 17419860, (Extension(5, b"tok"),)),
        b"public",
        CT,
        Ciphertext(2, b"F" * 32, b"x"),
    )
    expected = (
        RID
        + u64(17419860)
        + u16(7)
        + u16(5)
        + u16(3)
        + b"tok"
        + u32(6)
        + b"public"
        + CT_BYTES
        + u8(2)
        + u16(32)
        + b"F" * 32
        + u32(1)
        + b"x"
    )
    assert report.encode() == expected
    assert Report.decode(expected) == report
    # UploadRequest: reports back to back, no length of its own.
    assert UploadRequest((report, report)).encode() == expected * 2
    assert UploadRequest.decode(expected * 2) == UploadRequest((report, report))


def test_plaintext_input_share_and_aad_field_by_field() -> None:
    share = PlaintextInputShare((), b"leader share")
    assert share.encode() == u16(0) + u32(12) + b"leader share"
    metadata = ReportMetadata(RID, 5)
    aad = InputShareAad(TID, TASK, metadata, b"ps")
    assert TASK.encode(V19) == TASK_BYTES
    assert aad.encode(V19) == TID + TASK_BYTES + RID + u64(5) + u16(0) + u32(2) + b"ps"
    assert InputShareAad.decode(aad.encode(V19), V19) == aad
    assert TASK.task_interval() == Interval(480000, 24)


def test_task_info_may_be_empty_in_19_only() -> None:
    empty = TaskConfiguration(b"", b"l", b"h", 1, 1, BatchMode.LEADER_SELECTED, 1, b"")
    encoded = empty.encode(V19)
    assert encoded[:1] == b"\x00"
    assert TaskConfiguration.decode(encoded, V19) == empty
    with pytest.raises(DecodeError, match=r"TaskConfiguration.task_info: length 0 is below"):
        TaskConfiguration.decode(encoded, V18)
    with pytest.raises(ValueError, match="task_info"):
        empty.encode(V18)


@pytest.mark.parametrize(
    ("config", "encoded"),
    [
        (VdafConfig("Prio3Count"), b""),
        (VdafConfig("Prio3Sum", (("max_measurement", 255),)), u64(255)),
        (
            VdafConfig("Prio3SumVec", (("length", 4), ("max_measurement", 7), ("chunk_length", 2))),
            u32(4) + u64(7) + u32(2),
        ),
        (
            VdafConfig("Prio3Histogram", (("length", 10), ("chunk_length", 3))),
            u32(10) + u32(3),
        ),
        (
            VdafConfig(
                "Prio3MultihotCountVec", (("length", 5), ("chunk_length", 2), ("max_weight", 2))
            ),
            u32(5) + u32(2) + u64(2),
        ),
        (VdafConfig("Poplar1", (("bits", 64),)), u16(64)),
    ],
)
def test_vdaf_configurations(config: VdafConfig, encoded: bytes) -> None:
    assert config.encode() == encoded
    assert VdafConfig.decode(config.vdaf_type, encoded) == config
    with pytest.raises(DecodeError, match="after the end"):
        VdafConfig.decode(config.vdaf_type, encoded + b"\x00")
    if encoded:
        with pytest.raises(DecodeError, match="needs"):
            VdafConfig.decode(config.vdaf_type, encoded[:-1])


def test_vdaf_type_codepoints() -> None:
    names = ["Prio3Count", "Prio3Sum", "Prio3SumVec", "Prio3Histogram", "Prio3MultihotCountVec"]
    assert [VdafConfig(n).vdaf_type for n in names] == [1, 2, 3, 4, 5]
    assert VdafConfig("Poplar1").vdaf_type == 6
    with pytest.raises(DecodeError, match="0x00000007 is not supported"):
        VdafConfig.decode(7, b"")
    with pytest.raises(ValueError, match="takes length, chunk_length"):
        VdafConfig("Prio3Histogram", (("length", 3),)).encode()


def test_aggregation_job_init_req_field_by_field() -> None:
    init = VerifyInit(ReportShare(ReportMetadata(RID, 9), b"", CT), b"ping")
    batch_id = b"B" * 32
    req = AggregationJobInitReq(3, b"", (batch_id_extension(batch_id),), (init, init))
    init_bytes = RID + u64(9) + u16(0) + u32(0) + CT_BYTES + u32(4) + b"ping"
    expected = u8(3) + u32(0) + u16(36) + u16(1) + u16(32) + batch_id + init_bytes * 2
    assert req.encode() == expected
    assert AggregationJobInitReq.decode(expected) == req
    assert req.batch_id() == batch_id
    bad = AggregationJobInitReq(3, b"", (Extension(1, b"short"),), ())
    with pytest.raises(DecodeError, match="leader_selected_batch_id has 5 bytes"):
        bad.batch_id()


@pytest.mark.parametrize(("version", "replayed", "unknown_key"), [(V18, 2, None), (V19, 2, 9)])
def test_aggregation_job_resp_and_report_errors(
    version: DapVersion, replayed: int, unknown_key: int | None
) -> None:
    resps = [
        VerifyResp(RID, VerifyRespType.CONTINUE, b"pong"),
        VerifyResp(RID, VerifyRespType.FINISH),
        VerifyResp(RID, VerifyRespType.REJECT, error=ReportError.REPORT_REPLAYED),
    ]
    expected = RID + u8(0) + u32(4) + b"pong" + RID + u8(1) + RID + u8(2) + u8(replayed)
    resp = AggregationJobResp(tuple(resps))
    assert resp.encode(version) == expected
    assert AggregationJobResp.decode(expected, version) == resp
    key = VerifyResp(RID, VerifyRespType.REJECT, error=ReportError.UNKNOWN_VERIFICATION_KEY_ID)
    if unknown_key is None:
        with pytest.raises(ValueError, match="no code in dap-18"):
            key.encode(version)
    else:
        assert key.encode(version)[-1] == unknown_key


@given(st.binary(min_size=16, max_size=16), st.binary(min_size=1, max_size=40))
def test_a_continue_written_out_is_verify_resps_encoding(report_id: bytes, payload: bytes) -> None:
    for version in DapVersion:
        expected = VerifyResp(report_id, VerifyRespType.CONTINUE, payload).encode(version)
        assert continue_resp(report_id, payload) == expected
    with pytest.raises(ValueError):
        continue_resp(report_id, b"")  # a continue carries its message
    with pytest.raises(ValueError):
        continue_resp(report_id[:15], payload)


def test_a_plaintext_input_share_without_extensions_is_read_as_the_text_says() -> None:
    assert PlaintextInputShare.decode(u16(0) + u32(2) + b"ab") == PlaintextInputShare((), b"ab")
    for bad in (u16(0) + u32(0), u16(0) + u32(3) + b"ab", u16(0) + u32(1) + b"ab", u16(0)):
        with pytest.raises(DecodeError):
            PlaintextInputShare.decode(bad)
    with_one = u16(4) + u16(9) + u16(0) + u32(1) + b"x"
    assert PlaintextInputShare.decode(with_one) == PlaintextInputShare((Extension(9),), b"x")


def test_report_error_codes_differ_between_the_drafts() -> None:
    # invalid_message is 8 in -18 and 7 in -19; 7 is task_expired in -18.
    status = UploadErrors((ReportUploadStatus(RID, ReportError.INVALID_MESSAGE),))
    assert status.encode(V18) == RID + u8(8)
    assert status.encode(V19) == RID + u8(7)
    assert UploadErrors.decode(RID + u8(7), V18).statuses[0].error is ReportError.TASK_EXPIRED
    assert UploadErrors.decode(RID + u8(7), V19).statuses[0].error is ReportError.INVALID_MESSAGE
    for version, unknown in [(V18, 12), (V19, 11)]:
        with pytest.raises(DecodeError, match=f"{unknown} is not a ReportError of"):
            UploadErrors.decode(RID + u8(unknown), version)
        with pytest.raises(DecodeError, match="0 is not a ReportError"):
            UploadErrors.decode(RID + u8(0), version)


def test_continue_req_field_by_field() -> None:
    req = AggregationJobContinueReq(1, (VerifyContinue(RID, b"m"),))
    assert req.encode() == u16(1) + RID + u32(1) + b"m"
    assert AggregationJobContinueReq.decode(req.encode()) == req


def test_collection_messages_field_by_field() -> None:
    interval = Interval(16595440, 1)
    query = Query(BatchMode.TIME_INTERVAL, interval)
    req = CollectionJobReq(query, b"", ())
    req_bytes = u8(1) + u16(16) + u64(16595440) + u64(1) + u32(0) + u16(0)
    assert req.encode() == req_bytes
    assert CollectionJobReq.decode(req_bytes) == req
    leader_selected = CollectionJobReq(Query(BatchMode.LEADER_SELECTED), b"p")
    assert leader_selected.encode() == u8(2) + u16(0) + u32(1) + b"p" + u16(0)
    resp = CollectionJobResp(1000, interval, CT, CT)
    assert resp.encode() == u64(1000) + u64(16595440) + u64(1) + CT_BYTES * 2
    assert CollectionJobResp.decode(resp.encode()) == resp
    checksum = bytes(range(32))
    share_req = AggregateShareReq(
        req, BatchSelector(BatchMode.TIME_INTERVAL, batch_interval=interval), 1000, checksum
    )
    selector = u8(1) + u16(16) + u64(16595440) + u64(1)
    assert share_req.encode() == req_bytes + selector + u64(1000) + checksum
    assert AggregateShareReq.decode(share_req.encode()) == share_req
    by_id = BatchSelector(BatchMode.LEADER_SELECTED, batch_id=b"I" * 32)
    assert by_id.encode() == u8(2) + u16(32) + b"I" * 32
    assert AggregateShare(CT).encode() == CT_BYTES
    aad = AggregateShareAad(TID, TASK, req)
    assert aad.encode(V19) == TID + TASK_BYTES + req_bytes
    assert AggregateShareAad.decode(aad.encode(V19), V19) == aad


def test_batch_checksum_is_the_xor_of_the_report_ids_hashes() -> None:
    a, b = b"a" * 16, b"b" * 16
    ha, hb = sha256(a).digest(), sha256(b).digest()
    assert batch_checksum([]) == bytes(32)
    assert batch_checksum([a]) == ha
    assert batch_checksum([a, b]) == bytes(x ^ y for x, y in zip(ha, hb, strict=True))
    assert batch_checksum([a, b, a]) == hb


def test_extension_order() -> None:
    assert extensions_in_order([Extension(1), Extension(2), Extension(40)])
    assert not extensions_in_order([Extension(2), Extension(1)])
    assert not extensions_in_order([Extension(2), Extension(2)])
    assert extensions_in_order([])


# -- round trips over generated values ------------------------------------------

ids16 = st.binary(min_size=16, max_size=16)
ids32 = st.binary(min_size=32, max_size=32)
u64s = st.integers(0, 2**64 - 1)
extensions = st.lists(
    st.builds(Extension, st.integers(0, 2**16 - 1), st.binary(max_size=20)), max_size=3
).map(tuple)
ciphertexts = st.builds(
    Ciphertext,
    st.integers(0, 255),
    st.binary(min_size=1, max_size=40),
    st.binary(min_size=1, max_size=60),
)
metadata = st.builds(ReportMetadata, ids16, u64s, extensions)
intervals = st.builds(Interval, u64s, u64s)
queries = st.one_of(
    st.builds(Query, st.just(BatchMode.TIME_INTERVAL), intervals),
    st.just(Query(BatchMode.LEADER_SELECTED)),
)
collection_reqs = st.builds(CollectionJobReq, queries, st.binary(max_size=20), extensions)
selectors = st.one_of(
    st.builds(BatchSelector, st.just(BatchMode.TIME_INTERVAL), intervals),
    st.builds(BatchSelector, st.just(BatchMode.LEADER_SELECTED), st.none(), ids32),
)
tasks = st.builds(
    TaskConfiguration,
    st.binary(min_size=1, max_size=255),
    st.binary(min_size=1, max_size=40),
    st.binary(min_size=1, max_size=40),
    u64s,
    u64s,
    st.sampled_from(BatchMode),
    st.integers(0, 2**32 - 1),
    st.binary(max_size=30),
    st.binary(max_size=10),
    extensions,
)
reports = st.builds(Report, metadata, st.binary(max_size=50), ciphertexts, ciphertexts)
verify_inits = st.builds(
    VerifyInit,
    st.builds(ReportShare, metadata, st.binary(max_size=30), ciphertexts),
    st.binary(min_size=1, max_size=30),
)
errors_of = {v: [e for e in ReportError if e is not ReportError.RESERVED] for v in DapVersion}


def _resps(version: DapVersion) -> st.SearchStrategy[VerifyResp]:
    usable = [e for e in errors_of[version] if _has_code(version, e)]
    return st.one_of(
        st.builds(
            VerifyResp, ids16, st.just(VerifyRespType.CONTINUE), st.binary(min_size=1, max_size=30)
        ),
        st.builds(VerifyResp, ids16, st.just(VerifyRespType.FINISH)),
        st.builds(
            VerifyResp,
            ids16,
            st.just(VerifyRespType.REJECT),
            st.just(b""),
            st.sampled_from(usable),
        ),
    )


def _has_code(version: DapVersion, error: ReportError) -> bool:
    try:
        UploadErrors((ReportUploadStatus(RID, error),)).encode(version)
    except ValueError:
        return False
    return True


@given(st.data())
def test_every_message_round_trips(data: st.DataObject) -> None:
    version = data.draw(st.sampled_from(DapVersion))
    cases: list[tuple[Any, Callable[[bytes], Any], Callable[[Any], bytes]]] = [
        (
            data.draw(
                st.lists(
                    st.builds(
                        HpkeConfig,
                        st.integers(0, 255),
                        st.integers(0, 2**16 - 1),
                        st.integers(0, 2**16 - 1),
                        st.integers(0, 2**16 - 1),
                        st.binary(min_size=3, max_size=70),
                    ),
                    min_size=1,
                    max_size=4,
                    unique_by=lambda c: c.id,
                ).map(lambda cs: HpkeConfigList(tuple(cs)))
            ),
            HpkeConfigList.decode,
            lambda m: m.encode(),
        ),
        (data.draw(reports), Report.decode, lambda m: m.encode()),
        (
            data.draw(st.lists(reports, max_size=3).map(lambda r: UploadRequest(tuple(r)))),
            UploadRequest.decode,
            lambda m: m.encode(),
        ),
        (
            data.draw(
                st.lists(
                    st.builds(
                        ReportUploadStatus,
                        ids16,
                        st.sampled_from([e for e in errors_of[version] if _has_code(version, e)]),
                    ),
                    max_size=4,
                ).map(lambda s: UploadErrors(tuple(s)))
            ),
            lambda b: UploadErrors.decode(b, version),
            lambda m: m.encode(version),
        ),
        (
            data.draw(
                st.builds(PlaintextInputShare, extensions, st.binary(min_size=1, max_size=40))
            ),
            PlaintextInputShare.decode,
            lambda m: m.encode(),
        ),
        (
            data.draw(tasks),
            lambda b: TaskConfiguration.decode(b, version),
            lambda m: m.encode(version),
        ),
        (
            data.draw(st.builds(InputShareAad, ids32, tasks, metadata, st.binary(max_size=30))),
            lambda b: InputShareAad.decode(b, version),
            lambda m: m.encode(version),
        ),
        (
            data.draw(
                st.builds(
                    AggregationJobInitReq,
                    st.integers(0, 255),
                    st.binary(max_size=20),
                    extensions,
                    st.lists(verify_inits, max_size=3).map(tuple),
                )
            ),
            AggregationJobInitReq.decode,
            lambda m: m.encode(),
        ),
        (
            data.draw(
                st.lists(_resps(version), max_size=4).map(lambda r: AggregationJobResp(tuple(r)))
            ),
            lambda b: AggregationJobResp.decode(b, version),
            lambda m: m.encode(version),
        ),
        (
            data.draw(
                st.builds(
                    AggregationJobContinueReq,
                    st.integers(0, 2**16 - 1),
                    st.lists(
                        st.builds(VerifyContinue, ids16, st.binary(min_size=1, max_size=20)),
                        max_size=3,
                    ).map(tuple),
                )
            ),
            AggregationJobContinueReq.decode,
            lambda m: m.encode(),
        ),
        (data.draw(collection_reqs), CollectionJobReq.decode, lambda m: m.encode()),
        (
            data.draw(st.builds(CollectionJobResp, u64s, intervals, ciphertexts, ciphertexts)),
            CollectionJobResp.decode,
            lambda m: m.encode(),
        ),
        (
            data.draw(st.builds(AggregateShareReq, collection_reqs, selectors, u64s, ids32)),
            AggregateShareReq.decode,
            lambda m: m.encode(),
        ),
        (
            data.draw(st.builds(AggregateShare, ciphertexts)),
            AggregateShare.decode,
            lambda m: m.encode(),
        ),
        (
            data.draw(st.builds(AggregateShareAad, ids32, tasks, collection_reqs)),
            lambda b: AggregateShareAad.decode(b, version),
            lambda m: m.encode(version),
        ),
    ]
    for message, decode, encode in cases:
        encoded = encode(message)
        assert decode(encoded) == message
        assert encode(decode(encoded)) == encoded


# -- hostile input ----------------------------------------------------------------

REPORT = Report(ReportMetadata(RID, 5, (Extension(1, b"x"),)), b"ps", CT, CT)
COLLECT = CollectionJobReq(Query(BatchMode.TIME_INTERVAL, Interval(10, 2)), b"p", ())
# Messages whose every strict prefix is malformed (no repeated tail).
WHOLE: list[tuple[str, bytes, Callable[[bytes], Any]]] = [
    (
        "HpkeConfigList",
        HpkeConfigList((HpkeConfig(1, 0x20, 1, 1, b"k" * 32),)).encode(),
        HpkeConfigList.decode,
    ),
    ("Report", REPORT.encode(), Report.decode),
    ("PlaintextInputShare", PlaintextInputShare((), b"p").encode(), PlaintextInputShare.decode),
    ("TaskConfiguration", TASK_BYTES, lambda b: TaskConfiguration.decode(b, V19)),
    (
        "InputShareAad",
        InputShareAad(TID, TASK, REPORT.metadata, b"").encode(V18),
        lambda b: InputShareAad.decode(b, V18),
    ),
    ("CollectionJobReq", COLLECT.encode(), CollectionJobReq.decode),
    (
        "CollectionJobResp",
        CollectionJobResp(1, Interval(1, 1), CT, CT).encode(),
        CollectionJobResp.decode,
    ),
    (
        "AggregateShareReq",
        AggregateShareReq(
            COLLECT, BatchSelector(BatchMode.LEADER_SELECTED, batch_id=TID), 3, TID
        ).encode(),
        AggregateShareReq.decode,
    ),
    ("AggregateShare", AggregateShare(CT).encode(), AggregateShare.decode),
    (
        "AggregateShareAad",
        AggregateShareAad(TID, TASK, COLLECT).encode(V19),
        lambda b: AggregateShareAad.decode(b, V19),
    ),
]
# Messages that end in a sequence read to the end of the body: a prefix cut
# at an element's boundary is a shorter message, any other cut is refused.
SEQUENCES: list[tuple[str, Any, Callable[[bytes], Any], Callable[[Any], bytes]]] = [
    ("UploadRequest", UploadRequest((REPORT, REPORT)), UploadRequest.decode, lambda m: m.encode()),
    (
        "AggregationJobInitReq",
        AggregationJobInitReq(
            1,
            b"",
            (),
            (VerifyInit(ReportShare(REPORT.metadata, b"", CT), b"m"),) * 2,
        ),
        AggregationJobInitReq.decode,
        lambda m: m.encode(),
    ),
    (
        "AggregationJobResp",
        AggregationJobResp(
            (
                VerifyResp(RID, VerifyRespType.CONTINUE, b"m"),
                VerifyResp(RID, VerifyRespType.REJECT, error=ReportError.REPORT_DROPPED),
            )
        ),
        lambda b: AggregationJobResp.decode(b, V19),
        lambda m: m.encode(V19),
    ),
    (
        "AggregationJobContinueReq",
        AggregationJobContinueReq(2, (VerifyContinue(RID, b"m"),) * 2),
        AggregationJobContinueReq.decode,
        lambda m: m.encode(),
    ),
]


@pytest.mark.parametrize(("name", "encoded", "decode"), WHOLE, ids=[w[0] for w in WHOLE])
def test_truncated_and_trailing_input_is_refused(
    name: str, encoded: bytes, decode: Callable[[bytes], Any]
) -> None:
    decode(encoded)
    for cut in range(len(encoded)):
        with pytest.raises(DecodeError, match=name.split(".")[0]):
            decode(encoded[:cut])
    with pytest.raises(DecodeError, match="1 bytes after the end"):
        decode(encoded + b"\x00")


@pytest.mark.parametrize(
    ("name", "message", "decode", "encode"), SEQUENCES, ids=[s[0] for s in SEQUENCES]
)
def test_sequences_refuse_every_cut_inside_an_element(
    name: str, message: Any, decode: Callable[[bytes], Any], encode: Callable[[Any], bytes]
) -> None:
    encoded = encode(message)
    boundaries = set()
    for cut in range(len(encoded) + 1):
        try:
            shorter = decode(encoded[:cut])
        except DecodeError as e:
            assert name in str(e)
            continue
        assert encoded.startswith(encode(shorter)) and len(encode(shorter)) == cut
        boundaries.add(cut)
    assert len(boundaries) == 3  # before the first element, between, after the second
    with pytest.raises(DecodeError, match=name):
        decode(encoded + b"\x00")


@pytest.mark.parametrize(
    ("data", "decode", "error"),
    [
        # Lengths above what is there, or outside the field's bounds.
        (u16(0xFFFF), HpkeConfigList.decode, "length 65535 runs past the end"),
        (u16(9) + b"\x00" * 9, HpkeConfigList.decode, "length 9 is below the minimum 10"),
        (
            u16(18) + (u8(1) + u16(0x20) + u16(1) + u16(1) + u16(0)) * 2,
            HpkeConfigList.decode,
            "HpkeConfig.public_key: length 0 is below the minimum 1",
        ),
        (
            u16(20) + (u8(1) + u16(0x20) + u16(1) + u16(1) + u16(1) + b"k") * 2,
            HpkeConfigList.decode,
            "config id 1 appears twice",
        ),
        (
            RID + u64(0) + u16(0) + u32(0) + u8(1) + u16(0) + u32(1) + b"x",
            Report.decode,
            "Report.leader_encrypted_input_share.enc: length 0 is below the minimum 1",
        ),
        (
            RID + u64(0) + u16(0) + u32(0) + u8(1) + u16(1) + b"e" + u32(0),
            Report.decode,
            "leader_encrypted_input_share.payload: length 0 is below the minimum 1",
        ),
        (
            RID + u64(0) + u16(5) + u16(1) + u16(9) + b"x",
            Report.decode,
            "extension_data: length 9 runs past the end",
        ),
        (u16(0) + u32(0), PlaintextInputShare.decode, "payload: length 0 is below the minimum 1"),
        (RID + u8(3), lambda b: AggregationJobResp.decode(b, V19), "3 is not a VerifyRespType"),
        (
            RID + u8(0) + u32(0),
            lambda b: AggregationJobResp.decode(b, V19),
            "payload: length 0 is below the minimum 1",
        ),
        # Unknown enum values.
        (u8(0) + u16(0) + u32(0) + u16(0), CollectionJobReq.decode, "0 is not a BatchMode"),
        (u8(3) + u16(0) + u32(0) + u16(0), CollectionJobReq.decode, "3 is not a BatchMode"),
        # A batch mode's config of the wrong shape.
        (
            u8(1) + u16(8) + u64(1) + u32(0) + u16(0),
            CollectionJobReq.decode,
            "TimeIntervalQueryConfig.duration: needs 8 bytes, 0 left",
        ),
        (
            u8(2) + u16(1) + b"x" + u32(0) + u16(0),
            CollectionJobReq.decode,
            "CollectionJobReq.config: 1 bytes after the end",
        ),
        (
            COLLECT.encode() + u8(2) + u16(31) + b"i" * 31 + u64(1) + bytes(32),
            AggregateShareReq.decode,
            "LeaderSelectedBatchSelectorConfig.batch_id: needs 32 bytes, 31 left",
        ),
        (
            COLLECT.encode() + u8(1) + u16(17) + bytes(17) + u64(1) + bytes(32),
            AggregateShareReq.decode,
            "TimeIntervalBatchSelectorConfig: 1 bytes after the end",
        ),
        (
            TASK_BYTES.replace(u8(1) + u16(0) + u32(4), u8(9) + u16(0) + u32(4), 1),
            lambda b: TaskConfiguration.decode(b, V19),
            "TaskConfiguration.batch_mode: 9 is not a BatchMode",
        ),
    ],
)
def test_malformed_input_is_refused_by_name(
    data: bytes, decode: Callable[[bytes], Any], error: str
) -> None:
    with pytest.raises(DecodeError, match=error):
        decode(data)


# Each decoder with the encoding of what it returns.
CODECS: list[tuple[Callable[[bytes], Any], Callable[[Any], bytes]]] = [
    (HpkeConfigList.decode, lambda m: m.encode()),
    (Report.decode, lambda m: m.encode()),
    (UploadRequest.decode, lambda m: m.encode()),
    (lambda b: UploadErrors.decode(b, V18), lambda m: m.encode(V18)),
    (PlaintextInputShare.decode, lambda m: m.encode()),
    (lambda b: TaskConfiguration.decode(b, V18), lambda m: m.encode(V18)),
    (lambda b: InputShareAad.decode(b, V19), lambda m: m.encode(V19)),
    (AggregationJobInitReq.decode, lambda m: m.encode()),
    (lambda b: AggregationJobResp.decode(b, V19), lambda m: m.encode(V19)),
    (AggregationJobContinueReq.decode, lambda m: m.encode()),
    (CollectionJobReq.decode, lambda m: m.encode()),
    (CollectionJobResp.decode, lambda m: m.encode()),
    (AggregateShareReq.decode, lambda m: m.encode()),
    (AggregateShare.decode, lambda m: m.encode()),
    (lambda b: AggregateShareAad.decode(b, V18), lambda m: m.encode(V18)),
    (Interval.decode, lambda m: m.encode()),
]


def _decodes_canonically(data: bytes, decode: Callable[[bytes], Any], encode: Any) -> None:
    """`data` is refused with a DecodeError (nothing else escapes), or it is
    the one encoding of what it decodes to."""
    try:
        message = decode(data)
    except DecodeError:
        return
    assert encode(message) == data


@given(st.binary(max_size=300), st.sampled_from(range(len(CODECS))))
def test_arbitrary_bytes_are_refused_or_canonical(data: bytes, which: int) -> None:
    _decodes_canonically(data, *CODECS[which])


@given(st.sampled_from(range(len(WHOLE))), st.data())
def test_flipped_bytes_are_refused_or_canonical(which: int, data: st.DataObject) -> None:
    _, encoded, decode = WHOLE[which]
    at = data.draw(st.integers(0, len(encoded) - 1))
    flipped = bytearray(encoded)
    flipped[at] ^= data.draw(st.integers(1, 255))
    encoders = {
        "HpkeConfigList": lambda m: m.encode(),
        "TaskConfiguration": lambda m: m.encode(V19),
        "InputShareAad": lambda m: m.encode(V18),
        "AggregateShareAad": lambda m: m.encode(V19),
    }
    _decodes_canonically(
        bytes(flipped), decode, encoders.get(WHOLE[which][0], lambda m: m.encode())
    )
