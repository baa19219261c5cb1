"""HPKE sealing and opening of input and aggregate shares (RFC 9180, base mode).

One suite throughout, as in DAP: DHKEM(X25519, HKDF-SHA256) / HKDF-SHA256 /
AES-128-GCM.

`seal` is `cryptography`'s single-shot HPKE
(`cryptography.hazmat.primitives.hpke`). That API takes `info` but no AEAD
associated data, so veil's gRPC protocol appends its associated data (task
id, report metadata, public share; or the batch of an aggregate share) to
the application label and carries it in `info`. `info` enters the HPKE key
schedule, so a ciphertext opened with any other context fails exactly as
with a wrong `aad`. The label is fixed per message kind, so label || context
is an unambiguous encoding.

DAP (veil.dap) puts its context in the AEAD's associated data instead, as
draft-ietf-ppm-dap's SealBase(pk, info, aad, pt) does: `seal_with_aad` is
that seal written out over the same key schedule as the open (an
ephemeral X25519 key from `cryptography`), and `open_` and `open_payload`
take the associated data as `aad` (empty by default, which is veil's own
protocol). tests/test_hpke.py checks both directions against
pycryptodome's independent HPKE.

`open_` is written out here for this one suite (RFC 9180 sections 4.1, 5.1,
5.2 and 7.1.3) and opens exactly what that seal produces (empty associated
data, the context's first message; tests/test_hpke.py checks random
contexts and every changed byte against `cryptography`). It exists for one
reason: its X25519 runs in libsodium (PyNaCl), whose call releases the GIL,
so an aggregator opening a job's shares on several threads uses several
cores (veil.aggregator.opener); `cryptography`'s exchange holds the GIL.
The key schedule is HMAC-SHA256 written out over OpenSSL's SHA-256
(through `hashlib`), the AEAD `cryptography`'s AES-128-GCM.
"""

from __future__ import annotations

import hmac
import struct
from dataclasses import dataclass
from functools import cached_property, lru_cache
from hashlib import sha256

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hpke import AEAD, KDF, KEM, Suite
from nacl.bindings import crypto_scalarmult, crypto_scalarmult_base
from nacl.exceptions import RuntimeError as SodiumError

# The suite's ids, HpkeConfig, Ciphertext and ENC_SIZE are protocol messages
# and constants (veil.messages); imported here for the many callers that seal
# and open.
from veil.messages import (
    AEAD_ID_AES_128_GCM,
    AGG_SHARE_LABEL,
    ENC_SIZE,
    INPUT_SHARE_LABEL,
    KDF_ID_HKDF_SHA256,
    KEM_ID_X25519_HKDF_SHA256,
    PUBLIC_KEY_SIZE,
    SUITE_IDS,
    Ciphertext,
    HpkeConfig,
)

AEAD_TAG_SIZE = 16  # AES-128-GCM: a ciphertext is its plaintext plus this tag

ROLE_COLLECTOR = 0
ROLE_CLIENT = 1
ROLE_LEADER = 2
ROLE_HELPER = 3

_SUITE = Suite(KEM.X25519, KDF.HKDF_SHA256, AEAD.AES_128_GCM)

# --- The constants of the open (RFC 9180), each computed once ---------------
# Every labelled HKDF call starts its input with this version tag and the id
# of the layer calling it: the KEM alone (section 4.1, "KEM" || kem_id) or
# the whole suite (section 5.1, "HPKE" || kem_id || kdf_id || aead_id).
_VERSION_TAG = b"HPKE-v1"
_KEM_LAYER_ID = b"KEM" + struct.pack(">H", KEM_ID_X25519_HKDF_SHA256)
_SUITE_LAYER_ID = b"HPKE" + struct.pack(">HHH", *SUITE_IDS)
_BASE_MODE = b"\x00"  # no PSK, no sender authentication
_KEY_SIZE = 16  # AES-128-GCM's key (Nk)
_NONCE_SIZE = 12  # and nonce (Nn)
_SECRET_SIZE = 32  # the KEM's shared secret (Nsecret), one SHA-256 output
# HKDF-Expand to at most one hash output is HMAC(prk, info || 0x01).
_FIRST_BLOCK = b"\x01"
_ALL_ZERO = bytes(32)  # the DH output of a low-order public key


