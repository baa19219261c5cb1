"""A token's bytes and how it binds to one report: Privacy Pass token type
0x0002, publicly verifiable (RFC 9578 section 6; the Token and TokenChallenge
structures of RFC 9577 section 2):

    struct {
        uint16 token_type = 0x0002;
        uint8 nonce[32];
        uint8 challenge_digest[32];  // SHA-256 of the encoded TokenChallenge
        uint8 token_key_id[32];      // SHA-256 of the key's RSASSA-PSS SPKI
        uint8 authenticator[256];    // RSABSSA-SHA384-PSS-Deterministic
    } Token;

The authenticator is a blind RSA signature (RFC 9474, the deterministic PSS
variant, veil.invite.blindrsa) of token_type || nonce || challenge_digest ||
token_key_id, so any RFC 9578 verifier holding the issuer's public key and
the challenge accepts a veil token. No origin sends veil's clients a
challenge: each party builds it from the report alone, as

    TokenChallenge {
        token_type = 0x0002,
        issuer_name = ISSUER_NAME,
        redemption_context = SHA-256(label || task id || report id || time
            || SHA-256(public share) || SHA-256(leader's sealed share)
            || SHA-256(helper's sealed share)),
        origin_info = "" }

The redemption context binds a token to one report of one task, whole: its
id and time, its public share and both sealed input shares (HPKE
ciphertexts, config id and encapsulated key included). So the client seals
its report before it asks for the token, and whoever sees a token in the
clear on the way (the page's server, a proxy, the leader) cannot send
another answer under it: each aggregator recomputes the context from the
report it holds (the helper takes only the leader's sealed-share digest from
the leader, and computes its own part and the public share's itself). An
aggregator's refusal of a second report with the same id is its spent-token
check (nothing new to store).
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
from veil.messages import Report

TOKEN_TYPE = 0x0002
NONCE_SIZE = 32
DIGEST_SIZE = 32
KEY_ID_SIZE = 32
TOKEN_SIZE = 2 + NONCE_SIZE + DIGEST_SIZE + KEY_ID_SIZE + blindrsa.K_LEN
# The TokenChallenge's issuer_name: a server name (RFC 9577 section 2.1) that
# is the same for every veil issuer, under the reserved .invalid top-level
# domain (RFC 2606), since the tokens are checked against the survey's keys,
# never against an issuer's address.
ISSUER_NAME = b"issuer.veil.invalid"
ORIGIN_INFO = b""
CONTEXT_LABEL = b"veil-invitation-report-v2"
KEYS_LABEL = b"veil-issuer-keys-v1"

# The AlgorithmIdentifier of an RSASSA-PSS key with SHA-384, MGF1-SHA-384 and
# a 48-byte salt, DER (RFC 4055 section 3.1; RFC 9578 section 6.5 shows it):
#   SEQUENCE { OID 1.2.840.113549.1.1.10 (id-RSASSA-PSS),
#     SEQUENCE { [0] SEQUENCE { OID 2.16.840.1.101.3.4.2.2 (sha384) },
#                [1] SEQUENCE { OID 1.2.840.113549.1.1.8 (id-mgf1),
#                               SEQUENCE { OID sha384 } },
#                [2] INTEGER 48 } }
_PSS_ALGORITHM = bytes.fromhex(
    "303d06092a864886f70d01010a3030a00d300b0609608648016503040202"
    "a11a301806092a864886f70d010108300b0609608648016503040202a203020130"
)


class TokenError(ValueError):
    """A token refused; the message says why (for the uploader's error)."""


def sealed_share_digest(sealed: bytes) -> bytes:
    """SHA-256 of a sealed input share as stored (`Ciphertext.to_bytes`:
    config id, encapsulated key, payload)."""
    return hashlib.sha256(sealed).digest()


def redemption_context(
    task_id: bytes,
    report_id: bytes,
    time: int,
    public_share: bytes,
    leader_share_digest: bytes,
    helper_share_digest: bytes,
    label: bytes = CONTEXT_LABEL,
) -> bytes:
    """The TokenChallenge's 32-byte redemption_context for one report: the
    task, the report's id and time, its public share and the digests
    (`sealed_share_digest`) of its two sealed input shares. A DAP report's
    digests are of its shares' keys instead, under its own `label`
    (veil.dap.invitation)."""
    if not 0 <= time < 2**64:
        raise TokenError(f"report time {time} is not a 64-bit unsigned integer")
    return hashlib.sha256(
        label
        + task_id
        + report_id
        + struct.pack(">Q", time)
        + hashlib.sha256(public_share).digest()
        + leader_share_digest
        + helper_share_digest
    ).digest()


def report_context(task_id: bytes, report: Report) -> bytes:
    """`redemption_context` of a sealed report of task `task_id` (its token aside)."""
    return redemption_context(
        task_id,
        report.report_id,
        report.time,
        report.public_share,
        sealed_share_digest(report.leader_ct.to_bytes()),
        sealed_share_digest(report.helper_ct.to_bytes()),
    )


def token_challenge(context: bytes) -> bytes:
    """The encoded TokenChallenge (RFC 9577 section 2.1) of a veil token."""
    if len(context) != 32:
        raise TokenError("a redemption context is 32 bytes")
    return (
        struct.pack(">HH", TOKEN_TYPE, len(ISSUER_NAME))
        + ISSUER_NAME
        + bytes([len(context)])
        + context
        + struct.pack(">H", len(ORIGIN_INFO))
        + ORIGIN_INFO
    )


def challenge_digest(context: bytes) -> bytes:
    return hashlib.sha256(token_challenge(context)).digest()


def public_key_bytes(pk: rsa.RSAPublicKey) -> bytes:
    """The key as written in task files: DER SubjectPublicKeyInfo."""
    return pk.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _der_length(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(body)]) + body


