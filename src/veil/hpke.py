"""HPKE sealing of input and aggregate shares (RFC 9180, base mode).

One suite throughout, as in DAP: DHKEM(X25519, HKDF-SHA256) / HKDF-SHA256 /
AES-128-GCM. The primitives come from `cryptography.hazmat.primitives.hpke`.

Its single-shot API takes `info` but no AEAD associated data, so the DAP
associated data (task id, report metadata, public share; or the batch of an
aggregate share) is appended to the application label and carried in `info`.
`info` enters the HPKE key schedule, so a ciphertext opened with any other
context fails exactly as with a wrong `aad`. The label is fixed per message
kind, so label || context is an unambiguous encoding.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cached_property, lru_cache

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.hpke import AEAD, KDF, KEM, Suite

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
    "generate_keypair",
    "input_share_info",
    "open_",
    "seal",
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
    def private_key_object(self) -> X25519PrivateKey:
        # Loading a raw X25519 key derives its public half, about 20 µs: a
        # third of an open, so an aggregator loads each key once.
        return X25519PrivateKey.from_private_bytes(self.private_key)


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


def open_(keypair: HpkeKeypair, ciphertext: Ciphertext, info: bytes) -> bytes:
    """Open `ciphertext`; raises HpkeError on any failure."""
    if ciphertext.config_id != keypair.config.config_id:
        raise HpkeError(f"unknown HPKE config id {ciphertext.config_id}")
    if len(ciphertext.enc) != ENC_SIZE:
        raise HpkeError("malformed HPKE encapsulated key")
    try:
        return _SUITE.decrypt(
            ciphertext.enc + ciphertext.payload, keypair.private_key_object, info=info
        )
    except (InvalidTag, ValueError) as e:
        raise HpkeError("HPKE decryption failed") from e


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