# The key schedule's HMAC-SHA256 (RFC 2104) written out over hashlib's
# SHA-256 (OpenSSL's): H(key ^ opad || H(key ^ ipad || message)), each key
# padded with zeros to SHA-256's 64-byte block. Every key here is a 32-byte
# hash output or empty, so the padded keys are made with one `translate`
# each, and a call costs two hashlib one-shots. `hmac.new` built an HMAC
# object a call (about 1 µs more), and `hmac.digest` releases the GIL at
# each call, which between threads opening at once hands it over (1 to 3 µs
# of CPU an open); hashlib keeps the GIL for inputs this short.
_BLOCK_PAD = bytes(64 - 32)
_IPAD = bytes(b ^ 0x36 for b in range(256))
_OPAD = bytes(b ^ 0x5C for b in range(256))
# The empty key (the empty salt of the extracts) pads to zeros, leaving the
# bare pads.
_EMPTY_KEY_INNER = bytes(64).translate(_IPAD)
_EMPTY_KEY_OUTER = bytes(64).translate(_OPAD)


def _empty_salt_hmac(message: bytes) -> bytes:
    """HMAC-SHA256 under the empty key."""
    return sha256(_EMPTY_KEY_OUTER + sha256(_EMPTY_KEY_INNER + message).digest()).digest()


