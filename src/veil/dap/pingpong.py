"""The VDAF's ping-pong messages (draft-irtf-cfrg-vdaf section 5.7), which
DAP carries as the opaque payload of a VerifyInit, a VerifyResp and a
VerifyContinue:

    enum { initialize(0), continue(1), finish(2), (255) } MessageType;
    struct {
      MessageType type;
      select (Message.type) {
        case initialize: opaque verifier_share<0..2^32-1>;
        case continue:   opaque verifier_message<0..2^32-1>;
                         opaque verifier_share<0..2^32-1>;
        case finish:     opaque verifier_message<0..2^32-1>;
      };
    } Message;

For a one-round VDAF (Prio3) the leader sends `initialize` with its verifier
share, and the helper answers `finish` with the verifier message (the
leader's state is then Finished, the helper's FinishedWithOutbound).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from veil.dap.codec import DecodeError, Reader, put_opaque, put_uint


class MessageType(enum.IntEnum):
    INITIALIZE = 0
    CONTINUE = 1
    FINISH = 2


@dataclass(frozen=True)
class PingPong:
    """One ping-pong message: `verifier_share` for initialize and continue,
    `verifier_message` for continue and finish (empty where the type has
    none)."""

    type: MessageType
    verifier_message: bytes = b""
    verifier_share: bytes = b""

    def __post_init__(self) -> None:
        if self.type is MessageType.INITIALIZE and self.verifier_message:
            raise ValueError("an initialize message carries no verifier message")
        if self.type is MessageType.FINISH and self.verifier_share:
            raise ValueError("a finish message carries no verifier share")

    def encode(self) -> bytes:
        out = put_uint(self.type, 1, "type")
        if self.type is not MessageType.INITIALIZE:
            out += put_opaque(self.verifier_message, 4, "verifier_message")
        if self.type is not MessageType.FINISH:
            out += put_opaque(self.verifier_share, 4, "verifier_share")
        return out

    @classmethod
    def decode(cls, data: bytes) -> PingPong:
        r = Reader(data, "PingPong")
        code = r.uint(1, "type")
        kind = _TYPES.get(code)
        if kind is None:
            raise DecodeError(f"PingPong.type: {code} is not a MessageType")
        message = r.opaque(4, "verifier_message") if kind is not MessageType.INITIALIZE else b""
        share = r.opaque(4, "verifier_share") if kind is not MessageType.FINISH else b""
        r.end()
        return cls(kind, message, share)


_TYPES = {t.value: t for t in MessageType}


def initialize_share(data: bytes) -> bytes | None:
    """The verifier share of an `initialize` message, None if `data` is not
    one (another type, or not a PingPong): what `PingPong.decode` tells,
    read without building the message (one of every report of a job)."""
    if data[:1] == b"\x00" and len(data) >= 5 and int.from_bytes(data[1:5]) == len(data) - 5:
        return data[5:]
    try:
        message = PingPong.decode(data)
    except DecodeError:
        return None
    return message.verifier_share if message.type is MessageType.INITIALIZE else None


def initialize(verifier_share: bytes) -> bytes:
    """The leader's first message: its verifier share (PingPong's encoding,
    written out: one of every report of a job)."""
    return b"\x00" + put_opaque(verifier_share, 4, "verifier_share")


def finish(verifier_message: bytes) -> bytes:
    """The last message of a verification: the verifier message (PingPong's
    encoding, written out: one of every report of a job)."""
    return b"\x02" + put_opaque(verifier_message, 4, "verifier_message")
