from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
from cryptography.hazmat.primitives.hpke import AEAD, KDF, KEM, Suite
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.hpke import (
    ENC_SIZE,
    ROLE_HELPER,
    ROLE_LEADER,
    Ciphertext,
    HpkeConfig,
    HpkeError,
    decapsulate,
    generate_keypair,
    input_share_info,
    open_,
    open_payload,
    seal,
    seal_with_aad,
)


def _info(role: int = ROLE_LEADER, time: int = 3600) -> bytes:
    return input_share_info(role, b"t" * 32, b"r" * 16, time, b"public")


def test_roundtrip() -> None:
    kp = generate_keypair(7)
    ct = seal(kp.config, _info(), b"share")
    assert ct.config_id == 7
    assert open_(kp, ct, _info()) == b"share"


@pytest.mark.parametrize(
    "other",
    [_info(ROLE_HELPER), _info(time=7200), input_share_info(2, b"t" * 32, b"r" * 16, 3600, b"x")],
)
def test_context_is_bound(other: bytes) -> None:
    kp = generate_keypair(1)
    ct = seal(kp.config, _info(), b"share")
    with pytest.raises(HpkeError):
        open_(kp, ct, other)


def test_tampering_and_wrong_key() -> None:
    kp = generate_keypair(1)
    ct = seal(kp.config, _info(), b"share")
    bad = Ciphertext(ct.config_id, ct.enc, bytes([ct.payload[0] ^ 1]) + ct.payload[1:])
    with pytest.raises(HpkeError):
        open_(kp, bad, _info())
    with pytest.raises(HpkeError):
        open_(generate_keypair(1), ct, _info())
    with pytest.raises(HpkeError, match="unknown HPKE config id"):
        open_(generate_keypair(2), ct, _info())
    with pytest.raises(HpkeError):
        open_(kp, Ciphertext(1, ct.enc[:5], ct.payload), _info())


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        HpkeConfig(300, b"k" * 32)
    with pytest.raises(ValueError):
        HpkeConfig(1, b"k" * 31)
    assert "private" not in repr(generate_keypair(3))


# --- veil's own open against cryptography's seal -----------------------------

_SUITE = Suite(KEM.X25519, KDF.HKDF_SHA256, AEAD.AES_128_GCM)
_KEYPAIR = generate_keypair(5)
_PUBLIC = X25519PublicKey.from_public_bytes(_KEYPAIR.config.public_key)


def _sealed(info: bytes, plaintext: bytes) -> Ciphertext:
    out = _SUITE.encrypt(plaintext, _PUBLIC, info=info)
    return Ciphertext(_KEYPAIR.config.config_id, out[:ENC_SIZE], out[ENC_SIZE:])


@settings(max_examples=200, deadline=None)
@given(info=st.binary(max_size=400), plaintext=st.binary(max_size=600))
def test_opens_what_cryptography_seals(info: bytes, plaintext: bytes) -> None:
    assert open_(_KEYPAIR, _sealed(info, plaintext), info) == plaintext


@settings(max_examples=200, deadline=None)
@given(
    info=st.binary(max_size=200),
    plaintext=st.binary(max_size=200),
    part=st.sampled_from(["enc", "payload", "info"]),
    position=st.integers(min_value=0),
    flip=st.integers(min_value=1, max_value=255),
)
def test_any_changed_byte_fails(
    info: bytes, plaintext: bytes, part: str, position: int, flip: int
) -> None:
    ct = _sealed(info, plaintext)
    fields = {"enc": ct.enc, "payload": ct.payload, "info": info}
    if not fields[part]:
        fields[part] = bytes([flip])  # an empty info changed is one that is not empty
    else:
        data = bytearray(fields[part])
        data[position % len(data)] ^= flip
        fields[part] = bytes(data)
    changed = Ciphertext(ct.config_id, fields["enc"], fields["payload"])
    with pytest.raises(HpkeError):
        open_(_KEYPAIR, changed, fields["info"])


# u-coordinates of points of small order on Curve25519 (0, 1, the two of
# order 8, p - 1), 0 and 1 written again as p and p + 1 (p = 2^255 - 19, not
# reduced), and 0 and 1 with the top bit set, which X25519 ignores. X25519's
# scalar is a multiple of 8, so each gives an all-zero DH output.
_P = 2**255 - 19
_SMALL_ORDER = [
    0,
    1,
    0x00B8495F16056286FDB1329CEB8D09DA6AC49FF1FAE35616AEB8413B7C7AEBE0,
    0x57119FD0DD4E22D8868E1C58C45C44045BEF839C55B1D0B1248C50A3BC959C5F,
    _P - 1,
    _P,
    _P + 1,
    2**255,
    2**255 + 1,
]


@pytest.mark.parametrize("u", _SMALL_ORDER)
def test_low_order_encapsulated_keys_fail(u: int) -> None:
    payload = _sealed(b"info", b"share").payload
    ct = Ciphertext(_KEYPAIR.config.config_id, u.to_bytes(32, "little"), payload)
    with pytest.raises(HpkeError, match="low-order"):
        open_(_KEYPAIR, ct, b"info")