@lru_cache(maxsize=256)
def pss_public_key_bytes(public_key_der: bytes) -> bytes:
    """The key as RFC 9578 section 6.5 encodes it for its key id: a DER
    SubjectPublicKeyInfo under id-RSASSA-PSS (SHA-384, MGF1-SHA-384, salt 48)
    rather than rsaEncryption, holding the same RSAPublicKey."""
    pkcs1 = load_public_key(public_key_der).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.PKCS1
    )
    bit_string = b"\x03" + _der_length(len(pkcs1) + 1) + b"\x00" + pkcs1
    body = _PSS_ALGORITHM + bit_string
    return b"\x30" + _der_length(len(body)) + body


@lru_cache(maxsize=256)
def key_id(public_key_der: bytes) -> bytes:
    """The token_key_id of RFC 9578 section 6.5: SHA-256 of the PSS SPKI."""
    return hashlib.sha256(pss_public_key_bytes(public_key_der)).digest()


def spki_digest(public_key_der: bytes) -> bytes:
    """SHA-256 of the key as task files hold it (rsaEncryption SPKI): what a
    survey's keys fingerprint is made of."""
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
        h.update(spki_digest(der))
    return h.hexdigest()


def normalise_keys_fingerprint(text: str) -> str:
    """A fingerprint as 64 lowercase hex digits, from any spelling with
    colons, spaces or dashes; TokenError otherwise."""
    digits = "".join(c for c in text if c not in ": -").lower()
    if len(digits) != 64 or any(c not in "0123456789abcdef" for c in digits):
        raise TokenError(f"not an issuer keys fingerprint (64 hex digits): {text[:80]!r}")
    return digits


def token_input(nonce: bytes, digest: bytes, kid: bytes) -> bytes:
    """What the authenticator signs (RFC 9578 section 6.1): token_type ||
    nonce || challenge_digest || token_key_id."""
    return struct.pack(">H", TOKEN_TYPE) + nonce + digest + kid


@dataclass(frozen=True)
class Token:
    nonce: bytes
    challenge_digest: bytes
    key_id: bytes
    authenticator: bytes

    def encode(self) -> bytes:
        return self.authenticator_input() + self.authenticator

    @staticmethod
    def decode(data: bytes) -> Token:
        """Raises TokenError on any other length or token type."""
        if len(data) != TOKEN_SIZE:
            raise TokenError(f"a token is exactly {TOKEN_SIZE} bytes, not {len(data)}")
        (token_type,) = struct.unpack(">H", data[:2])
        if token_type != TOKEN_TYPE:
            raise TokenError(f"token type {token_type:#06x} is not {TOKEN_TYPE:#06x}")
        a = 2 + NONCE_SIZE
        b = a + DIGEST_SIZE
        c = b + KEY_ID_SIZE
        return Token(data[2:a], data[a:b], data[b:c], data[c:])

    def authenticator_input(self) -> bytes:
        """The message the authenticator signs (PrepareIdentity: itself)."""
        return token_input(self.nonce, self.challenge_digest, self.key_id)


@dataclass(frozen=True)
class Verifier:
    """What an aggregator needs to check a task's tokens."""

    public_key_der: bytes

    @property
    def key_id(self) -> bytes:
        return key_id(self.public_key_der)

    def check(self, data: bytes, context: bytes) -> None:
        """Raises TokenError unless `data` is a valid token for the
        redemption context `context` (see `redemption_context`).

        One signature verification; the comparisons are constant-time.
        """
        self.check_digest(data, challenge_digest(context))

    def check_digest(self, data: bytes, digest: bytes) -> None:
        """`check` for any TokenChallenge, given its SHA-256 `digest` (RFC
        9578 section 6.4: what a verifier of another deployment checks)."""
        token = Token.decode(data)
        if not hmac.compare_digest(token.key_id, self.key_id):
            raise TokenError("the token was issued under another issuer key")
        if not hmac.compare_digest(token.challenge_digest, digest):
            raise TokenError(
                "the token belongs to another report or task, or to other content under this"
                " report id"
            )
        pk = load_public_key(self.public_key_der)
        if not blindrsa.verify(pk, token.authenticator_input(), token.authenticator):
            raise TokenError("the token's signature does not verify")


@dataclass(frozen=True)
class PendingToken:
    """A token blinded for the issuer, kept on the device until finalised."""

    public_key_der: bytes
    nonce: bytes
    challenge_digest: bytes
    blinded_msg: bytes
    inv: bytes

    @staticmethod
    def start(public_key_der: bytes, context: bytes) -> PendingToken:
        """Blind a token for the redemption context `context`."""
        pk = load_public_key(public_key_der)
        nonce = secrets.token_bytes(NONCE_SIZE)
        digest = challenge_digest(context)
        msg = blindrsa.prepare_identity(token_input(nonce, digest, key_id(public_key_der)))
        b = blindrsa.blind(pk, msg)
        return PendingToken(public_key_der, nonce, digest, b.blinded_msg, b.inv)

    def finish(self, blind_sig: bytes) -> bytes:
        """The token's bytes from the issuer's blind signature; raises BlindRSAError."""
        kid = key_id(self.public_key_der)
        msg = blindrsa.prepare_identity(token_input(self.nonce, self.challenge_digest, kid))
        pk = load_public_key(self.public_key_der)
        sig = blindrsa.finalize(pk, msg, blind_sig, self.inv)
        return Token(self.nonce, self.challenge_digest, kid, sig).encode()
