"""The IDPF of BBCGGI21 (veil.vdaf.spec.idpf): its point-function property
over random paths and prefixes, and its public-share codec against
malformed bytes. The official vector is in test_vectors.py."""

from __future__ import annotations

import random
from itertools import product

import pytest
from hypothesis import given
from hypothesis import strategies as st

from veil.vdaf import CodecError
from veil.vdaf.spec.field import Field64, Field255
from veil.vdaf.spec.idpf import (
    IdpfBBCGGI21,
    from_bits,
    pack_bits,
    to_bits,
    unpack_bits,
)

CTX = b"veil idpf test"


def _programmed(idpf: IdpfBBCGGI21, rng: random.Random) -> tuple[list[list[int]], list[int]]:
    inner = [
        [rng.randrange(Field64.MODULUS) for _ in range(idpf.VALUE_LEN)]
        for _ in range(idpf.BITS - 1)
    ]
    leaf = [rng.randrange(Field255.MODULUS) for _ in range(idpf.VALUE_LEN)]
    return inner, leaf


@given(
    bits=st.integers(1, 6),
    seed=st.integers(0, 2**32),
    level_choice=st.integers(0, 100),
)
def test_shares_add_up_to_beta_on_the_path_and_zero_off_it(
    bits: int, seed: int, level_choice: int
) -> None:
    rng = random.Random(seed)
    idpf = IdpfBBCGGI21(2, bits)
    alpha = tuple(rng.random() < 0.5 for _ in range(bits))
    beta_inner, beta_leaf = _programmed(idpf, rng)
    nonce, rand = rng.randbytes(16), rng.randbytes(idpf.RAND_SIZE)
    public_share, keys = idpf.gen(alpha, beta_inner, beta_leaf, CTX, nonce, rand)
    level = level_choice % bits
    # Every node of the level, evaluated at once.
    prefixes = list(product((False, True), repeat=level + 1))
    shares = [idpf.eval(j, public_share, keys[j], level, prefixes, CTX, nonce) for j in (0, 1)]
    field = idpf.current_field(level)
    beta = beta_inner[level] if level < bits - 1 else beta_leaf
    for prefix, y0, y1 in zip(prefixes, *shares, strict=True):
        expected = beta if prefix == alpha[: level + 1] else [0, 0]
        assert field.vec_add(y0, y1) == expected


def test_evaluating_prefixes_together_equals_one_at_a_time() -> None:
    rng = random.Random(7)
    idpf = IdpfBBCGGI21(2, 8)
    alpha = tuple(rng.random() < 0.5 for _ in range(8))
    public_share, keys = idpf.gen(alpha, *_programmed(idpf, rng), CTX, bytes(16), bytes(32))
    prefixes = sorted({tuple(rng.random() < 0.5 for _ in range(6)) for _ in range(10)})
    together = idpf.eval(1, public_share, keys[1], 5, prefixes, CTX, bytes(16))
    alone = [idpf.eval(1, public_share, keys[1], 5, [p], CTX, bytes(16))[0] for p in prefixes]
    assert together == alone


def test_eval_refuses_bad_arguments() -> None:
    idpf = IdpfBBCGGI21(2, 4)
    rng = random.Random(1)
    public_share, keys = idpf.gen((True,) * 4, *_programmed(idpf, rng), CTX, bytes(16), bytes(32))
    with pytest.raises(ValueError, match="agg_id"):
        idpf.eval(2, public_share, keys[0], 0, [(True,)], CTX, bytes(16))
    with pytest.raises(ValueError, match="level"):
        idpf.eval(0, public_share, keys[0], 4, [(True,) * 5], CTX, bytes(16))
    with pytest.raises(ValueError, match="distinct"):
        idpf.eval(0, public_share, keys[0], 0, [(True,), (True,)], CTX, bytes(16))
    with pytest.raises(ValueError, match="2 bits"):
        idpf.eval(0, public_share, keys[0], 1, [(True,)], CTX, bytes(16))
    with pytest.raises(ValueError, match="IDPF key is 16 bytes"):
        idpf.eval(0, public_share, keys[0][:15], 0, [(True,)], CTX, bytes(16))
    with pytest.raises(ValueError, match="nonce"):
        idpf.eval(0, public_share, keys[0], 0, [(True,)], CTX, bytes(15))
    with pytest.raises(ValueError, match="correction words"):
        idpf.eval(0, public_share[:3], keys[0], 0, [(True,)], CTX, bytes(16))


