"""Coverage-guided fuzzing (atheris/libFuzzer) of every veil decoder.

Run by test_fuzz_decoders.py as `python atheris_decoders.py -runs=N`. The
first input byte picks a decoder, the rest is its input. A decoder may raise
only its documented error; anything else escapes and libFuzzer reports a
crash (non-zero exit) with the input that caused it.
"""

from __future__ import annotations

import contextlib
import sys

import atheris

with atheris.instrument_imports():
    from google.protobuf.message import DecodeError

    from veil.hpke import ROLE_LEADER, Ciphertext, HpkeError, generate_keypair, open_
    from veil.protocol.v1 import helper_pb2, leader_pb2
    from veil.vdaf import (
        CodecError,
        Prio3Count,
        Prio3Histogram,
        Prio3L1BoundSum,
        Prio3MultihotCountVec,
        Prio3Sum,
        Prio3SumVec,
    )

VDAFS = [
    Prio3Count(2),
    Prio3Sum(2, 255),
    Prio3SumVec(2, 3, 7, 2),
    Prio3Histogram(2, 5, 2),
    Prio3MultihotCountVec(2, 4, 2, 2),
    Prio3L1BoundSum(2, 3, 8, 2),
]
KEYPAIR = generate_keypair(1)
MESSAGES = [
    leader_pb2.UploadRequest,
    leader_pb2.CreateCollectionRequest,
    leader_pb2.CollectionJob,
    helper_pb2.AggregationJobRequest,
    helper_pb2.AggregationJobResponse,
    helper_pb2.AggregateShareRequest,
]


def one_input(data: bytes) -> None:
    if len(data) < 2:
        return
    pick, body = data[0], data[1:]
    kind = pick % 4
    if kind == 0:
        vdaf = VDAFS[(pick >> 2) % len(VDAFS)]
        which = (pick >> 5) % 4
        try:
            if which == 0:
                vdaf.decode_public_share(body)
            elif which == 1:
                vdaf.decode_input_share(0, body)
            elif which == 2:
                vdaf.decode_input_share(1, body)
            else:
                vdaf.decode_agg_share(None, body)
        except CodecError:
            pass
    elif kind == 1:
        with contextlib.suppress(HpkeError):
            open_(KEYPAIR, Ciphertext(1, body[:32], body[32:]), bytes([ROLE_LEADER]))
    else:
        with contextlib.suppress(DecodeError):
            MESSAGES[(pick >> 2) % len(MESSAGES)].FromString(body)


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
