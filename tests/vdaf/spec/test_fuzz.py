"""Fuzzing every Prio3 decoder and the verification entry points with
random and mutated bytes: the only exception that may escape a decoder is
CodecError, and verification of decodable garbage only ever raises
VerifyError. Long mode (VEIL_TEST_LONG=1) runs 100,000+ cases."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.modes import LONG
from tests.support.mutate import mutate, mutations
from veil.vdaf import (
    CodecError,
    Prio3,
    Prio3Count,
    Prio3Histogram,
    Prio3L1BoundSum,
    Prio3MultihotCountVec,
    Prio3Sum,
    Prio3SumVec,
    VerifyError,
)

pytestmark = pytest.mark.fuzz

EXAMPLES = 20_000 if LONG else 300
CTX = b"fuzz"
VDAFS: list[tuple[Prio3[Any, Any], Any]] = [
    (Prio3Count(2), 1),
    (Prio3Sum(2, 255), 200),
    (Prio3SumVec(2, 3, 7, 2), [1, 2, 3]),
    (Prio3Histogram(2, 5, 2), 4),
    (Prio3MultihotCountVec(2, 4, 2, 2), [True, False, True, False]),
    (Prio3L1BoundSum(2, 3, 8, 2), [1, 2, 3]),
]
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _report(vdaf: Prio3[Any, Any], measurement: Any) -> tuple[bytes, bytes, list[bytes]]:
    nonce = secrets.token_bytes(16)
    public, inputs = vdaf.shard(CTX, measurement, nonce, secrets.token_bytes(vdaf.RAND_SIZE))
    return nonce, vdaf.encode_public_share(public), [vdaf.encode_input_share(s) for s in inputs]


def _decoders(
    vdaf: Prio3[Any, Any], measurement: Any
) -> list[tuple[bytes, Callable[[bytes], object]]]:
    nonce, public, inputs = _report(vdaf, measurement)
    state, share = vdaf.verify_init(
        bytes(32),
        CTX,
        0,
        None,
        nonce,
        vdaf.decode_public_share(public),
        vdaf.decode_input_share(0, inputs[0]),
    )
    return [
        (public, vdaf.decode_public_share),
        (inputs[0], lambda b: vdaf.decode_input_share(0, b)),
        (inputs[1], lambda b: vdaf.decode_input_share(1, b)),
        (vdaf.encode_verifier_share(share), lambda b: vdaf.decode_verifier_share(state, b)),
        (state.corrected_joint_rand_seed or b"", lambda b: vdaf.decode_verifier_message(state, b)),
        (vdaf.encode_agg_share(state.out_share), lambda b: vdaf.decode_agg_share(None, b)),
        (vdaf.encode_out_share(state.out_share), lambda b: vdaf.decode_out_share(None, b)),
    ]


@pytest.mark.parametrize(("vdaf", "measurement"), VDAFS, ids=lambda v: type(v).__name__)
@FUZZ_SETTINGS
@given(data=st.data())
def test_decoders_raise_only_codec_errors(
    vdaf: Prio3[Any, Any], measurement: Any, data: st.DataObject
) -> None:
    for good, decode in _decoders(vdaf, measurement):
        fuzzed = data.draw(
            st.one_of(
                st.binary(max_size=2 * len(good) + 8),
                mutations.map(lambda ops, g=good: mutate(g, ops)),
            )
        )
        with contextlib.suppress(CodecError):
            decode(fuzzed)


@pytest.mark.parametrize(("vdaf", "measurement"), VDAFS, ids=lambda v: type(v).__name__)
@FUZZ_SETTINGS
@given(ops0=mutations, ops1=mutations, ops_pub=mutations)
def test_mutated_reports_verify_or_reject_cleanly(
    vdaf: Prio3[Any, Any], measurement: Any, ops0: Any, ops1: Any, ops_pub: Any
) -> None:
    nonce, public, inputs = _report(vdaf, measurement)
    try:
        public_share = vdaf.decode_public_share(mutate(public, ops_pub))
        shares = [
            vdaf.decode_input_share(j, mutate(s, o))
            for j, (s, o) in enumerate(zip(inputs, (ops0, ops1), strict=True))
        ]
    except CodecError:
        return
    key = bytes(32)
    states, verifier_shares = [], []
    for j, share in enumerate(shares):
        state, vshare = vdaf.verify_init(key, CTX, j, None, nonce, public_share, share)
        states.append(state)
        verifier_shares.append(vshare)
    try:
        message = vdaf.verifier_shares_to_message(CTX, None, verifier_shares)
        outs = [vdaf.verify_next(CTX, s, message) for s in states]
    except VerifyError:
        return
    # Accepted: then the mutations must not have changed what is aggregated
    # (a mutation can only survive verification by not changing the shares).
    merged = vdaf.merge(None, outs)
    assert vdaf.unshard(None, [merged], 1) == vdaf.unshard(
        None, [vdaf.flp.truncate(vdaf.flp.encode(measurement))], 1
    )