def _hmac(key: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 under a 32-byte key."""
    padded = key + _BLOCK_PAD
    inner = sha256(padded.translate(_IPAD) + message).digest()
    return sha256(padded.translate(_OPAD) + inner).digest()


# LabeledExtract(salt, label, ikm) = HMAC(salt, tag || layer || label || ikm)
# LabeledExpand(prk, label, info, L)
#   = HMAC(prk, I2OSP(L, 2) || tag || layer || label || info || 0x01)[:L]
# What comes before the variable part of each call:
_EAE_PRK_PREFIX = _VERSION_TAG + _KEM_LAYER_ID + b"eae_prk"
_SHARED_SECRET_PREFIX = (
    struct.pack(">H", _SECRET_SIZE) + _VERSION_TAG + _KEM_LAYER_ID + b"shared_secret"
)
_INFO_HASH_PREFIX = _VERSION_TAG + _SUITE_LAYER_ID + b"info_hash"
# The extract of the key schedule's secret from the shared secret, whose ikm
# (the PSK) is empty in base mode: the whole message is constant.
_SECRET_MESSAGE = _VERSION_TAG + _SUITE_LAYER_ID + b"secret"
# psk_id_hash: the extract of the empty PSK id, the same for every open.
_PSK_ID_HASH = _empty_salt_hmac(_VERSION_TAG + _SUITE_LAYER_ID + b"psk_id_hash")
# key_schedule_context = mode || psk_id_hash || info_hash; the expands of the
# key and the base nonce carry it as their info, so all but info_hash is fixed.
_KEY_PREFIX = (
    struct.pack(">H", _KEY_SIZE) + _VERSION_TAG + _SUITE_LAYER_ID + b"key" + _BASE_MODE
) + _PSK_ID_HASH
_NONCE_PREFIX = (
    struct.pack(">H", _NONCE_SIZE) + _VERSION_TAG + _SUITE_LAYER_ID + b"base_nonce" + _BASE_MODE
) + _PSK_ID_HASH

__all__ = [
    "AEAD_ID_AES_128_GCM",
    "ENC_SIZE",
    "KDF_ID_HKDF_SHA256",
    "KEM_ID_X25519_HKDF_SHA256",
    "PUBLIC_KEY_SIZE",
    "ROLE_CLIENT",
    "ROLE_COLLECTOR",
    "ROLE_HELPER",
    "ROLE_LEADER",
    "SUITE_IDS",
    "Ciphertext",
    "HpkeConfig",
    "HpkeError",
    "HpkeKeypair",
    "agg_share_info",
    "decapsulate",
    "decapsulate_enc",
    "generate_keypair",
    "input_share_info",
    "new_ephemeral",
    "open_",
    "open_payload",
    "seal",
    "seal_with_aad",
]


class HpkeError(Exception):
    """A ciphertext did not open: wrong key, wrong context or tampered bytes."""


@dataclass(frozen=True)
class HpkeKeypair:
    config: HpkeConfig
    private_key: bytes

    def __repr__(self) -> str:  # never print the private key
        return f"HpkeKeypair(config_id={self.config.config_id})"

    @cached_property
    def recipient_public_key(self) -> bytes:
        """pkRm, the public half derived from the private key (as the open's
        KEM context takes it), once per key: about 20 µs, half an open."""
        if len(self.private_key) != PUBLIC_KEY_SIZE:
            raise HpkeError("an HPKE private key is 32 bytes")
        return crypto_scalarmult_base(self.private_key)


def generate_keypair(config_id: int) -> HpkeKeypair:
    """A fresh X25519 keypair (randomness from the OS through `cryptography`)."""
    sk = X25519PrivateKey.generate()
    pk = sk.public_key().public_bytes_raw()
    return HpkeKeypair(HpkeConfig(config_id, pk), sk.private_bytes_raw())


@lru_cache(maxsize=64)
def _public_key(raw: bytes) -> X25519PublicKey:
    # A client seals every report to the same two keys: load each once.
    return X25519PublicKey.from_public_bytes(raw)


def seal(config: HpkeConfig, info: bytes, plaintext: bytes) -> Ciphertext:
    if not config.is_supported():
        raise HpkeError(f"HPKE config {config.config_id} uses an unsupported suite")
    pk = _public_key(config.public_key)
    out = _SUITE.encrypt(plaintext, pk, info=info)
    return Ciphertext(config.config_id, out[:ENC_SIZE], out[ENC_SIZE:])


def new_ephemeral(private: bytes | None = None) -> tuple[bytes, bytes]:
    """A fresh ephemeral X25519 key for one seal: (its private key, the
    encapsulated key `enc` a ciphertext sealed with it carries). `private`:
    32 bytes to take as the private key instead (a test's fixed key)."""
    sk = (
        X25519PrivateKey.generate()
        if private is None
        else X25519PrivateKey.from_private_bytes(private)
    )
    return sk.private_bytes_raw(), sk.public_key().public_bytes_raw()


def seal_with_aad(
    config: HpkeConfig,
    info: bytes,
    aad: bytes,
    plaintext: bytes,
    ephemeral: bytes | None = None,
) -> Ciphertext:
    """SealBase(pkR, info, aad, pt) of RFC 9180 section 6.1 for veil's one
    suite: a fresh ephemeral key (its Encap, section 4.1; `ephemeral`, a
    private key from `new_ephemeral`, where the caller must know `enc`
    before it seals, used for this one seal), the key schedule of
    `open_payload` and AES-128-GCM over `plaintext` with `aad` as its
    associated data. Raises HpkeError for another suite or a public key that
    gives an all-zero shared secret."""
    if not config.is_supported():
        raise HpkeError(f"HPKE config {config.config_id} uses an unsupported suite")
    sk = (
        X25519PrivateKey.generate()
        if ephemeral is None
        else X25519PrivateKey.from_private_bytes(ephemeral)
    )
    enc = sk.public_key().public_bytes_raw()
    try:
        dh = sk.exchange(_public_key(config.public_key))
    except ValueError:  # cryptography refuses an all-zero output
        raise HpkeError("HPKE encryption failed: low-order public key") from None
    key, nonce = _key_and_nonce(dh, enc, config.public_key, info)
    return Ciphertext(config.config_id, enc, AESGCM(key).encrypt(nonce, plaintext, aad))


def open_(keypair: HpkeKeypair, ciphertext: Ciphertext, info: bytes, aad: bytes = b"") -> bytes:
    """Open `ciphertext` (base mode, AEAD associated data `aad`, first
    sequence number); raises HpkeError on any failure. `decapsulate`, then
    `open_payload`."""
    dh = decapsulate(keypair, ciphertext)
    return open_payload(keypair, ciphertext.enc, ciphertext.payload, info, dh, aad)


def decapsulate(keypair: HpkeKeypair, ciphertext: Ciphertext) -> bytes:
    """The first step of an open: the Diffie-Hellman output of the private
    key and the ciphertext's encapsulated key (section 4.1, Decap's DH), the
    one step that runs without the GIL. Raises HpkeError for another config
    id, a malformed or a low-order encapsulated key. Safe to call from
    several threads at once (nothing shared but the keypair's cached public
    key)."""
    if ciphertext.config_id != keypair.config.config_id:
        raise HpkeError(f"unknown HPKE config id {ciphertext.config_id}")
    return decapsulate_enc(keypair, ciphertext.enc)


def decapsulate_enc(keypair: HpkeKeypair, enc: bytes) -> bytes:
    """`decapsulate` of an encapsulated key alone, for a caller that chose
    `keypair` by the ciphertext's config id itself."""
    # libsodium reads 32 bytes from the pointer it is given whatever the
    # object's length (PyNaCl checks none): the length is checked here, and
    # an immutable copy is what crosses into C while the GIL is released.
    enc = bytes(enc)
    if len(enc) != ENC_SIZE:
        raise HpkeError("malformed HPKE encapsulated key")
    # libsodium refuses a low-order pkE (its output would be all zero), and
    # the output is checked again.
    try:
        dh = crypto_scalarmult(keypair.private_key, enc)
    except SodiumError:
        raise HpkeError("HPKE decryption failed: low-order encapsulated key") from None
    if hmac.compare_digest(dh, _ALL_ZERO):
        raise HpkeError("HPKE decryption failed: low-order encapsulated key")
    return dh


def open_payload(
    keypair: HpkeKeypair,
    enc: bytes,
    payload: bytes | memoryview,
    info: bytes,
    dh: bytes,
    aad: bytes = b"",
) -> bytes:
    """The rest of an open, from the ciphertext's parts and `dh`, the output
    of `decapsulate_enc` for `enc`: the KEM's shared secret, the key
    schedule and AES-128-GCM with `aad` as its associated data (all under
    the GIL). `payload` may be a view into a larger buffer (a stored
    ciphertext), which is not copied. Raises HpkeError if the ciphertext
    does not open with this context."""
    key, nonce = _key_and_nonce(dh, bytes(enc), keypair.recipient_public_key, info)
    try:
        return AESGCM(key).decrypt(nonce, payload, aad or None)
    except (InvalidTag, ValueError) as e:
        raise HpkeError("HPKE decryption failed") from e


def _key_and_nonce(
    dh: bytes, enc: bytes, recipient_public_key: bytes, info: bytes
) -> tuple[bytes, bytes]:
    """The AEAD key and the first message's nonce of a base-mode context:
    the KEM's ExtractAndExpand (section 4.1) and the KeySchedule (section
    5.1), shared by the seal and the open."""
    # ExtractAndExpand(dh, kem_context = enc || pkR).
    eae_prk = _empty_salt_hmac(_EAE_PRK_PREFIX + dh)
    shared_secret = _hmac(
        eae_prk, _SHARED_SECRET_PREFIX + enc + recipient_public_key + _FIRST_BLOCK
    )
    # KeySchedule (section 5.1), base mode: psk and psk_id empty.
    info_hash = _empty_salt_hmac(_INFO_HASH_PREFIX + info)
    secret = _hmac(shared_secret, _SECRET_MESSAGE)
    # The key and the base nonce: two expands under `secret`.
    key = _hmac(secret, _KEY_PREFIX + info_hash + _FIRST_BLOCK)[:_KEY_SIZE]
    # The first message of the context: its nonce is the base nonce itself.
    nonce = _hmac(secret, _NONCE_PREFIX + info_hash + _FIRST_BLOCK)[:_NONCE_SIZE]
    return key, nonce


def input_share_info(
    server_role: int, task_id: bytes, report_id: bytes, time: int, public_share: bytes
) -> bytes:
    """Context of an input share sealed by a client to `server_role`.

    Binds the task, the report metadata and the public share (DAP
    InputShareAad), so a share cannot be moved to another report or task.
    task_id (32 bytes), report_id (16) and time (8) have fixed sizes, so the
    encoding is injective with the public share last.
    """
    return (
        INPUT_SHARE_LABEL
        + bytes([ROLE_CLIENT, server_role])
        + task_id
        + report_id
        + struct.pack(">Q", time)
        + public_share
    )


def agg_share_info(
    server_role: int,
    task_id: bytes,
    start: int,
    duration: int,
    report_count: int,
    *,
    dp_params: bytes,
    agg_param: bytes = b"",
) -> bytes:
    """Context of an aggregate share sealed by an aggregator to the collector.

    `dp_params` (`DpSpec.binding`) names the noise the aggregator added: if its
    DP configuration differs from the collector's (mechanism, mode, ε or ρ,
    sensitivity, ...), the share does not open, rather than yielding estimates
    with wrong intervals. `agg_param` (Poplar1: the level and prefixes the
    share counts, as DAP binds it) is appended when not empty, so that a share
    of one query cannot pass for another's.
    """
    if len(dp_params) >= 1 << 16:
        raise ValueError("DP parameters binding too long")
    info = (
        AGG_SHARE_LABEL
        + bytes([server_role, ROLE_COLLECTOR])
        + task_id
        + struct.pack(">QQQ", start, duration, report_count)
        + struct.pack(">H", len(dp_params))
        + dp_params
    )
    if agg_param:
        info += struct.pack(">I", len(agg_param)) + agg_param
    return info
