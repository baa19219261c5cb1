"""Prio3 end to end in memory: round trips, bad measurements, tampering,
and every decoder fed truncated, oversized and trailing-byte input."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.vdaf import prio3_round_trip as run
from veil.vdaf import (
    CodecError,
    Field64,
    Prio3,
    Prio3Count,
    Prio3Histogram,
    Prio3L1BoundSum,
    Prio3MultihotCountVec,
    Prio3Sum,
    Prio3SumVec,
    Prio3SumVecWithMultiproof,
    VerifyError,
)

CTX = b"veil tests"


def test_constants_and_api() -> None:
    vdaf = Prio3Histogram(2, 4, 2)
    assert (vdaf.ID, vdaf.SHARES, vdaf.PROOFS) == (4, 2, 1)
    assert (vdaf.VERIFY_KEY_SIZE, vdaf.NONCE_SIZE, vdaf.RAND_SIZE) == (32, 16, 4 * 32)
    assert Prio3Count(3).RAND_SIZE == 3 * 32
    assert Prio3SumVecWithMultiproof(2, Field64, 3, 2, 1, 1).PROOFS == 3


@given(st.lists(st.integers(0, 1), min_size=1, max_size=6), st.integers(2, 4))
@settings(max_examples=15, deadline=None)
def test_count_round_trip(values: list[int], shares: int) -> None:
    assert run(Prio3Count(shares), values) == sum(values)


@given(st.lists(st.integers(0, 1337), min_size=1, max_size=4))
@settings(max_examples=10, deadline=None)
def test_sum_round_trip(values: list[int]) -> None:
    assert run(Prio3Sum(2, 1337), values) == sum(values)


@given(st.lists(st.integers(0, 9), min_size=1, max_size=4))
@settings(max_examples=10, deadline=None)
def test_histogram_round_trip(values: list[int]) -> None:
    assert run(Prio3Histogram(2, 10, 3), values) == [values.count(i) for i in range(10)]


def test_sumvec_multihot_and_multiproof_round_trips() -> None:
    vecs = [[1, 2, 3], [7, 0, 7]]
    assert run(Prio3SumVec(2, 3, 7, 2), vecs) == [8, 2, 10]
    assert run(Prio3SumVecWithMultiproof(3, Field64, 2, 3, 7, 2), vecs) == [8, 2, 10]
    hot = [[True, False, True, False], [False, False, False, True]]
    assert run(Prio3MultihotCountVec(2, 4, 2, 3), hot) == [1, 0, 1, 1]


BAD_MEASUREMENTS: list[tuple[Prio3[Any, Any], Any, str]] = [
    (Prio3Count(2), 2, r"\[0, 1\]"),
    (Prio3Count(2), -1, r"\[0, 1\]"),
    (Prio3Count(2), True, "must be an int"),
    (Prio3Sum(2, 255), 256, r"\[0, 255\]"),
    (Prio3Sum(2, 255), -3, r"\[0, 255\]"),
    (Prio3Sum(2, 255), False, "must be an int"),
    (Prio3Sum(2, 255), 1.0, "must be an int"),
    (Prio3Histogram(2, 4, 2), 4, r"\[0, 3\]"),
    (Prio3Histogram(2, 4, 2), -1, r"\[0, 3\]"),
    (Prio3SumVec(2, 3, 7, 2), [1, 2], "exactly 3 entries"),
    (Prio3SumVec(2, 3, 7, 2), [1, 2, 8], r"measurement\[2\] must be in \[0, 7\]"),
    (Prio3SumVec(2, 3, 7, 2), [1, True, 3], "must be an int"),
    (Prio3SumVec(2, 3, 7, 2), "abc", "sequence"),
    (Prio3MultihotCountVec(2, 4, 2, 2), [True, True, True, False], "max_weight=2"),
    (Prio3MultihotCountVec(2, 4, 2, 2), [True, 2, False, False], "must be a bool"),
    (Prio3MultihotCountVec(2, 4, 2, 2), [True], "exactly 4 entries"),
]


@pytest.mark.parametrize(("vdaf", "measurement", "message"), BAD_MEASUREMENTS)
def test_shard_refuses_bad_measurements(
    vdaf: Prio3[Any, Any], measurement: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        vdaf.shard(CTX, measurement, bytes(16), bytes(vdaf.RAND_SIZE))


def test_bad_parameters_refused() -> None:
    for make in [
        lambda: Prio3Count(1),
        lambda: Prio3Count(256),
        lambda: Prio3Sum(2, 0),
        lambda: Prio3Sum(2, 2**64),
        lambda: Prio3Histogram(2, 0, 1),
        lambda: Prio3Histogram(2, 4, 0),
        lambda: Prio3MultihotCountVec(2, 4, 5, 2),
        lambda: Prio3SumVec(2, 0, 1, 1),
        lambda: Prio3SumVecWithMultiproof(2, Field64, 0, 2, 1, 1),
    ]:
        with pytest.raises(ValueError):
            make()


def test_shard_checks_nonce_and_rand_sizes() -> None:
    vdaf = Prio3Count(2)
    with pytest.raises(ValueError, match="nonce"):
        vdaf.shard(CTX, 1, bytes(15), bytes(vdaf.RAND_SIZE))
    with pytest.raises(ValueError, match="rand"):
        vdaf.shard(CTX, 1, bytes(16), bytes(vdaf.RAND_SIZE + 1))


def _verify(vdaf: Prio3[Any, Any], nonce: bytes, public: bytes, inputs: list[bytes]) -> None:
    key = bytes(range(32))
    public_share = vdaf.decode_public_share(public)
    shares = []
    states = []
    for j, enc in enumerate(inputs):
        state, share = vdaf.verify_init(
            key, CTX, j, None, nonce, public_share, vdaf.decode_input_share(j, enc)
        )
        states.append(state)
        shares.append(share)
    message = vdaf.verifier_shares_to_message(CTX, None, shares)
    for state in states:
        vdaf.verify_next(CTX, state, message)


def _sharded(vdaf: Prio3[Any, Any], measurement: Any) -> tuple[bytes, bytes, list[bytes]]:
    nonce = secrets.token_bytes(16)
    public, inputs = vdaf.shard(CTX, measurement, nonce, secrets.token_bytes(vdaf.RAND_SIZE))
    return nonce, vdaf.encode_public_share(public), [vdaf.encode_input_share(s) for s in inputs]


@pytest.mark.parametrize(
    ("vdaf", "measurement"),
    [(Prio3Count(2), 1), (Prio3Histogram(2, 5, 2), 3), (Prio3Sum(2, 255), 77)],
)
def test_tampering_any_share_byte_is_rejected(vdaf: Prio3[Any, Any], measurement: Any) -> None:
    nonce, public, inputs = _sharded(vdaf, measurement)
    _verify(vdaf, nonce, public, inputs)
    rejected = 0
    positions = list(range(0, len(inputs[0]), 7))
    for pos in positions:
        bad = bytearray(inputs[0])
        bad[pos] ^= 1
        try:
            _verify(vdaf, nonce, public, [bytes(bad), inputs[1]])
        except (VerifyError, CodecError):
            rejected += 1
    assert rejected == len(positions)
    bad_helper = bytearray(inputs[1])
    bad_helper[0] ^= 0x80
    with pytest.raises(VerifyError):
        _verify(vdaf, nonce, public, [inputs[0], bytes(bad_helper)])


def _decoders(vdaf: Prio3[Any, Any]) -> list[tuple[str, bytes, Callable[[bytes], object]]]:
    nonce, public, inputs = _sharded(vdaf, _sample_measurement(vdaf))
    key = bytes(32)
    public_share = vdaf.decode_public_share(public)
    state, share = vdaf.verify_init(
        key, CTX, 0, None, nonce, public_share, vdaf.decode_input_share(0, inputs[0])
    )
    _state1, share1 = vdaf.verify_init(
        key, CTX, 1, None, nonce, public_share, vdaf.decode_input_share(1, inputs[1])
    )
    message = vdaf.verifier_shares_to_message(CTX, None, [share, share1])
    out = vdaf.verify_next(CTX, state, message)
    cases: list[tuple[str, bytes, Callable[[bytes], object]]] = [
        ("leader input share", inputs[0], lambda b: vdaf.decode_input_share(0, b)),
        ("helper input share", inputs[1], lambda b: vdaf.decode_input_share(1, b)),
        (
            "verifier share",
            vdaf.encode_verifier_share(share),
            lambda b: vdaf.decode_verifier_share(state, b),
        ),
        ("out share", vdaf.encode_out_share(out), lambda b: vdaf.decode_out_share(None, b)),
        ("agg share", vdaf.encode_agg_share(out), lambda b: vdaf.decode_agg_share(None, b)),
    ]
    if public:
        cases.append(("public share", public, vdaf.decode_public_share))
        cases.append(
            (
                "verifier message",
                vdaf.encode_verifier_message(message),
                lambda b: vdaf.decode_verifier_message(state, b),
            )
        )
    return cases


def _sample_measurement(vdaf: Prio3[Any, Any]) -> Any:
    if isinstance(vdaf, Prio3MultihotCountVec):
        return [True, False, False, True]
    if isinstance(vdaf, (Prio3SumVec, Prio3L1BoundSum)):
        return [1, 2, 3]
    return 1


@pytest.mark.parametrize(
    "vdaf",
    [
        Prio3Count(2),
        Prio3Sum(2, 255),
        Prio3SumVec(2, 3, 7, 2),
        Prio3Histogram(2, 4, 2),
        Prio3MultihotCountVec(2, 4, 2, 2),
        Prio3L1BoundSum(2, 3, 8, 2),
    ],
    ids=lambda v: type(v).__name__,
)
def test_decoders_reject_truncated_oversized_trailing(vdaf: Prio3[Any, Any]) -> None:
    for name, good, decode in _decoders(vdaf):
        decode(good)  # the honest encoding decodes
        for bad in (good[:-1], good + b"\x00", good + bytes(64), b""):
            if bad == good:
                continue
            with pytest.raises(CodecError):
                decode(bad)
                pytest.fail(f"{name}: accepted {len(bad)} bytes")
    # Messages that are empty for circuits without joint randomness.
    if vdaf.flp.JOINT_RAND_LEN == 0:
        with pytest.raises(CodecError):
            vdaf.decode_public_share(b"\x00")
        with pytest.raises(CodecError):
            vdaf.decode_agg_param(b"\x00")


def test_unreduced_field_element_rejected() -> None:
    vdaf = Prio3Count(2)
    with pytest.raises(CodecError, match="reduced"):
        vdaf.decode_agg_share(None, Field64.MODULUS.to_bytes(8, "little"))


@pytest.mark.parametrize(
    "vdaf",
    [
        Prio3Count(2),
        Prio3Sum(2, 255),
        Prio3SumVec(2, 3, 7, 2),
        Prio3SumVecWithMultiproof(2, Field64, 3, 3, 7, 2),
        Prio3Histogram(2, 4, 2),
        Prio3MultihotCountVec(2, 4, 2, 2),
        Prio3L1BoundSum(2, 3, 8, 2),
    ],
    ids=lambda v: type(v).__name__,
)
def test_encoded_sizes(vdaf: Prio3[Any, Any]) -> None:
    """public_share_size, input_share_size and verifier_share_size are the
    lengths of the honest encodings (servers refuse any other length)."""
    verify_key = secrets.token_bytes(vdaf.VERIFY_KEY_SIZE)
    measurement: Any = {
        "Prio3Count": 1,
        "Prio3Sum": 200,
        "Prio3Histogram": 2,
        "Prio3MultihotCountVec": [True, False, True, False],
    }.get(type(vdaf).__name__, [1, 7, 0])
    nonce, public, inputs = _sharded(vdaf, measurement)
    assert len(public) == vdaf.public_share_size()
    for agg_id, share in enumerate(inputs):
        assert len(share) == vdaf.input_share_size(agg_id)
        _, verifier_share = vdaf.verify_init(
            verify_key,
            CTX,
            agg_id,
            None,
            nonce,
            vdaf.decode_public_share(public),
            vdaf.decode_input_share(agg_id, share),
        )
        assert len(vdaf.encode_verifier_share(verifier_share)) == vdaf.verifier_share_size()
