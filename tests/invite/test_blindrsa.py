"""RFC 9474 blind RSA (veil.invite.blindrsa) and the token format (veil.invite.token).

The math is checked by its properties here, against the JavaScript library
in tests/js/test_js_blindrsa.py, and against RFC 9474's own vectors (which
are not ours to commit: ../shared beside the checkout) in
test_rfc9474_vectors.py.
"""

from __future__ import annotations

import secrets
from functools import cache

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.invite import _openssl, blindrsa
from veil.invite.token import (
    TOKEN_SIZE,
    PendingToken,
    Token,
    TokenError,
    Verifier,
    public_key_bytes,
    redemption_context,
)


def ctx(task_id: bytes, report_id: bytes) -> bytes:
    """A redemption context for a report of that id in that task."""
    return redemption_context(task_id, report_id, 3600, b"ps", bytes(32), bytes(32))


@cache
def key() -> rsa.RSAPrivateKey:
    return blindrsa.generate_key()


@cache
def other_key() -> rsa.RSAPrivateKey:
    return blindrsa.generate_key()


@cache
def signer() -> blindrsa.Signer:
    return blindrsa.Signer(key())


@settings(max_examples=20, deadline=None)
@given(st.binary(max_size=200), st.binary(min_size=48, max_size=48))
def test_unblinded_signature_is_the_plain_rsa_signature_of_the_pss_encoding(
    msg: bytes, salt: bytes
) -> None:
    pk = key().public_key()
    n = pk.public_numbers().n
    prepared = blindrsa.prepare(msg)
    b = blindrsa.blind(pk, prepared, salt=salt)
    sig = blindrsa.finalize(pk, prepared, signer().blind_sign(b.blinded_msg), b.inv)
    # sig^e is the PSS encoding of the message: blinding cancelled out exactly.
    em = blindrsa.emsa_pss_encode(prepared, blindrsa.MODULUS_BITS - 1, salt)
    assert pow(int.from_bytes(sig, "big"), 65537, n) == int.from_bytes(em, "big")
    assert blindrsa.verify(pk, prepared, sig)
    assert not blindrsa.verify(pk, prepared + b"x", sig)


def test_blinded_messages_of_one_message_differ() -> None:
    pk = key().public_key()
    msg = blindrsa.prepare(b"same", b"\x00" * 32)
    assert blindrsa.blind(pk, msg).blinded_msg != blindrsa.blind(pk, msg).blinded_msg


@pytest.mark.skipif(not _openssl.available(), reason="no OpenSSL 3 libcrypto to compare with")
@settings(max_examples=10, deadline=None)
@given(st.integers(min_value=1))
def test_openssl_and_pycryptodome_private_operations_agree(seed: int) -> None:
    n = key().public_key().public_numbers().n
    m = (seed * 0x9E3779B97F4A7C15) % n
    blinded = m.to_bytes(blindrsa.K_LEN, "big")
    assert signer().blind_sign(blinded) == blindrsa.Signer(key(), use_openssl=False).blind_sign(
        blinded
    )


def test_blind_sign_refuses_out_of_range_and_wrong_length() -> None:
    n = key().public_key().public_numbers().n
    with pytest.raises(blindrsa.BlindRSAError, match="below the modulus"):
        signer().blind_sign(n.to_bytes(blindrsa.K_LEN, "big"))
    with pytest.raises(blindrsa.BlindRSAError, match="exactly 256 bytes"):
        signer().blind_sign(b"\x01" * 255)


def test_finalize_refuses_a_wrong_blind_signature() -> None:
    pk = key().public_key()
    msg = blindrsa.prepare(b"m")
    b = blindrsa.blind(pk, msg)
    genuine = signer().blind_sign(b.blinded_msg)
    wrong = genuine[:-1] + bytes([genuine[-1] ^ 1])
    with pytest.raises(blindrsa.BlindRSAError, match="does not verify"):
        blindrsa.finalize(pk, msg, wrong, b.inv)
    with pytest.raises(blindrsa.BlindRSAError, match="below the modulus"):
        blindrsa.finalize(pk, msg, b"\xff" * 256, b.inv)


def _token(task_id: bytes, report_id: bytes, k: rsa.RSAPrivateKey | None = None) -> bytes:
    k = k or key()
    der = public_key_bytes(k.public_key())
    pending = PendingToken.start(der, ctx(task_id, report_id))
    return pending.finish(blindrsa.Signer(k).blind_sign(pending.blinded_msg))