def test_gen_refuses_bad_arguments() -> None:
    idpf = IdpfBBCGGI21(2, 3)
    inner, leaf = [[1, 2], [3, 4]], [5, 6]
    with pytest.raises(ValueError, match="alpha"):
        idpf.gen((True,) * 2, inner, leaf, CTX, bytes(16), bytes(32))
    with pytest.raises(ValueError, match="beta_inner"):
        idpf.gen((True,) * 3, inner[:1], leaf, CTX, bytes(16), bytes(32))
    with pytest.raises(ValueError, match="2 elements"):
        idpf.gen((True,) * 3, inner, [5], CTX, bytes(16), bytes(32))
    with pytest.raises(ValueError, match="rand"):
        idpf.gen((True,) * 3, inner, leaf, CTX, bytes(16), bytes(31))
    with pytest.raises(ValueError, match="nonce"):
        idpf.gen((True,) * 3, inner, leaf, CTX, bytes(17), bytes(32))
    for bad in (0, -1, True, 2**16 + 1):
        with pytest.raises(ValueError, match="bits"):
            IdpfBBCGGI21(2, bad)


# -- the public share's codec ---------------------------------------------


def _encoded_share(bits: int = 5) -> tuple[IdpfBBCGGI21, bytes]:
    idpf = IdpfBBCGGI21(2, bits)
    rng = random.Random(bits)
    public_share, _ = idpf.gen(
        (False, True) * (bits // 2) + (True,) * (bits % 2),
        *_programmed(idpf, rng),
        CTX,
        bytes(16),
        bytes(32),
    )
    encoded = idpf.encode_public_share(public_share)
    assert len(encoded) == idpf.public_share_size()
    assert idpf.decode_public_share(encoded) == public_share
    return idpf, encoded


def test_public_share_of_wrong_length_is_refused() -> None:
    idpf, encoded = _encoded_share()
    for bad in (b"", encoded[:-1], encoded + b"\x00", encoded[:10]):
        with pytest.raises(CodecError, match="IDPF public share"):
            idpf.decode_public_share(bad)


def test_public_share_with_padding_bits_set_is_refused() -> None:
    idpf, encoded = _encoded_share(5)  # 10 control bits: 6 padding bits
    tampered = encoded[:1] + bytes([encoded[1] | 0x80]) + encoded[2:]
    with pytest.raises(CodecError, match="padding bits"):
        idpf.decode_public_share(tampered)


def test_public_share_with_unreduced_payloads_is_refused() -> None:
    idpf, encoded = _encoded_share(5)
    payload_start = (2 * 5 + 7) // 8 + 16 * 5
    inner = encoded[:payload_start] + b"\xff" * 8 + encoded[payload_start + 8 :]
    with pytest.raises(CodecError, match="Field64"):
        idpf.decode_public_share(inner)
    leaf = encoded[:-32] + b"\xff" * 32
    with pytest.raises(CodecError, match="Field255"):
        idpf.decode_public_share(leaf)


@given(st.binary(max_size=400))
def test_decoding_random_bytes_gives_a_share_or_a_codec_error(data: bytes) -> None:
    idpf = IdpfBBCGGI21(2, 5)
    try:
        decoded = idpf.decode_public_share(data)
    except CodecError:
        return
    assert idpf.encode_public_share(decoded) == data


@given(st.lists(st.booleans(), max_size=40))
def test_control_bits_round_trip(bits: list[bool]) -> None:
    assert unpack_bits(pack_bits(bits), len(bits)) == bits


@given(st.binary(max_size=20))
def test_byte_strings_map_to_indices_and_back(data: bytes) -> None:
    bits = to_bits(data)
    assert len(bits) == 8 * len(data)
    assert from_bits(bits) == data
    # Order and prefixes are kept (draft section 8.1.1).
    assert to_bits(data[:1]) == bits[:8]


def test_index_of_the_drafts_example() -> None:
    assert to_bits(b"\x01\x02") == (False,) * 7 + (True,) + (False,) * 6 + (True, False)
    with pytest.raises(ValueError, match="whole number of bytes"):
        from_bits((True,) * 7)
