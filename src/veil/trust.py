"""Whom a client or collector trusts as the leader and as the helper.

The two aggregators are two organisations, and the privacy of every input
rests on at least one of them being honest. If a client trusted one bundle of
certificates for both, either aggregator could mint a certificate for the
other's name with its own CA key, pose as the other, hand out its own HPKE
key and open both input shares. So each aggregator gets its own trust: its
own root certificates, checked against the pin its task file may carry, and
a certificate trusted for one aggregator is never trusted for the other.

A pin is the SHA-256 fingerprint of the DER encoding of an aggregator's CA
certificate (for a self-signed trial certificate, of that certificate), as
``openssl x509 -noout -fingerprint -sha256`` prints it; colons and case do
not matter.
"""

from __future__ import annotations

import hashlib
import re

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

_PEM_BLOCK = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


class TrustError(ValueError):
    """The certificates given for the aggregators cannot keep them apart."""


def normalise_fingerprint(text: str) -> str:
    """A SHA-256 fingerprint as 64 lowercase hex digits (from any common spelling)."""
    hexdigits = text.strip().lower().removeprefix("sha256:").replace(":", "")
    if not re.fullmatch(r"[0-9a-f]{64}", hexdigits):
        raise TrustError(f"not a SHA-256 fingerprint: {text[:80]!r}")
    return hexdigits


def certificates(pem: bytes, what: str) -> list[x509.Certificate]:
    """Every certificate in a PEM bundle; TrustError if there is none or one is malformed."""
    blocks = _PEM_BLOCK.findall(pem)
    if not blocks:
        raise TrustError(f"{what}: no PEM certificate")
    try:
        return [x509.load_pem_x509_certificate(b) for b in blocks]
    except ValueError as e:
        raise TrustError(f"{what}: malformed certificate: {e}") from None


def fingerprint(cert: x509.Certificate) -> str:
    return hashlib.sha256(cert.public_bytes(Encoding.DER)).hexdigest()


def bundle_fingerprints(pem: bytes, what: str) -> list[str]:
    return [fingerprint(c) for c in certificates(pem, what)]


def check_roots(
    leader_roots: bytes | None,
    helper_roots: bytes | None,
    leader_pin: str | None = None,
    helper_pin: str | None = None,
) -> None:
    """Refuse trust that would let one aggregator pose as the other.

    - A certificate in both the leader's and the helper's roots: refused.
    - An aggregator whose task file pins its CA: its roots must be given and
      consist of the pinned certificate only.
    """
    prints: dict[str, list[str]] = {}
    for role, roots, pin in (
        ("leader", leader_roots, leader_pin),
        ("helper", helper_roots, helper_pin),
    ):
        if roots is not None:
            prints[role] = bundle_fingerprints(roots, f"the {role}'s root certificates")
        if pin is None:
            continue
        want = normalise_fingerprint(pin)
        if roots is None:
            raise TrustError(
                f"the task pins the {role}'s CA (sha256 {want[:16]}...): give that certificate"
                f" ({role}_root_certificates, --{role}-ca)"
            )
        others = [f for f in prints[role] if f != want]
        if others or want not in prints[role]:
            raise TrustError(
                f"the {role}'s root certificates are not the CA its task pins"
                f" (want sha256 {want[:16]}..., got {', '.join(f[:16] for f in prints[role])})"
            )
    shared = set(prints.get("leader", ())) & set(prints.get("helper", ()))
    if shared:
        raise TrustError(
            "the same certificate is trusted for the leader and for the helper"
            f" (sha256 {sorted(shared)[0][:16]}...): either could pose as the other;"
            " give each aggregator its own CA"
        )