def test_a_token_verifies_for_its_report_only() -> None:
    verifier = Verifier(public_key_bytes(key().public_key()))
    task_id, report_id = secrets.token_bytes(32), secrets.token_bytes(16)
    tok = _token(task_id, report_id)
    assert len(tok) == TOKEN_SIZE
    verifier.check(tok, ctx(task_id, report_id))
    with pytest.raises(TokenError, match="another report or task"):
        verifier.check(tok, ctx(task_id, secrets.token_bytes(16)))
    with pytest.raises(TokenError, match="another report or task"):
        verifier.check(tok, ctx(secrets.token_bytes(32), report_id))
    with pytest.raises(TokenError, match="another issuer key"):
        verifier.check(_token(task_id, report_id, other_key()), ctx(task_id, report_id))


def test_a_token_is_bound_to_every_part_of_its_report() -> None:
    k = key()
    der = public_key_bytes(k.public_key())
    parts = (secrets.token_bytes(32), secrets.token_bytes(16), 3600, b"ps", b"L" * 32, b"H" * 32)
    pending = PendingToken.start(der, redemption_context(*parts))
    tok = pending.finish(blindrsa.Signer(k).blind_sign(pending.blinded_msg))
    Verifier(der).check(tok, redemption_context(*parts))
    others = (secrets.token_bytes(32), secrets.token_bytes(16), 7200, b"pt", b"l" * 32, b"h" * 32)
    for i, other in enumerate(others):
        changed = (*parts[:i], other, *parts[i + 1 :])
        with pytest.raises(TokenError, match="other content under this report id"):
            Verifier(der).check(tok, redemption_context(*changed))  # type: ignore[arg-type]
    with pytest.raises(TokenError, match="64-bit"):
        redemption_context(parts[0], parts[1], -1, b"", bytes(32), bytes(32))


def test_malformed_tokens_are_refused() -> None:
    verifier = Verifier(public_key_bytes(key().public_key()))
    task_id, report_id = secrets.token_bytes(32), secrets.token_bytes(16)
    tok = _token(task_id, report_id)
    for bad, why in (
        (b"", "exactly 354 bytes"),
        (tok[:-1], "exactly 354 bytes"),
        (tok + b"\x00", "exactly 354 bytes"),
        (b"\x00\x01" + tok[2:], "token type"),
        (tok[:-1] + bytes([tok[-1] ^ 1]), "signature does not verify"),
        (tok[:2] + bytes([tok[2] ^ 1]) + tok[3:], "signature does not verify"),
    ):
        with pytest.raises(TokenError, match=why):
            verifier.check(bad, ctx(task_id, report_id))


def test_a_forged_signature_with_the_right_fields_is_refused() -> None:
    der = public_key_bytes(key().public_key())
    task_id, report_id = secrets.token_bytes(32), secrets.token_bytes(16)
    genuine = Token.decode(_token(task_id, report_id))
    forged = Token(
        genuine.nonce, genuine.challenge_digest, genuine.key_id, secrets.token_bytes(256)
    )
    with pytest.raises(TokenError, match="signature does not verify"):
        Verifier(der).check(forged.encode(), ctx(task_id, report_id))


@pytest.mark.skipif(not _openssl.available(), reason="no OpenSSL 3 libcrypto")
def test_openssl_public_operation_is_the_public_exponent_and_checks_signing() -> None:
    sk = key()
    n = sk.public_key().public_numbers().n
    raw = _openssl.RawPrivateKey(blindrsa._private_der(sk))
    for seed in (1, 2, 0x1234567, n - 1):
        data = seed.to_bytes(blindrsa.K_LEN, "big")
        assert int.from_bytes(raw.public_op(data), "big") == pow(seed, 65537, n)
    # A faulty private operation never leaves the signer: the check catches it.
    faulty = blindrsa.Signer(sk)
    assert faulty._openssl is not None
    genuine = faulty._openssl

    class Faulty:
        def private_op(self, data: bytes) -> bytes:
            s = genuine.private_op(data)
            return s[:-1] + bytes([s[-1] ^ 1])

        def public_op(self, data: bytes) -> bytes:
            return genuine.public_op(data)

    faulty._openssl = Faulty()  # type: ignore[assignment]
    with pytest.raises(blindrsa.BlindRSAError, match="signing failed"):
        faulty.blind_sign((12345).to_bytes(blindrsa.K_LEN, "big"))
