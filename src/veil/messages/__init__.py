"""veil's protocol constants and message values, said once.

Everything a party must agree on byte for byte to interoperate lives here:
the VDAF application context, the sizes of task ids, report ids and HPKE
encapsulated keys, the HPKE suite, the values that travel (an HPKE config,
an HPKE ciphertext, a client report) and the byte encoding of a ciphertext
at rest. The Python client, both aggregators, the stores and the JavaScript
client read these definitions; `veil.messages.wire` converts the values to
and from the generated protobuf classes (protos/veil/protocol/v1), so this
module imports no generated code and the aggregator's logic can use it
freely. It imports nothing else of veil: `veil.hpke` seals and opens with
these values.

Names follow draft-ietf-ppm-dap (section 4, "Message Transport"; section
4.4, "Uploading Reports") where veil has the same concept.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

#: Prefix of the VDAF application context string; the task id follows it.
CTX_PREFIX = b"veil-v1"
#: A task id: 32 bytes (DAP TaskID).
TASK_ID_SIZE = 32
#: A report id: 16 random bytes chosen by the client, also the VDAF nonce
#: (DAP ReportID; Prio3 NONCE_SIZE).
REPORT_ID_SIZE = 16
#: Application labels that start the HPKE `info` of an input share sealed by
#: a client and of an aggregate share sealed by an aggregator (veil.hpke
#: appends the DAP associated data to them; see input_share_info there).
INPUT_SHARE_LABEL = b"veil-v1 input share"
AGG_SHARE_LABEL = b"veil-v1 aggregate share"
#: The one HPKE suite, as in DAP: DHKEM(X25519, HKDF-SHA256) / HKDF-SHA256 /
#: AES-128-GCM (RFC 9180 section 7), by its ids.
KEM_ID_X25519_HKDF_SHA256 = 0x0020
KDF_ID_HKDF_SHA256 = 0x0001
AEAD_ID_AES_128_GCM = 0x0001
SUITE_IDS = (KEM_ID_X25519_HKDF_SHA256, KDF_ID_HKDF_SHA256, AEAD_ID_AES_128_GCM)
#: The HPKE encapsulated key of DHKEM(X25519, HKDF-SHA256) (RFC 9180 section 7.1),
#: and its public key.
ENC_SIZE = 32
PUBLIC_KEY_SIZE = 32


def vdaf_ctx(task_id: bytes) -> bytes:
    """The VDAF application context string of a task (draft-irtf-cfrg-vdaf
    section 4): ``b"veil-v1" || task_id``, passed to every shard, verify and
    unshard call so that shares of one task never verify under another.

    >>> vdaf_ctx(bytes(32)) == b"veil-v1" + bytes(32)
    True
    """
    return CTX_PREFIX + task_id


class MessageError(ValueError):
    """Bytes that are not the encoding of the message they claim to be."""


@dataclass(frozen=True)
class HpkeConfig:
    """A public HPKE key with its one-byte-range identifier (DAP "HpkeConfig")."""

    config_id: int
    public_key: bytes
    kem_id: int = KEM_ID_X25519_HKDF_SHA256
    kdf_id: int = KDF_ID_HKDF_SHA256
    aead_id: int = AEAD_ID_AES_128_GCM

    def __post_init__(self) -> None:
        if not 0 <= self.config_id <= 255:
            raise ValueError(f"HPKE config id {self.config_id} is outside 0..255")
        if len(self.public_key) != PUBLIC_KEY_SIZE:
            raise ValueError(f"HPKE public key must be {PUBLIC_KEY_SIZE} bytes")

    def is_supported(self) -> bool:
        """Whether this config is veil's one suite (a client can seal to it)."""
        return (self.kem_id, self.kdf_id, self.aead_id) == SUITE_IDS


@dataclass(frozen=True)
class Ciphertext:
    """An HPKE-sealed payload (DAP HpkeCiphertext): the id of the recipient's
    HPKE config, the encapsulated key `enc` and the AEAD ciphertext."""

    config_id: int
    enc: bytes
    payload: bytes

    def to_bytes(self) -> bytes:
        """``config_id (1 byte) || enc (ENC_SIZE bytes) || payload``: how the
        stores keep a ciphertext in one column."""
        return bytes([self.config_id]) + self.enc + self.payload

    @classmethod
    def from_bytes(cls, data: bytes) -> Ciphertext:
        """The inverse of `to_bytes`. Raises MessageError on input too short
        to hold a config id and an encapsulated key."""
        if len(data) < 1 + ENC_SIZE:
            raise MessageError(f"a stored ciphertext has at least {1 + ENC_SIZE} bytes")
        return cls(data[0], data[1 : 1 + ENC_SIZE], data[1 + ENC_SIZE :])