@pytest.mark.parametrize("enc_size", [0, 1, 31, 33, 64])
def test_malformed_encapsulated_key_fails(enc_size: int) -> None:
    ct = _sealed(b"info", b"share")
    enc = (ct.enc * 3)[:enc_size]
    with pytest.raises(HpkeError, match="malformed HPKE encapsulated key"):
        open_(_KEYPAIR, Ciphertext(ct.config_id, enc, ct.payload), b"info")


@pytest.mark.parametrize("payload_size", [0, 1, 15, 16, 17])
def test_truncated_payload_fails(payload_size: int) -> None:
    ct = _sealed(b"info", b"share")  # 5 bytes and the 16-byte tag
    with pytest.raises(HpkeError, match="HPKE decryption failed"):
        open_(_KEYPAIR, Ciphertext(ct.config_id, ct.enc, ct.payload[:payload_size]), b"info")


def test_wrong_config_id_fails_before_any_work() -> None:
    ct = _sealed(b"info", b"share")
    with pytest.raises(HpkeError, match="unknown HPKE config id 6"):
        open_(_KEYPAIR, Ciphertext(6, ct.enc, ct.payload), b"info")


def test_recipient_public_key_is_the_configs() -> None:
    for config_id in range(5):
        kp = generate_keypair(config_id)
        assert kp.recipient_public_key == kp.config.public_key


def test_opens_from_several_threads_at_once() -> None:
    infos = [input_share_info(ROLE_HELPER, b"t" * 32, bytes([i]) * 16, i, b"p") for i in range(64)]
    sealed = [(_sealed(info, info[-20:]), info) for info in infos]

    def open_all(part: int) -> list[bytes]:
        return [open_(_KEYPAIR, ct, info) for ct, info in sealed[part::4]]

    with ThreadPoolExecutor(4) as pool:
        opened = list(pool.map(open_all, range(4)))
    for part in range(4):
        assert opened[part] == [info[-20:] for info in infos[part::4]]


def test_an_open_in_two_steps() -> None:
    ct = _sealed(b"info", b"share")
    dh = decapsulate(_KEYPAIR, ct)
    assert open_payload(_KEYPAIR, ct.enc, ct.payload, b"info", dh) == b"share"
    with pytest.raises(HpkeError, match="HPKE decryption failed"):
        open_payload(_KEYPAIR, ct.enc, ct.payload, b"info", bytes([dh[0] ^ 1]) + dh[1:])
    with pytest.raises(HpkeError, match="unknown HPKE config id"):
        decapsulate(generate_keypair(9), ct)
    with pytest.raises(HpkeError, match="low-order"):
        decapsulate(_KEYPAIR, Ciphertext(ct.config_id, bytes(32), ct.payload))


# --- DAP's SealBase with associated data, against pycryptodome's HPKE ------


def _pycryptodome_private(private_key: bytes) -> object:
    from Crypto.PublicKey import ECC

    return ECC.construct(curve="Curve25519", seed=private_key)


def _pycryptodome_public(public_key: bytes) -> object:
    from Crypto.PublicKey import ECC

    return ECC.construct(curve="Curve25519", point_x=int.from_bytes(public_key, "little"))


@settings(max_examples=25, deadline=None)
@given(info=st.binary(max_size=64), aad=st.binary(max_size=200), plaintext=st.binary(max_size=300))
def test_seal_with_aad_opens_in_pycryptodome_and_back(
    info: bytes, aad: bytes, plaintext: bytes
) -> None:
    from Crypto.Protocol import HPKE

    kp = generate_keypair(9)
    ct = seal_with_aad(kp.config, info, aad, plaintext)
    assert ct.config_id == 9 and len(ct.enc) == ENC_SIZE
    receiver = HPKE.new(
        receiver_key=_pycryptodome_private(kp.private_key),
        aead_id=HPKE.AEAD.AES128_GCM,
        enc=ct.enc,
        info=info,
    )
    assert receiver.unseal(ct.payload, aad) == plaintext
    sender = HPKE.new(
        receiver_key=_pycryptodome_public(kp.config.public_key),
        aead_id=HPKE.AEAD.AES128_GCM,
        info=info,
    )
    theirs = Ciphertext(9, sender.enc, sender.seal(plaintext, aad))
    assert open_(kp, theirs, info, aad) == plaintext


def test_associated_data_is_bound() -> None:
    kp = generate_keypair(1)
    ct = seal_with_aad(kp.config, b"info", b"task and report", b"share")
    assert open_(kp, ct, b"info", b"task and report") == b"share"
    for info, aad in [(b"info", b"task and repora"), (b"info", b""), (b"infp", b"task and report")]:
        with pytest.raises(HpkeError):
            open_(kp, ct, info, aad)
    # veil's own protocol (associated data in `info`, none in the AEAD) is
    # unchanged: its ciphertexts do not open with a non-empty aad.
    plain = seal(kp.config, b"info", b"share")
    assert open_(kp, plain, b"info") == b"share"
    with pytest.raises(HpkeError):
        open_(kp, plain, b"info", b"x")


def test_seal_with_aad_refuses_another_suite() -> None:
    kp = generate_keypair(2)
    other = HpkeConfig(2, kp.config.public_key, kem_id=0x0010)
    with pytest.raises(HpkeError, match="unsupported suite"):
        seal_with_aad(other, b"", b"", b"x")
