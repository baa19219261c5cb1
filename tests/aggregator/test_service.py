"""The leader's Prio3 aggregation job request, encoded without protobuf's
message objects (veil.aggregator.service.aggregation_job_request_bytes):
the same bytes as the messages serialised, for any field's size and for
the empty and zero values proto3 leaves out."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from veil.aggregator.core import VerifyInitItem
from veil.aggregator.service import aggregation_job_request_bytes
from veil.hpke import Ciphertext
from veil.protocol.v1 import helper_pb2

# Sizes around the varint boundaries of a length (1, 2 and 3 bytes).
_BYTES = st.one_of(
    st.binary(max_size=140),
    st.sampled_from([b"", b"\x00" * 127, b"\x01" * 128, b"\x02" * 16383, b"\x03" * 16384]),
)
_ITEMS = st.builds(
    VerifyInitItem,
    report_id=st.one_of(st.just(b""), st.binary(min_size=16, max_size=16)),
    time=st.one_of(st.just(0), st.integers(0, 2**64 - 1)),
    public_share=_BYTES,
    encrypted_input_share=st.builds(
        Ciphertext, config_id=st.integers(0, 255), enc=_BYTES, payload=_BYTES
    ),
    leader_verifier_share=_BYTES,
    leader_verifier_share_2=st.one_of(st.just(b""), _BYTES),
)


def _with_messages(task_id: bytes, job_id: bytes, items: list[VerifyInitItem]) -> bytes:
    request = helper_pb2.AggregationJobRequest(task_id=task_id, aggregation_job_id=job_id)
    for it in items:
        v = request.verify_inits.add(
            leader_verifier_share=it.leader_verifier_share,
            leader_verifier_share_2=it.leader_verifier_share_2,
        )
        v.report_share.metadata.report_id = it.report_id
        v.report_share.metadata.time = it.time
        v.report_share.public_share = it.public_share
        ct, pb = it.encrypted_input_share, v.report_share.encrypted_input_share
        pb.config_id, pb.enc, pb.payload = ct.config_id, ct.enc, ct.payload
    return request.SerializeToString()


@settings(max_examples=60, deadline=None)
@given(
    task_id=st.one_of(st.just(b""), st.binary(min_size=32, max_size=32)),
    job_id=st.binary(max_size=16),
    items=st.lists(_ITEMS, max_size=4),
)
def test_the_request_is_what_protobuf_writes(
    task_id: bytes, job_id: bytes, items: list[VerifyInitItem]
) -> None:
    encoded = aggregation_job_request_bytes(task_id, job_id, items)
    assert encoded == _with_messages(task_id, job_id, items)
    parsed = helper_pb2.AggregationJobRequest.FromString(encoded)
    assert [v.report_share.encrypted_input_share.payload for v in parsed.verify_inits] == [
        it.encrypted_input_share.payload for it in items
    ]
