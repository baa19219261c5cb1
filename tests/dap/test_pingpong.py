"""The VDAF's ping-pong messages (draft-irtf-cfrg-vdaf section 5.7), from
the text: a one-byte type, then each of the type's fields as an opaque
vector with a four-byte length; truncated, oversized and trailing input
refused."""

from __future__ import annotations

import pytest

from veil.dap.codec import DecodeError
from veil.dap.pingpong import MessageType, PingPong, finish, initialize


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
