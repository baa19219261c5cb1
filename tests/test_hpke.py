from __future__ import annotations

import pytest

from veil.hpke import (
    ROLE_HELPER,
    ROLE_LEADER,
    Ciphertext,
    HpkeConfig,
    HpkeError,
    generate_keypair,
    input_share_info,
    open_,
    seal,
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
