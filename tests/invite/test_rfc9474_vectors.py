"""veil.invite.blindrsa against RFC 9474's own test vectors (Appendix A).

The two PSS vectors (the deterministic variant, which tokens use, and the
randomized one) run through every operation with the vector's randomness
(the randomized one's prefix, the salt, r = inv^-1 mod n) and must give the
vector's bytes; the two PSSZERO variants veil does not implement are refused
by name and by the empty salt that would make them. The vectors' key is RSA-4096,
so this also holds the primitives to a modulus other than the 2048 bits
veil's keys have. The JavaScript page's library is held to the same vectors
in js/test/rfc9474.test.js.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.modes import unavailable
from tests.support.vectors import rfc9474_vectors_file
from veil.invite import _openssl, blindrsa


def _vectors() -> dict[str, dict[str, Any]]:
    path = rfc9474_vectors_file()
    if path is None:
        unavailable(
            "RFC 9474 test vectors not found: set VEIL_RFC9474_VECTORS to a directory holding"
            " rfc9474.json (RFC 9474 Appendix A as JSON), or put it in"
            " ../shared/rfc9474-test-vectors beside the checkout"
        )
    return {v["name"]: v for v in json.loads(path.read_text())}


def _int(v: dict[str, Any], name: str) -> int:
    return int(v[name], 16)


def _bytes(v: dict[str, Any], name: str) -> bytes:
    return bytes.fromhex(v[name])


def _key(v: dict[str, Any]) -> rsa.RSAPrivateKey:
    p, q, n, e, d = (_int(v, x) for x in ("p", "q", "n", "e", "d"))
    assert p * q == n
    public = rsa.RSAPublicNumbers(e, n)
    return rsa.RSAPrivateNumbers(
        p,
        q,
        d,
        rsa.rsa_crt_dmp1(d, p),
        rsa.rsa_crt_dmq1(d, q),
        rsa.rsa_crt_iqmp(p, q),
        public,
    ).private_key()


@pytest.mark.parametrize(
    "use_openssl",
    [
        pytest.param(
            True,
            id="openssl",
            marks=pytest.mark.skipif(not _openssl.available(), reason="no OpenSSL 3 libcrypto"),
        ),
        pytest.param(False, id="pycryptodome"),
    ],
)
@pytest.mark.parametrize("name", blindrsa.VARIANTS)
def test_rfc9474_pss_vector(name: str, use_openssl: bool) -> None:
    v = _vectors()[name]
    sk = _key(v)
    pk = sk.public_key()
    n = pk.public_numbers().n
    assert sk.key_size == 4096 and blindrsa.modulus_len(pk) == 512

    if name == blindrsa.DETERMINISTIC:
        assert not v["msg_prefix"]
        prepared = blindrsa.prepare_identity(_bytes(v, "msg"))
    else:
        prepared = blindrsa.prepare(_bytes(v, "msg"), _bytes(v, "msg_prefix"))
    assert prepared == _bytes(v, "prepared_msg")
    salt = _bytes(v, "salt")
    assert blindrsa.emsa_pss_encode(prepared, n.bit_length() - 1, salt) == _bytes(v, "encoded_msg")

    r = pow(_int(v, "inv"), -1, n)
    blinded = blindrsa.blind(pk, prepared, salt=salt, r=r)
    assert blinded.blinded_msg == _bytes(v, "blinded_msg")
    assert blinded.inv == _bytes(v, "inv")

    blind_sig = blindrsa.Signer(sk, use_openssl=use_openssl).blind_sign(blinded.blinded_msg)
    assert blind_sig == _bytes(v, "blind_sig")

    sig = blindrsa.finalize(pk, prepared, blind_sig, blinded.inv)
    assert sig == _bytes(v, "sig")
    assert blindrsa.verify(pk, prepared, sig)
    assert not blindrsa.verify(pk, prepared + b"\x00", sig)


def test_rfc9474_tokens_use_the_deterministic_pss_variant() -> None:
    assert blindrsa.TOKEN_VARIANT == "RSABSSA-SHA384-PSS-Deterministic"
    randomized = _vectors()[blindrsa.RANDOMIZED]
    pk = _key(randomized).public_key()
    # The randomized variant's message is its prefix and the message: the
    # signature does not verify for the message alone.
    assert not blindrsa.verify(pk, _bytes(randomized, "msg"), _bytes(randomized, "sig"))


def test_rfc9474_vector_finalize_refuses_what_is_not_the_vectors_signature() -> None:
    v = _vectors()[blindrsa.TOKEN_VARIANT]
    pk = _key(v).public_key()
    prepared, blind_sig, inv = (_bytes(v, x) for x in ("prepared_msg", "blind_sig", "inv"))
    spoiled = blind_sig[:-1] + bytes([blind_sig[-1] ^ 1])
    with pytest.raises(blindrsa.BlindRSAError, match="does not verify"):
        blindrsa.finalize(pk, prepared, spoiled, inv)
    with pytest.raises(blindrsa.BlindRSAError, match="exactly 512 bytes"):
        blindrsa.finalize(pk, prepared, blind_sig[1:], inv)
    with pytest.raises(blindrsa.BlindRSAError, match="inverse is exactly 512 bytes"):
        blindrsa.finalize(pk, prepared, blind_sig, inv + b"\x00")
    with pytest.raises(blindrsa.BlindRSAError, match="exactly 512 bytes"):
        blindrsa.Signer(_key(v)).blind_sign(_bytes(v, "blinded_msg")[:256])
    assert not blindrsa.verify(pk, prepared, _bytes(v, "sig")[:256])


@pytest.mark.parametrize(
    "name",
    [
        "RSABSSA-SHA384-PSSZERO-Randomized",
        "RSABSSA-SHA384-PSSZERO-Deterministic",
    ],
)
def test_rfc9474_other_variants_are_refused(name: str) -> None:
    v = _vectors()[name]
    with pytest.raises(blindrsa.BlindRSAError, match=f"{name} is one of RFC 9474's variants"):
        blindrsa.variant(name)
    pk = _key(v).public_key()
    n = pk.public_numbers().n
    r = pow(_int(v, "inv"), -1, n)
    if not v["msg_prefix"]:
        with pytest.raises(blindrsa.BlindRSAError, match="is the deterministic variant"):
            blindrsa.prepare(_bytes(v, "msg"), b"")
    if not v["salt"]:
        with pytest.raises(blindrsa.BlindRSAError, match="PSSZERO variants are refused"):
            blindrsa.blind(pk, _bytes(v, "prepared_msg"), salt=b"", r=r)
        # A signature without a salt is not a signature under veil's variant.
        assert not blindrsa.verify(pk, _bytes(v, "prepared_msg"), _bytes(v, "sig"))


def test_rfc9474_names_and_modulus_sizes() -> None:
    assert blindrsa.variant("RSABSSA-SHA384-PSS-Randomized") == blindrsa.RANDOMIZED
    assert blindrsa.variant("RSABSSA-SHA384-PSS-Deterministic") == blindrsa.TOKEN_VARIANT
    with pytest.raises(blindrsa.BlindRSAError, match="not an RFC 9474 variant"):
        blindrsa.variant("RSABSSA-SHA256-PSS-Randomized")
    with pytest.raises(blindrsa.BlindRSAError, match="at least 2048 bits"):
        blindrsa.generate_key(1024)
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    with pytest.raises(blindrsa.BlindRSAError, match="RSA-2048 or larger"):
        blindrsa.blind(small.public_key(), blindrsa.prepare(b"m"))
    with pytest.raises(blindrsa.BlindRSAError, match="RSA-2048 or larger"):
        blindrsa.Signer(small)
    pk = blindrsa.generate_key().public_key()
    with pytest.raises(blindrsa.BlindRSAError, match="not invertible"):
        blindrsa.blind(pk, blindrsa.prepare(b"m"), r=pk.public_numbers().n)
