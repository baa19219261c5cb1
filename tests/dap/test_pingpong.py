"""The VDAF's ping-pong messages (draft-irtf-cfrg-vdaf section 5.7), from
the text: a one-byte type, then each of the type's fields as an opaque
vector with a four-byte length; truncated, oversized and trailing input
refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from veil.dap.codec import DecodeError
from veil.dap.pingpong import MessageType, PingPong, finish, initialize, initialize_share


def test_each_type_is_encoded_as_the_text_says() -> None:
    assert initialize(b"ab") == b"\x00" + b"\x00\x00\x00\x02ab"
    assert finish(b"") == b"\x02" + b"\x00\x00\x00\x00"
    both = PingPong(MessageType.CONTINUE, b"m", b"ss")
    assert both.encode() == b"\x01" + b"\x00\x00\x00\x01m" + b"\x00\x00\x00\x02ss"
    for message in (PingPong.decode(initialize(b"ab")), PingPong.decode(finish(b"x")), both):
        assert PingPong.decode(message.encode()) == message


@pytest.mark.parametrize(
    "data",
    [
        b"",  # no type
        b"\x03\x00\x00\x00\x00",  # no such type
        b"\x00\x00\x00\x00",  # truncated length
        b"\x00\x00\x00\x00\x02a",  # a share shorter than its length
        b"\x02\x00\x00\x00\x00\x00",  # a byte after the end
        b"\x01\x00\x00\x00\x00",  # continue without its share
        b"\x00\xff\xff\xff\xff",  # a length past the end
    ],
)
def test_malformed_messages_are_refused(data: bytes) -> None:
    with pytest.raises(DecodeError):
        PingPong.decode(data)


def test_a_type_carries_only_its_fields() -> None:
    with pytest.raises(ValueError):
        PingPong(MessageType.INITIALIZE, verifier_message=b"m")
    with pytest.raises(ValueError):
        PingPong(MessageType.FINISH, verifier_share=b"s")


@given(st.binary(max_size=40) | st.builds(initialize, st.binary(max_size=40)))
def test_initialize_share_reads_what_decode_reads(data: bytes) -> None:
    """The helper's quick read of the leader's first message agrees with
    PingPong.decode on any bytes: the verifier share of an initialize
    message, None for another type or for bytes that are not a message."""
    try:
        message = PingPong.decode(data)
    except DecodeError:
        expected = None
    else:
        expected = message.verifier_share if message.type is MessageType.INITIALIZE else None
    assert initialize_share(data) == expected


@pytest.mark.parametrize(
    "data",
    [
        b"\x00\x00\x00\x00\x02a",
        b"\x00\x00\x00\x00\x00\x00",
        b"\x00\x00\x00\x00",
        b"\x02" + bytes(4),
    ],
)
def test_initialize_share_refuses_what_is_not_an_initialize(data: bytes) -> None:
    assert initialize_share(data) is None
