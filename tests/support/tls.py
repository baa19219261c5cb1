"""Certificates for the TLS tests: a CA per organisation and server
certificates it signs (for localhost and 127.0.0.1), valid for an hour."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def certificate(
    cn: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    signer: ec.EllipticCurvePrivateKey,
    ca: bool,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name(cn))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(signer, hashes.SHA256())


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def new_ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA certificate and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    return key, certificate(cn, key, name(cn), key, ca=True)


def write_ca(path: Path, cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A new CA, its certificate written to `path` (PEM)."""
    key, cert = new_ca(cn)
    path.write_bytes(pem(cert))
    return key, cert


def write_server_cert(
    cert_path: Path, key_path: Path, cn: str, ca_key: ec.EllipticCurvePrivateKey, ca_name: x509.Name
) -> None:
    """A server certificate signed by the CA, and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert_path.write_bytes(pem(certificate(cn, key, ca_name, ca_key, ca=False)))
    key_path.write_bytes(pem_key(key))
