"""Tokens as RFC 9578 defines token type 0x0002 (publicly verifiable, Blind
RSA 2048): the RFC's own vectors where they are given, and a token built by
the RFC's text with other code than veil's, each accepted by the other side.

RFC 9578's Appendix A vectors are not shipped beside the checkout; the first
test reads them from $VEIL_RFC9578_VECTORS or ../shared/rfc9578-test-vectors
(*.json) where someone put them there, and skips otherwise. The second needs
nothing: it builds the TokenChallenge, the key's RSASSA-PSS
SubjectPublicKeyInfo, the token input and an RSASSA-PSS signature with
hashlib, pycryptodome's DER encoder and `cryptography`, never with
veil.invite.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import struct
from functools import cache
from typing import Any

import pytest
from Crypto.Util.asn1 import DerBitString, DerInteger, DerObjectId, DerSequence
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.support.vectors import rfc9578_vectors_dir
from veil.invite import blindrsa
from veil.invite.token import (
    PendingToken,
    TokenError,
    Verifier,
    challenge_digest,
    key_id,
    pss_public_key_bytes,
    public_key_bytes,
    redemption_context,
    token_challenge,
)


def ctx(task_id: bytes, report_id: bytes) -> bytes:
    """A redemption context for a report of that id in that task."""
    return redemption_context(task_id, report_id, 3600, b"ps", bytes(32), bytes(32))


VECTOR_FIELDS = (
    "skS",
    "pkS",
    "token_challenge",
    "nonce",
    "blind",
    "salt",
    "token_request",
    "token_response",
    "token",
)
NO_VECTORS = (
    "RFC 9578 Appendix A vectors not found: put one or more *.json files in"
    " ../shared/rfc9578-test-vectors beside the checkout (or a folder named by"
    " VEIL_RFC9578_VECTORS), each a JSON list of objects whose fields are hex strings: "
    + ", ".join(VECTOR_FIELDS)
    + " (section A.2, 'Issuance Protocol 2 - Blind RSA, 2048': skS is the bytes of the"
    " PEM PKCS#8 private key, blind the blinding factor r); objects whose token is not of"
    " type 0x0002 are passed over"
)


def _rfc9578_vectors() -> list[dict[str, str]]:
    folder = rfc9578_vectors_dir()
    files = sorted(folder.glob("*.json")) if folder is not None else []
    vectors = []
    for path in files:
        data: Any = json.loads(path.read_text())
        if not isinstance(data, list):
            continue
        for v in data:
            if (
                isinstance(v, dict)
                and all(k in v for k in VECTOR_FIELDS)
                and v["token"].startswith("0002")
            ):
                vectors.append({k: v[k] for k in VECTOR_FIELDS})
    if not vectors:
        pytest.skip(NO_VECTORS)
    return vectors


def test_rfc9578_appendix_a_blind_rsa_vectors() -> None:
    for i, v in enumerate(_rfc9578_vectors()):
        h = {k: bytes.fromhex(v[k]) for k in VECTOR_FIELDS}
        sk = serialization.load_pem_private_key(h["skS"], password=None)
        assert isinstance(sk, rsa.RSAPrivateKey), i
        pk = sk.public_key()
        der = public_key_bytes(pk)
        # The key id hashes the key under RSASSA-PSS, as the vector encodes it.
        assert pss_public_key_bytes(der) == h["pkS"], i
        kid = key_id(der)
        assert kid == hashlib.sha256(h["pkS"]).digest(), i
        digest = hashlib.sha256(h["token_challenge"]).digest()
        message = b"\x00\x02" + h["nonce"] + digest + kid
        blinded = blindrsa.blind(
            pk, blindrsa.prepare_identity(message), salt=h["salt"], r=int(v["blind"], 16)
        )
        # TokenRequest: token_type, truncated_token_key_id, blinded_msg.
        assert b"\x00\x02" + kid[-1:] + blinded.blinded_msg == h["token_request"], i
        blind_sig = blindrsa.Signer(sk).blind_sign(blinded.blinded_msg)
        assert blind_sig == h["token_response"], i
        authenticator = blindrsa.finalize(pk, message, blind_sig, blinded.inv)
        assert message + authenticator == h["token"], i
        Verifier(der).check_digest(h["token"], digest)
        with pytest.raises(TokenError, match="another report or task"):
            Verifier(der).check_digest(h["token"], hashlib.sha256(b"other").digest())


# --- the RFC's construction, written here without veil.invite ------------------

_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48)


@cache
def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _challenge(issuer_name: bytes, context: bytes, origin_info: bytes) -> bytes:
    """RFC 9577 section 2.1's TokenChallenge for token type 0x0002."""
    return (
        struct.pack(">H", 2)
        + struct.pack(">H", len(issuer_name))
        + issuer_name
        + struct.pack(">B", len(context))
        + context
        + struct.pack(">H", len(origin_info))
        + origin_info
    )


