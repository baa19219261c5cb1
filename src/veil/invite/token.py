"""A token's bytes and how it binds to one report (after RFC 9578, type 0x0002).

    struct {
        uint16 token_type = 0x0002;
        uint8 nonce[32];
        uint8 context[32];       // binds the token to (task id, report id)
        uint8 token_key_id[32];  // SHA-256 of the issuer key's SubjectPublicKeyInfo
        uint8 authenticator[256];
    } Token;

RFC 9578 signs token_type || nonce || challenge_digest || token_key_id with
the deterministic RSABSSA variant. Here the signature is RSABSSA-SHA384-PSS-
Randomized (RFC 9474) and the nonce is that variant's 32-byte random prefix,
so the signed message is nonce || token_type || context || token_key_id: the
same fields, the nonce first. The context is not a server challenge but
SHA-256(label || task id || report id): a client picks its report id before
the token is issued, so a token is good for exactly one report of one task,
and an aggregator's refusal of a second report with the same id is its
spent-token check (nothing new to store).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from veil.invite import blindrsa

TOKEN_TYPE = 0x0002
NONCE_SIZE = blindrsa.PREFIX_LEN
CONTEXT_SIZE = 32
KEY_ID_SIZE = 32
TOKEN_SIZE = 2 + NONCE_SIZE + CONTEXT_SIZE + KEY_ID_SIZE + blindrsa.K_LEN
CONTEXT_LABEL = b"veil-invitation-token-v1"
KEYS_LABEL = b"veil-issuer-keys-v1"


class TokenError(ValueError):
    """A token refused; the message says why (for the uploader's error)."""


def context(task_id: bytes, report_id: bytes) -> bytes:
    """The 32 bytes that bind a token to one report of one task."""
    return hashlib.sha256(CONTEXT_LABEL + task_id + report_id).digest()


def public_key_bytes(pk: rsa.RSAPublicKey) -> bytes:
    """The key as written in task files: DER SubjectPublicKeyInfo."""
    return pk.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@lru_cache(maxsize=256)
def key_id(public_key_der: bytes) -> bytes:
    return hashlib.sha256(public_key_der).digest()


@lru_cache(maxsize=256)
def load_public_key(public_key_der: bytes) -> rsa.RSAPublicKey:
    """An issuer public key from its DER bytes; raises TokenError if not RSA-2048."""
    try:
        pk = serialization.load_der_public_key(public_key_der)
    except ValueError:
        raise TokenError("the issuer public key is not a DER SubjectPublicKeyInfo") from None
    if not isinstance(pk, rsa.RSAPublicKey) or pk.key_size != blindrsa.MODULUS_BITS:
        raise TokenError(f"the issuer public key must be RSA-{blindrsa.MODULUS_BITS}")
    if pk.public_numbers().e != blindrsa.PUBLIC_EXPONENT:
        raise TokenError(f"the issuer public key's exponent must be {blindrsa.PUBLIC_EXPONENT}")
    return pk


def keys_fingerprint(public_keys_der: Sequence[bytes]) -> str:
    """A survey's issuer keys, in question order, as one fingerprint to
    publish with the survey: SHA-256 of KEYS_LABEL and each key's id, as 64
    hex digits. A respondent's client checks the keys it is given against
    it before redeeming, so an issuer cannot hand one respondent keys of its
    own (which would mark that respondent's tokens) unnoticed."""
    h = hashlib.sha256(KEYS_LABEL)
    for der in public_keys_der:
        h.update(key_id(der))
    return h.hexdigest()


def normalise_keys_fingerprint(text: str) -> str:
    """A fingerprint as 64 lowercase hex digits, from any spelling with
    colons, spaces or dashes; TokenError otherwise."""
    digits = "".join(c for c in text if c not in ": -").lower()
    if len(digits) != 64 or any(c not in "0123456789abcdef" for c in digits):
        raise TokenError(f"not an issuer keys fingerprint (64 hex digits): {text[:80]!r}")
    return digits


def token_input(ctx: bytes, kid: bytes) -> bytes:
    """The message before the randomized prefix: token_type || context || key id."""
    return struct.pack(">H", TOKEN_TYPE) + ctx + kid


@dataclass(frozen=True)
class Token:
    nonce: bytes
    context: bytes
    key_id: bytes
    authenticator: bytes

    def encode(self) -> bytes:
        return (
            struct.pack(">H", TOKEN_TYPE)
            + self.nonce
            + self.context
            + self.key_id
            + self.authenticator
        )

    @staticmethod
    def decode(data: bytes) -> Token:
        """Raises TokenError on any other length or token type."""
        if len(data) != TOKEN_SIZE:
            raise TokenError(f"a token is exactly {TOKEN_SIZE} bytes, not {len(data)}")
        (token_type,) = struct.unpack(">H", data[:2])
        if token_type != TOKEN_TYPE:
            raise TokenError(f"token type {token_type:#06x} is not {TOKEN_TYPE:#06x}")
        a = 2 + NONCE_SIZE
        b = a + CONTEXT_SIZE
        c = b + KEY_ID_SIZE
        return Token(data[2:a], data[a:b], data[b:c], data[c:])

    def signed_message(self) -> bytes:
        """The prepared message the authenticator signs (nonce as the prefix)."""
        return blindrsa.prepare(token_input(self.context, self.key_id), self.nonce)


@dataclass(frozen=True)
class Verifier:
    """What an aggregator needs to check a task's tokens."""

    public_key_der: bytes

    @property
    def key_id(self) -> bytes:
        return key_id(self.public_key_der)

    def check(self, data: bytes, task_id: bytes, report_id: bytes) -> None:
        """Raises TokenError unless `data` is a valid token for this report.

        One signature verification; the comparisons are constant-time.
        """
        token = Token.decode(data)
        if not hmac.compare_digest(token.key_id, self.key_id):
            raise TokenError("the token was issued under another issuer key")
        if not hmac.compare_digest(token.context, context(task_id, report_id)):
            raise TokenError("the token belongs to another report or task")
        pk = load_public_key(self.public_key_der)
        if not blindrsa.verify(pk, token.signed_message(), token.authenticator):
            raise TokenError("the token's signature does not verify")


@dataclass(frozen=True)
class PendingToken:
    """A token blinded for the issuer, kept on the device until finalised."""

    public_key_der: bytes
    nonce: bytes
    context: bytes
    blinded_msg: bytes
    inv: bytes

    @staticmethod
    def start(public_key_der: bytes, task_id: bytes, report_id: bytes) -> PendingToken:
        pk = load_public_key(public_key_der)
        nonce = secrets.token_bytes(NONCE_SIZE)
        ctx = context(task_id, report_id)
        msg = blindrsa.prepare(token_input(ctx, key_id(public_key_der)), nonce)
        b = blindrsa.blind(pk, msg)
        return PendingToken(public_key_der, nonce, ctx, b.blinded_msg, b.inv)

    def finish(self, blind_sig: bytes) -> bytes:
        """The token's bytes from the issuer's blind signature; raises BlindRSAError."""
        kid = key_id(self.public_key_der)
        msg = blindrsa.prepare(token_input(self.context, kid), self.nonce)
        pk = load_public_key(self.public_key_der)
        sig = blindrsa.finalize(pk, msg, blind_sig, self.inv)
        return Token(self.nonce, self.context, kid, sig).encode()