@dataclass(frozen=True)
class Report:
    """A client report (DAP Report, section 4.4.2): metadata (report id and
    time), the VDAF public share, and each aggregator's input share sealed to
    that aggregator. The client builds it, the leader stores it as it came."""

    report_id: bytes
    time: int
    public_share: bytes
    leader_ct: Ciphertext
    helper_ct: Ciphertext
    # The invitation token for a task with invitations (veil.invite.token),
    # bound to the report's content: checked by the leader at upload, stored
    # with the report and sent to the helper, which checks it on its own.
    # Empty for other tasks.
    token: bytes = b""

    @property
    def leader_share_digest(self) -> bytes:
        """SHA-256 of the leader's sealed share as stored (`to_bytes`), which
        a token's challenge commits to."""
        return hashlib.sha256(self.leader_ct.to_bytes()).digest()


# A stored ciphertext's first byte, for each config id (to_bytes, by columns).
_CONFIG_ID_BYTE = tuple(bytes([i]) for i in range(256))


def stored_ciphertexts(
    config_ids: Sequence[int], encs: Sequence[bytes], payloads: Sequence[bytes]
) -> list[bytes]:
    """`Ciphertext.to_bytes` of each (config id, enc, payload), by columns.
    Raises IndexError on a config id outside 0..255."""
    byte = _CONFIG_ID_BYTE
    return [byte[c] + e + p for c, e, p in zip(config_ids, encs, payloads, strict=True)]


@dataclass(frozen=True)
class ReportBatch:
    """The reports of one upload, by columns: the i-th report is the i-th
    entry of every list (`report(i)`). What the leader checks and stores an
    upload as: a column is checked in one pass and written as it came, with
    no object per report (a Histogram(100,10) upload of 10,000 reports made
    30,000 of them to be read once)."""

    report_ids: Sequence[bytes]
    times: Sequence[int]
    public_shares: Sequence[bytes]
    leader_config_ids: Sequence[int]
    leader_encs: Sequence[bytes]
    leader_payloads: Sequence[bytes]
    helper_config_ids: Sequence[int]
    helper_encs: Sequence[bytes]
    helper_payloads: Sequence[bytes]
    tokens: Sequence[bytes]

    def __len__(self) -> int:
        return len(self.report_ids)

    def report(self, i: int) -> Report:
        """The i-th report as a value."""
        return Report(
            self.report_ids[i],
            self.times[i],
            self.public_shares[i],
            Ciphertext(self.leader_config_ids[i], self.leader_encs[i], self.leader_payloads[i]),
            Ciphertext(self.helper_config_ids[i], self.helper_encs[i], self.helper_payloads[i]),
            self.tokens[i],
        )

    @classmethod
    def of(cls, reports: Sequence[Report]) -> ReportBatch:
        """The batch of `reports`, in their order."""
        return cls(
            [r.report_id for r in reports],
            [r.time for r in reports],
            [r.public_share for r in reports],
            [r.leader_ct.config_id for r in reports],
            [r.leader_ct.enc for r in reports],
            [r.leader_ct.payload for r in reports],
            [r.helper_ct.config_id for r in reports],
            [r.helper_ct.enc for r in reports],
            [r.helper_ct.payload for r in reports],
            [r.token for r in reports],
        )

    def leader_cts(self) -> list[bytes]:
        """Each leader ciphertext as stored (`Ciphertext.to_bytes`)."""
        return stored_ciphertexts(self.leader_config_ids, self.leader_encs, self.leader_payloads)

    def helper_cts(self) -> list[bytes]:
        """Each helper ciphertext as stored (`Ciphertext.to_bytes`)."""
        return stored_ciphertexts(self.helper_config_ids, self.helper_encs, self.helper_payloads)


__all__ = [
    "AEAD_ID_AES_128_GCM",
    "AGG_SHARE_LABEL",
    "CTX_PREFIX",
    "ENC_SIZE",
    "INPUT_SHARE_LABEL",
    "KDF_ID_HKDF_SHA256",
    "KEM_ID_X25519_HKDF_SHA256",
    "PUBLIC_KEY_SIZE",
    "REPORT_ID_SIZE",
    "SUITE_IDS",
    "TASK_ID_SIZE",
    "Ciphertext",
    "HpkeConfig",
    "MessageError",
    "Report",
    "ReportBatch",
    "stored_ciphertexts",
    "vdaf_ctx",
]