def _pss_spki(pk: rsa.RSAPublicKey) -> bytes:
    """RFC 9578 section 6.5: SubjectPublicKeyInfo under id-RSASSA-PSS with
    RSASSA-PSS-params (RFC 4055) naming SHA-384, MGF1-SHA-384, salt 48."""
    sha384 = DerSequence([DerObjectId("2.16.840.1.101.3.4.2.2")])
    mgf1 = DerSequence([DerObjectId("1.2.840.113549.1.1.8"), sha384])

    def explicit(tag: int, inner: bytes) -> bytes:
        return bytes([0xA0 | tag, len(inner)]) + inner

    params = DerSequence(
        [
            explicit(0, sha384.encode()),
            explicit(1, mgf1.encode()),
            explicit(2, DerInteger(48).encode()),
        ]
    )
    algorithm = DerSequence([DerObjectId("1.2.840.113549.1.1.10"), params])
    n = pk.public_numbers()
    rsa_public_key = DerSequence([DerInteger(n.n), DerInteger(n.e)]).encode()
    return bytes(DerSequence([algorithm, DerBitString(rsa_public_key)]).encode())


def _rfc_token(sk: rsa.RSAPrivateKey, digest: bytes) -> tuple[bytes, bytes]:
    """(token input, token) with an ordinary RSASSA-PSS signature: what the
    blind protocol's finalized signature is, so any RFC 9578 verifier takes it."""
    kid = hashlib.sha256(_pss_spki(sk.public_key())).digest()
    token_input = struct.pack(">H", 2) + secrets.token_bytes(32) + digest + kid
    return token_input, token_input + sk.sign(token_input, _PSS, hashes.SHA384())


def test_rfc9578_token_built_by_the_rfc_text_is_accepted_by_veil() -> None:
    sk = _key()
    der = public_key_bytes(sk.public_key())
    task_id, report_id = secrets.token_bytes(32), secrets.token_bytes(16)
    context = ctx(task_id, report_id)
    by_hand = _challenge(b"issuer.veil.invalid", context, b"")
    assert token_challenge(context) == by_hand
    assert key_id(der) == hashlib.sha256(_pss_spki(sk.public_key())).digest()
    _, token = _rfc_token(sk, hashlib.sha256(by_hand).digest())
    Verifier(der).check(token, context)
    # Another context, or a token under a challenge of another issuer name or origin.
    with pytest.raises(TokenError, match="another report or task"):
        Verifier(der).check(token, ctx(task_id, secrets.token_bytes(16)))
    for other in (
        _challenge(b"issuer.example", context, b""),
        _challenge(b"issuer.veil.invalid", context, b"origin.example"),
    ):
        _, foreign = _rfc_token(sk, hashlib.sha256(other).digest())
        with pytest.raises(TokenError, match="another report or task"):
            Verifier(der).check(foreign, context)
        Verifier(der).check_digest(foreign, hashlib.sha256(other).digest())


def test_rfc9578_veil_token_verifies_by_the_rfc_text() -> None:
    sk = _key()
    pk = sk.public_key()
    der = public_key_bytes(pk)
    context = ctx(secrets.token_bytes(32), secrets.token_bytes(16))
    pending = PendingToken.start(der, context)
    token = pending.finish(blindrsa.Signer(sk).blind_sign(pending.blinded_msg))
    assert len(token) == 2 + 32 + 32 + 32 + 256
    token_type, nonce, digest, kid, authenticator = (
        token[:2],
        token[2:34],
        token[34:66],
        token[66:98],
        token[98:],
    )
    assert token_type == b"\x00\x02"
    assert digest == hashlib.sha256(_challenge(b"issuer.veil.invalid", context, b"")).digest()
    assert digest == challenge_digest(context)
    assert kid == hashlib.sha256(_pss_spki(pk)).digest()
    # Not the rsaEncryption SPKI's hash, which veil's key id once was.
    assert kid != hashlib.sha256(der).digest()
    # RSASSA-PSS-VERIFY over token_type || nonce || challenge_digest || token_key_id,
    # SHA-384, MGF1-SHA-384, a 48-byte salt (RFC 9578 section 6.4).
    pk.verify(authenticator, token_type + nonce + digest + kid, _PSS, hashes.SHA384())
    with pytest.raises(InvalidSignature):
        pk.verify(authenticator, nonce + token_type + digest + kid, _PSS, hashes.SHA384())
